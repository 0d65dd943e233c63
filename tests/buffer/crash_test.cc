// Crash safety: a child process logs records in a loop and is killed with SIGKILL at random
// moments, 24 times. After each kill the buffer passes verification (library and CLI), opens
// as primary, and holds every record the child reported durable, byte for byte.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "buffer/buffer_tools.h"
#include "buffer/keys.h"
#include "buffer/replay_buffer.h"
#include "tests/buffer/crash_records.h"

namespace specloop {
namespace {

using testing::TempDir;

pid_t Spawn(const std::vector<std::string>& argv) {
  const pid_t pid = fork();
  if (pid == 0) {
    const int devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0) dup2(devnull, STDOUT_FILENO);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

int RunToExit(const std::vector<std::string>& argv) {
  const pid_t pid = Spawn(argv);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Reads "first F" and the last complete "durable D" line. False if "first" is missing.
bool ReadWatermark(const std::string& path, uint64_t* first, int64_t* durable) {
  std::ifstream in(path);
  std::string word;
  uint64_t v;
  bool have_first = false;
  *durable = -1;
  std::string line;
  while (std::getline(in, line)) {
    if (in.eof()) break;  // a line without its newline may be torn
    std::istringstream ls(line);
    if (!(ls >> word >> v)) continue;
    if (word == "first") {
      *first = v;
      have_first = true;
    } else if (word == "durable") {
      *durable = static_cast<int64_t>(v);
    }
  }
  return have_first;
}

TEST(CrashSafety, SigkillAtRandomMomentsLosesNothingDurable) {
  TempDir tmp;
  const std::string dir = tmp.Sub("buf"), marks = tmp.Sub("marks");
  Rng rng(2024);
  uint64_t expected_next = 0;  // seq the next child must start at
  int kills_with_progress = 0, waited_rounds = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int round = 0; round < 24; round++) {
    // A child killed before it opens the marks file must not leave the last round's marks.
    std::remove(marks.c_str());
    const pid_t pid = Spawn({CRASH_WRITER, dir, marks});
    ASSERT_GT(pid, 0);
    // Three rounds in four kill a child that is logging: the random moment counts from its
    // "first" line, so a slow start (CI's two loaded cores) cannot make them kills during
    // start-up. The fourth counts from the spawn: it may land in the open and recovery.
    const bool logging = round % 4 != 3;
    if (logging) {
      waited_rounds++;
      uint64_t f = 0;
      int64_t d = -1;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (!ReadWatermark(marks, &f, &d) && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    }
    const int delay_ms = 20 + static_cast<int>(rng.Next() % 200);
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << "child exited by itself, status " << status;

    uint64_t first = 0;
    int64_t durable = -1;
    if (!ReadWatermark(marks, &first, &durable)) continue;  // killed before it began
    // Each run continues the previous numbering (nothing durable was forgotten).
    EXPECT_EQ(first, expected_next) << "round " << round;

    VerifyReport report;
    Status vs = VerifyBuffer(dir, &report);
    ASSERT_TRUE(vs.ok()) << "round " << round << ": " << vs.ToString();
    if (round % 4 == 0) {  // the CLI too (its output goes to /dev/null)
      ASSERT_EQ(RunToExit({BUFFER_TOOL, "buffer", "verify", dir}), 0) << "round " << round;
    }

    std::unique_ptr<ReplayBuffer> buf;
    Status s = ReplayBuffer::Open(BufferOptions(), dir, &buf);
    ASSERT_TRUE(s.ok()) << "round " << round << ": " << s.ToString();
    if (durable >= static_cast<int64_t>(first)) {
      kills_with_progress++;
      for (uint64_t seq = first; seq <= static_cast<uint64_t>(durable); seq++) {
        Record want = testing::CrashRecord(seq);
        Record got;
        Status gs = buf->Get(RecordKey(want.time_us, want.worker_id, seq), &got);
        ASSERT_TRUE(gs.ok()) << "round " << round << " seq " << seq << " of durable " << durable
                             << ": " << gs.ToString();
        ASSERT_EQ(got, want) << "seq " << seq;
      }
      EXPECT_GE(buf->next_seq(), static_cast<uint64_t>(durable) + 1);
    }
    expected_next = buf->next_seq();
    buf.reset();
    ASSERT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(90));
  }
  EXPECT_GE(kills_with_progress, waited_rounds - 2);  // 18 rounds killed while logging
  RecordProperty("records", std::to_string(expected_next));
}

}  // namespace
}  // namespace specloop
