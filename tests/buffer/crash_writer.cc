// Test helper for crash_test.cc: logs deterministic records into a buffer forever and appends
// "durable <seq>" lines to a file as the logger reports them (after the WAL write).
//   crash_writer DIR WATERMARK_FILE
// Prints "first <seq>\n" to the watermark file before logging.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "buffer/replay_logger.h"
#include "tests/buffer/crash_records.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: crash_writer DIR WATERMARK_FILE\n");
    return 2;
  }
  const int fd = open(argv[2], O_WRONLY | O_CREAT | O_APPEND | O_TRUNC, 0644);
  if (fd < 0) return 3;
  auto say = [fd](const std::string& line) {
    if (write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) _exit(4);
  };
  specloop::LoggerOptions lo;
  lo.max_batch_records = 16;
  lo.on_durable = [&say](uint64_t seq) { say("durable " + std::to_string(seq) + "\n"); };
  std::unique_ptr<specloop::ReplayLogger> logger;
  specloop::Status s = specloop::ReplayLogger::Open(specloop::BufferOptions(), lo, argv[1], &logger);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  const uint64_t first = logger->first_seq();
  say("first " + std::to_string(first) + "\n");
  for (uint64_t i = first;; i++) {
    specloop::Record r = specloop::testing::CrashRecord(i);
    uint64_t seq = 0;
    while (!logger->Log(&r, &seq)) usleep(100);  // retry drops so seqs stay == i
    if (seq != i) return 5;
  }
}
