// `specloop up` end to end: both children start, the trainer survives kill -9 (restarted,
// serving never interrupted), SIGINT/SIGTERM stop everything, bad configuration is not
// restarted forever.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>

#include "tests/e2e/e2e_util.h"

namespace specloop {
namespace e2e {
namespace {

std::string Completion(const std::string& prompt_json, const std::string& domain) {
  return "{\"prompt\":" + prompt_json + ",\"max_tokens\":8,\"temperature\":0,\"domain\":\"" +
         domain + "\"}";
}

TEST(UpTest, TrainerKill9IsRestartedWhileServingContinues) {
  TempDir tmp("specloop-up");
  const UpPorts ports;
  Child up(UpCommand(tmp.Sub("data"), ports));
  size_t at = 0;
  const std::string serve_pid = up.Capture("started serve \\(pid (\\d+)\\)", 30, &at);
  ASSERT_FALSE(serve_pid.empty()) << up.Output();
  ASSERT_FALSE(up.WaitForLine("serve is ready", 60, &at).empty()) << up.Output();
  const std::string train_pid = up.Capture("started train \\(pid (\\d+)\\)", 30, &at);
  ASSERT_FALSE(train_pid.empty()) << up.Output();
  ASSERT_TRUE(WaitHealthy(ports.trainer_metrics, "/health", 60)) << up.Output();
  ASSERT_EQ(HttpGet(ports.serve, "/health"), 200);

  // One data dir holds everything.
  EXPECT_TRUE(std::filesystem::is_directory(tmp.Sub("data/buffer")));
  EXPECT_TRUE(std::filesystem::is_directory(tmp.Sub("data/checkpoints")));

  // A client keeps asking for completions the whole time.
  const std::vector<std::string> prompts = PromptsJson("prose", 8);
  ASSERT_FALSE(prompts.empty());
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, failed{0};
  std::string first_failure;
  std::thread client([&] {
    for (size_t i = 0; !stop.load(); ++i) {
      std::string body;
      const int st =
          HttpPost(ports.serve, "/v1/completions", Completion(prompts[i % prompts.size()], "prose"),
                   &body);
      if (st == 200) {
        ok.fetch_add(1);
      } else if (failed.fetch_add(1) == 0) {
        first_failure = std::to_string(st) + " " + body;
      }
    }
  });
  auto wait_ok = [&](int n) {
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (ok.load() < n && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return ok.load() >= n;
  };
  EXPECT_TRUE(wait_ok(2));

  const pid_t old_train = std::stoi(train_pid);
  ASSERT_EQ(kill(old_train, SIGKILL), 0);
  ASSERT_FALSE(up.WaitForLine("train killed by signal 9.*restarting in", 20, &at).empty())
      << up.Output();
  const std::string new_train = up.Capture("started train \\(pid (\\d+)\\)", 30, &at);
  ASSERT_FALSE(new_train.empty()) << up.Output();
  EXPECT_NE(new_train, train_pid);
  EXPECT_TRUE(ProcessGone(old_train));
  // The new trainer is up again on the same endpoints, and the server kept answering.
  EXPECT_TRUE(WaitHealthy(ports.trainer_metrics, "/health", 60)) << up.Output();
  const int before = ok.load();
  EXPECT_TRUE(wait_ok(before + 2));
  stop.store(true);
  client.join();
  EXPECT_EQ(failed.load(), 0) << first_failure;
  EXPECT_EQ(up.Output().find("serve killed"), std::string::npos);
  EXPECT_EQ(up.Output().find("serve exited"), std::string::npos);
  EXPECT_FALSE(ProcessGone(std::stoi(serve_pid)));

  // SIGINT stops both children cleanly.
  up.Signal(SIGINT);
  const int st = up.Wait(60);
  ASSERT_NE(st, -1) << "specloop up did not stop\n" << up.Output();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << up.Output();
  EXPECT_FALSE(up.WaitForLine("train exited with status 0", 5).empty()) << up.Output();
  EXPECT_FALSE(up.WaitForLine("serve exited with status 0", 5).empty()) << up.Output();
  EXPECT_FALSE(up.WaitForLine("specloop up: stopped", 5).empty()) << up.Output();
  EXPECT_TRUE(ProcessGone(std::stoi(serve_pid)));
  EXPECT_TRUE(ProcessGone(std::stoi(new_train)));
}

TEST(UpTest, SigtermStopsBeforeTrainerStarts) {
  TempDir tmp("specloop-up");
  const UpPorts ports;
  Child up(UpCommand(tmp.Sub("data"), ports));
  const std::string serve_pid = up.Capture("started serve \\(pid (\\d+)\\)", 30);
  ASSERT_FALSE(serve_pid.empty()) << up.Output();
  up.Signal(SIGTERM);
  const int st = up.Wait(60);
  ASSERT_NE(st, -1) << up.Output();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << up.Output();
  EXPECT_TRUE(ProcessGone(std::stoi(serve_pid)));
  EXPECT_EQ(up.Output().find("started train"), std::string::npos);
}

TEST(UpTest, BadServeArgumentsAreNotRestarted) {
  TempDir tmp("specloop-up");
  const UpPorts ports;
  std::vector<std::string> cmd = UpCommand(tmp.Sub("data"), ports);
  cmd.push_back("--serve-arg=--k=bogus");  // serve exits 2: a configuration error
  Child up(cmd);
  const int st = up.Wait(60);
  ASSERT_NE(st, -1) << up.Output();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1) << up.Output();
  EXPECT_NE(up.Output().find("not restarting"), std::string::npos) << up.Output();
  EXPECT_EQ(up.Output().find("restarting in"), std::string::npos) << up.Output();
  EXPECT_EQ(up.Output().find("started train"), std::string::npos) << up.Output();
}

TEST(UpTest, ZeroWorkersIsAConfigurationError) {
  TempDir tmp("specloop-up");
  const UpPorts ports;
  std::vector<std::string> cmd = UpCommand(tmp.Sub("data"), ports);
  cmd.insert(cmd.end(), {"--workers", "0"});
  Child up(cmd);
  const int st = up.Wait(30);
  ASSERT_NE(st, -1) << up.Output();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 2) << up.Output();
  EXPECT_NE(up.Output().find("--workers must be at least 1"), std::string::npos) << up.Output();
  EXPECT_EQ(up.Output().find("started serve"), std::string::npos) << up.Output();
}

}  // namespace
}  // namespace e2e
}  // namespace specloop
