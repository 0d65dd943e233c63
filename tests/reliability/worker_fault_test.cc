// Faults on the serving worker's side, with a real `specloop serve` logging into a buffer:
//   - the worker is killed with SIGKILL while clients keep it logging: the buffer verifies,
//     holds every record /metrics reported written (durable: in the WAL), and a new worker
//     reopens it and logs on;
//   - the buffer's disk fills up (RLIMIT_FSIZE on the worker, SIGXFSZ ignored, so writes fail
//     with EFBIG as on a full disk; works unprivileged and in containers): logging degrades to
//     counted drops, every request is still answered, and what was written stays readable.
#include <gtest/gtest.h>

#include <regex>

#include "tests/reliability/reliability_util.h"

namespace specloop {
namespace reliability {
namespace {

const char kWritten[] = "specloop_buffer_records_written_total";

// `specloop buffer verify DIR`: true when it exits 0 and says OK.
bool VerifyBuffer(const std::string& dir, std::string* out) {
  const int rc = RunCommand(std::string(SPECLOOP_BINARY) + " buffer verify " + ShellQuote(dir) +
                                " 2>&1",
                            out);
  return rc == 0 && out->find("OK") != std::string::npos;
}

// Records in the buffer, from `specloop buffer stats DIR` (-1 when it fails).
long BufferRecords(const std::string& dir) {
  std::string out;
  if (RunCommand(std::string(SPECLOOP_BINARY) + " buffer stats " + ShellQuote(dir), &out) != 0) {
    return -1;
  }
  std::smatch m;
  static const std::regex r("records\\s+(\\d+)");
  return std::regex_search(out, m, r) ? std::stol(m[1].str()) : -1;
}

TEST(WorkerFault, KilledWhileLoggingLosesNothingReportedDurable) {
  TempDir tmp("specloop-worker-kill");
  const std::string buffer = tmp.Sub("buffer");
  long durable = 0;
  {
    ServeProcess serve({"--buffer", buffer, "--k", "2"});
    ASSERT_TRUE(serve.Start()) << serve.Output();
    ClientLoop clients(serve.port(), 3);
    ASSERT_TRUE(WaitFor([&] { return ScrapeMetric(serve.port(), kWritten) >= 20; }, 60))
        << serve.Output();
    // Clients are mid-request and the logger mid-write when the worker dies.
    durable = static_cast<long>(ScrapeMetric(serve.port(), kWritten));
    serve.child().Signal(SIGKILL);
    ASSERT_NE(serve.child().Wait(10), -1);
    clients.Stop();  // requests after the kill fail: the worker is gone
  }
  std::string out;
  EXPECT_TRUE(VerifyBuffer(buffer, &out)) << out;
  const long after_kill = BufferRecords(buffer);
  EXPECT_GE(after_kill, durable);

  // A new worker reopens the buffer and logs on; a clean stop leaves it verified.
  ServeProcess serve({"--buffer", buffer, "--k", "2"});
  ASSERT_TRUE(serve.Start()) << serve.Output();
  ClientLoop clients(serve.port(), 2);
  ASSERT_TRUE(WaitFor([&] { return ScrapeMetric(serve.port(), kWritten) >= 5; }, 60))
      << serve.Output();
  clients.Stop();
  EXPECT_EQ(clients.failed(), 0) << clients.first_failure();
  const long written = static_cast<long>(ScrapeMetric(serve.port(), kWritten));
  serve.child().Signal(SIGTERM);
  const int st = serve.child().Wait(30);
  EXPECT_TRUE(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0) << serve.Output();
  EXPECT_TRUE(VerifyBuffer(buffer, &out)) << out;
  EXPECT_GE(BufferRecords(buffer), after_kill + written);
}

TEST(WorkerFault, FullDiskDegradesLoggingToCountedDrops) {
  TempDir tmp("specloop-disk-full");
  const std::string buffer = tmp.Sub("buffer");
  // Files of the worker may not grow past 512 KiB (dash counts 512-byte blocks); SIGXFSZ is
  // ignored, so a write past it fails with EFBIG, like ENOSPC on a full disk.
  ServeProcess serve({"--buffer", buffer, "--k", "2"},
                     {"sh", "-c", "ulimit -f 1024 && trap '' XFSZ && exec \"$@\"", "sh"});
  ASSERT_TRUE(serve.Start()) << serve.Output();
  const int port = serve.port();
  ClientLoop clients(port, 3, 24);
  const std::string failed = "specloop_buffer_records_dropped_total{reason=\"write_error\"}";
  const std::string closed = "specloop_buffer_records_dropped_total{reason=\"closed\"}";
  auto dropped = [&] { return ScrapeMetric(port, failed) + ScrapeMetric(port, closed); };
  ASSERT_TRUE(WaitFor([&] { return dropped() >= 1; }, 90)) << serve.Output();
  // Serving goes on, and the drops keep being counted.
  const double drops = dropped();
  ASSERT_TRUE(clients.WaitMore(6, 60));
  EXPECT_GT(dropped(), drops);
  clients.Stop();
  EXPECT_EQ(clients.failed(), 0) << clients.first_failure();
  EXPECT_EQ(HttpGet(port, "/health"), 200);
  const long written = static_cast<long>(ScrapeMetric(port, kWritten));
  EXPECT_GT(written, 0);
  serve.child().Signal(SIGTERM);
  EXPECT_NE(serve.child().Wait(30), -1) << serve.Output();
  // What was written before the disk filled is intact and complete.
  std::string out;
  EXPECT_TRUE(VerifyBuffer(buffer, &out)) << out;
  EXPECT_GE(BufferRecords(buffer), written);
}

}  // namespace
}  // namespace reliability
}  // namespace specloop
