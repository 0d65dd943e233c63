// The trainer killed with SIGKILL under `specloop up`, while clients keep the worker busy:
//   - during a checkpoint transfer: the worker's fetch fails (counted, retried), the trainer's
//     endpoints go away and come back with the restarted trainer, the worker reconnects by
//     itself and installs the draft;
//   - during training: the restarted trainer resumes from `latest`.
// In both, no request fails and the worker is never restarted.
#include <gtest/gtest.h>

#include "tests/reliability/reliability_util.h"

namespace specloop {
namespace reliability {
namespace {

// Stops `up` with SIGINT and checks the clean stop.
void StopUp(Child* up) {
  up->Signal(SIGINT);
  const int st = up->Wait(60);
  ASSERT_NE(st, -1) << "specloop up did not stop\n" << up->Output();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << up->Output();
  EXPECT_EQ(up->Output().find("serve killed"), std::string::npos);
  EXPECT_EQ(up->Output().find("serve exited with status 1"), std::string::npos);
}

TEST(TrainerFault, KilledDuringCheckpointTransferWorkerReconnectsAndSwaps) {
  TempDir tmp("specloop-trainer-transfer");
  UpSetup u;
  u.data = tmp.Sub("data");
  ASSERT_TRUE(u.Seed());
  // Small chunks stretch the 5.5 MB transfer over thousands of requests, so the kill lands
  // inside it.
  Child up(u.Command({"--serve-arg=--draft-chunk-bytes=512"}));
  size_t at = 0;
  ASSERT_FALSE(up.WaitForLine("serve is ready", 60, &at).empty()) << up.Output();
  ClientLoop clients(u.port, 2);
  const std::string train_pid = up.Capture("started train \\(pid (\\d+)\\)", 30, &at);
  ASSERT_FALSE(train_pid.empty()) << up.Output();

  // The worker starts fetching v1 from the new trainer: kill the trainer right then.
  ASSERT_FALSE(up.WaitForLine("fetching draft v1 ", 60, &at).empty()) << up.Output();
  ASSERT_EQ(kill(std::stoi(train_pid), SIGKILL), 0);
  EXPECT_EQ(DraftVersion(u.port), 0);  // the kill landed before the draft was installed
  ASSERT_FALSE(up.WaitForLine("train killed by signal 9", 20, &at).empty()) << up.Output();

  // The restarted trainer resumes from v1 on the same endpoints; the worker reconnects and
  // installs v1. Either the cut request timed out (counted as a failed fetch, then fetched
  // again on the new trainer's announcement), or the worker's queued request reached the new
  // trainer and the transfer went on; the bundle's sha256 is checked either way.
  ASSERT_FALSE(up.Capture("started train \\(pid (\\d+)\\)", 30, &at).empty()) << up.Output();
  EXPECT_FALSE(up.WaitForLine("resuming from .*v000001", 60, &at).empty()) << up.Output();
  EXPECT_TRUE(WaitFor([&] { return DraftVersion(u.port) == 1; }, 60)) << up.Output();
  std::cerr << "failed fetches: "
            << ScrapeMetric(u.port, "specloop_draft_swap_failures_total{reason=\"fetch\"}")
            << "\n";
  std::vector<std::string> staged;
  for (const auto& e : std::filesystem::directory_iterator(u.data + "/drafts")) {
    staged.push_back(e.path().filename());
  }
  EXPECT_EQ(staged, std::vector<std::string>{"v000001"});  // no half-written leftovers
  EXPECT_TRUE(clients.WaitMore(2, 60));
  clients.Stop();
  EXPECT_EQ(clients.failed(), 0) << clients.first_failure();
  StopUp(&up);
}

TEST(TrainerFault, KilledDuringTrainingResumesFromLatest) {
  TempDir tmp("specloop-trainer-training");
  UpSetup u;
  u.data = tmp.Sub("data");
  ASSERT_TRUE(u.Seed());
  // A loose gate and frequent evaluations, so the trainer publishes new versions within
  // seconds (the test is about resuming, not about draft quality).
  Child up(u.Command({"--train-arg=--batch-records=2", "--train-arg=--eval-every=2",
                      "--train-arg=--min-gain=-1", "--train-arg=--max-domain-regression=1",
                      "--train-arg=--heldout-fraction=0.5"}));
  size_t at = 0;
  ASSERT_FALSE(up.WaitForLine("serve is ready", 60, &at).empty()) << up.Output();
  ClientLoop clients(u.port, 2);
  const std::string train_pid = up.Capture("started train \\(pid (\\d+)\\)", 30, &at);
  ASSERT_FALSE(train_pid.empty()) << up.Output();

  // Kill it after it has published a version of its own and taken more steps since.
  ASSERT_FALSE(up.WaitForLine("published v000002", 90, &at).empty()) << up.Output();
  const std::string steps = "specloop_train_steps_total";
  const double steps_then = ScrapeMetric(u.trainer_metrics, steps);
  ASSERT_TRUE(WaitFor([&] { return ScrapeMetric(u.trainer_metrics, steps) >= steps_then + 2; },
                      60))
      << up.Output();
  ASSERT_EQ(kill(std::stoi(train_pid), SIGKILL), 0);
  ASSERT_FALSE(up.WaitForLine("train killed by signal 9", 20, &at).empty()) << up.Output();
  // Read once the trainer is dead: it publishes every few steps, so a `latest` read before
  // the kill may already be one version behind.
  std::string latest;
  ASSERT_TRUE(ReadFileToString(u.data + "/checkpoints/latest", &latest).ok());
  while (!latest.empty() && latest.back() == '\n') latest.pop_back();
  uint64_t latest_version = 0;
  ASSERT_TRUE(ParseVersionDirName(latest, &latest_version)) << latest;

  // The new trainer resumes from `latest`, the worker follows it, and the next version the
  // trainer publishes continues the numbering.
  ASSERT_FALSE(up.Capture("started train \\(pid (\\d+)\\)", 30, &at).empty()) << up.Output();
  EXPECT_FALSE(up.WaitForLine("resuming from .*" + latest, 60, &at).empty()) << up.Output();
  EXPECT_TRUE(WaitFor([&] { return DraftVersion(u.port) >= static_cast<int>(latest_version); },
                      60))
      << up.Output();
  const std::string next = up.Capture("published (v\\d+)", 90, &at);
  uint64_t next_version = 0;
  ASSERT_TRUE(ParseVersionDirName(next, &next_version)) << up.Output();
  EXPECT_EQ(next_version, latest_version + 1);
  EXPECT_TRUE(clients.WaitMore(2, 60));
  clients.Stop();
  EXPECT_EQ(clients.failed(), 0) << clients.first_failure();
  StopUp(&up);
}

}  // namespace
}  // namespace reliability
}  // namespace specloop
