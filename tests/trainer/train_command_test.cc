// `specloop train` as users run it, on a small real buffer (target-6m verifying draft-prose-1m
// on python, c and legal prompts, every other prompt decoded greedily, the rest sampled at
// temperature 1): --offline prints its JSON report (held-out alpha per domain and per sampling
// regime) and writes a checkpoint;
// the online loop catches up, trains, passes the gate and announces the checkpoint over
// ZeroMQ, a worker-side fetcher downloads and loads it, and SIGTERM stops the trainer cleanly.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <zmq.hpp>

#include "buffer/replay_logger.h"
#include "buffer/replay_reader.h"
#include "common/channel/draft_channel.h"
#include "common/model/eagle3_config.h"
#include "common/model/eagle3_head.h"
#include "tests/trainer/test_util.h"
#include "trainer/alpha_estimate.h"
#include "trainer/synthetic_traffic.h"
#include "trainer/training_examples.h"

namespace specloop {
namespace trainer {
namespace {

using testing::SharedDir;
using testing::TempDir;

class TrainCommandTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("specloop-train-cmd");
    const Status s = testing::MakeTrafficBuffer(dir_->Sub("buffer"), /*greedy_every=*/2);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  static void TearDownTestSuite() { delete dir_; }

  static std::vector<std::string> TrainArgs(const std::string& checkpoints) {
    return {SPECLOOP_BINARY, "train", "--draft", SharedDir() + "/models/draft-prose-1m",
            "--buffer", dir_->Sub("buffer"), "--checkpoints", checkpoints, "--lr", "1e-3",
            "--metrics-port", "0", "--threads", "1"};
  }

  // Runs `specloop train` with TrainArgs(ckpt) and then `tail` (more flags, redirections);
  // returns its exit status, with its stdout in *out and the last JSON line in *last.
  static int RunTrain(const std::string& ckpt, const std::string& tail, std::string* out,
                      std::string* last) {
    std::string cmd;
    for (const auto& a : TrainArgs(ckpt)) cmd += "'" + a + "' ";
    FILE* p = popen((cmd + tail).c_str(), "r");
    if (p == nullptr) return -1;
    char buf[4096];
    while (fgets(buf, sizeof(buf), p)) {
      *out += buf;
      if (buf[0] == '{') *last = buf;
    }
    return WEXITSTATUS(pclose(p));
  }

  static TempDir* dir_;
};
TempDir* TrainCommandTest::dir_ = nullptr;

// A child process whose stderr (and stdout) the test reads; killed if still running at the end.
class Child {
 public:
  explicit Child(const std::vector<std::string>& args) {
    int fds[2];
    if (pipe(fds) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], 1);
      dup2(fds[1], 2);
      close(fds[0]);
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(fds[1]);
    out_ = fdopen(fds[0], "r");
  }
  ~Child() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_) fclose(out_);
  }
  // Reads lines until one matches `re` (the whole line kept in *line); false at EOF.
  bool ReadUntil(const std::regex& re, std::string* line) {
    char buf[4096];
    while (out_ && fgets(buf, sizeof(buf), out_)) {
      *line = buf;
      log_ += *line;
      if (std::regex_search(*line, re)) return true;
    }
    return false;
  }
  // Sends `sig` and waits for the exit status.
  int Stop(int sig) {
    kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    reaped_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  const std::string& log() const { return log_; }

 private:
  pid_t pid_ = -1;
  FILE* out_ = nullptr;
  bool reaped_ = false;
  std::string log_;
};

TEST_F(TrainCommandTest, OfflinePrintsItsReportAndWritesACheckpoint) {
  TempDir ckpt("specloop-train-offline");
  std::string out, last;
  const int status = RunTrain(ckpt.path(), "--offline --epochs 4 2>/dev/null", &out, &last);
  ASSERT_EQ(status, 0) << out;  // 0: written (3 would be: refused by the gate)
  const nlohmann::json r = nlohmann::json::parse(last);
  EXPECT_EQ(r["version"], 1) << last;
  for (const char* d : {"python", "c", "legal"}) {
    ASSERT_TRUE(r["alpha_before"].contains(d) && r["alpha_after"].contains(d)) << last;
  }
  EXPECT_GT(r["overall_after"].get<double>(), r["overall_before"].get<double>()) << last;
  EXPECT_TRUE(std::filesystem::exists(ckpt.Sub("v000001/model.safetensors")));
  std::string meta_text;
  ASSERT_TRUE(ReadFileToString(ckpt.Sub("v000001/meta.json"), &meta_text).ok());
  const nlohmann::json meta = nlohmann::json::parse(meta_text);
  for (const char* key : {"version", "parent", "sha256", "objective", "steps", "samples",
                          "alpha_before", "alpha_after", "created"}) {
    EXPECT_TRUE(meta.contains(key)) << key << " missing from " << meta_text;
  }
  std::string sha;
  ASSERT_TRUE(Sha256File(ckpt.Sub("v000001/model.safetensors"), &sha).ok());
  EXPECT_EQ(meta["sha256"], sha);
  EXPECT_EQ(meta["alpha_after"], r["alpha_after"]);
}

// The report splits held-out alpha by sampling regime: greedy records scored by argmax
// agreement, sampled ones by their processed overlap. Each regime's numbers are those of an
// independent estimate of the initial draft (before) and of the checkpoint (after) on the
// held-out records (the default fraction, 0.1), and the stderr summary has a line per regime.
TEST_F(TrainCommandTest, OfflineReportsHeldOutAlphaPerSamplingRegime) {
  TempDir ckpt("specloop-train-regimes");
  const std::string err_path = ckpt.Sub("stderr.txt");
  std::string out, last;
  ASSERT_EQ(RunTrain(ckpt.path(), "--offline --epochs 1 --force 2>'" + err_path + "'", &out,
                     &last),
            0)
      << out;  // --force: a checkpoint either way
  const nlohmann::json r = nlohmann::json::parse(last);
  ASSERT_TRUE(r.contains("regimes")) << last;
  int64_t domain_positions = 0;
  for (const auto& [d, n] : r["positions"].items()) domain_positions += n.get<int64_t>();

  // An independent estimate on the held-out records.
  std::unique_ptr<ReplayReader> reader;
  ASSERT_TRUE(ReplayReader::Open({}, {dir_->Sub("buffer")}, &reader).ok());
  std::vector<Record> heldout;
  ASSERT_TRUE(reader
                  ->Scan({}, [&](size_t, const Record& rec) {
                    if (IsHeldOut(rec, 0.1)) heldout.push_back(rec);
                    return true;
                  })
                  .ok());
  std::unique_ptr<LlamaModel> initial, trained;
  ASSERT_TRUE(LlamaModel::Load(SharedDir() + "/models/draft-prose-1m", {}, &initial).ok());
  ASSERT_TRUE(LlamaModel::Load(ckpt.Sub("v000001"), {}, &trained).ok());
  AlphaEstimate before, after;
  ASSERT_TRUE(EstimateAlpha(*initial, heldout, 16, &before).ok());
  ASSERT_TRUE(EstimateAlpha(*trained, heldout, 16, &after).ok());

  std::string err;
  ASSERT_TRUE(ReadFileToString(err_path, &err).ok());
  int64_t regime_positions = 0;
  double weighted_before = 0;
  for (const char* g : {"greedy", "sampled"}) {
    ASSERT_TRUE(r["regimes"].contains(g)) << last;
    const nlohmann::json& x = r["regimes"][g];
    const int64_t n = x["positions"].get<int64_t>();
    ASSERT_GT(n, 0) << g << ": " << last;
    ASSERT_TRUE(before.regimes.count(g)) << g;
    EXPECT_EQ(n, before.regimes[g].positions) << g;
    EXPECT_NEAR(x["alpha_before"].get<double>(), before.regimes[g].logged, 1e-5) << g;
    EXPECT_NEAR(x["alpha_after"].get<double>(), after.regimes[g].logged, 1e-5) << g;
    regime_positions += n;
    weighted_before += n * x["alpha_before"].get<double>();
    const std::regex line("\\n  " + std::string(g) +
                          " +alpha [0-9.]+ -> [0-9.]+  \\(" + std::to_string(n) +
                          " positions; sampling regime\\)\\n");
    EXPECT_TRUE(std::regex_search(err, line)) << err;
  }
  // Greedy values are agreements (0 or 1): their mean times the count is a whole number.
  const double agreed = r["regimes"]["greedy"]["alpha_before"].get<double>() *
                        r["regimes"]["greedy"]["positions"].get<double>();
  EXPECT_NEAR(agreed, std::round(agreed), 1e-6);
  // The regimes partition the positions the domains count.
  EXPECT_EQ(regime_positions, domain_positions);
  EXPECT_NEAR(weighted_before / regime_positions, r["overall_before"].get<double>(), 1e-9);
  std::cout << last;
}

// Runs `args` (quoted) then `tail` through the shell; returns the exit status, with stdout in
// *out and its last JSON line in *last.
int RunCommand(const std::vector<std::string>& args, const std::string& tail, std::string* out,
               std::string* last) {
  std::string cmd;
  for (const auto& a : args) cmd += "'" + a + "' ";
  FILE* p = popen((cmd + tail).c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  while (fgets(buf, sizeof(buf), p)) {
    *out += buf;
    if (buf[0] == '{') *last = buf;
  }
  return WEXITSTATUS(pclose(p));
}

// --draft takes an EAGLE-3 head too (with --target): --offline trains it and writes a head
// checkpoint; without --target it is a usage error.
TEST_F(TrainCommandTest, OfflineTrainsAnEagle3HeadWithItsTarget) {
  TempDir dir("specloop-train-head");
  const std::string target_dir = SharedDir() + "/models/target-6m";
  std::unique_ptr<LlamaModel> target;
  ASSERT_TRUE(LlamaModel::Load(target_dir, {}, &target).ok());
  std::unique_ptr<Eagle3Head> init;
  ASSERT_TRUE(Eagle3Head::InitFromTarget(*target, {}, &init).ok());
  ASSERT_TRUE(init->Save(dir.Sub("head")).ok());
  std::vector<std::string> args = {SPECLOOP_BINARY, "train", "--draft", dir.Sub("head"),
                                   "--buffer", dir_->Sub("buffer"), "--checkpoints",
                                   dir.Sub("ckpt"), "--lr", "2e-3", "--metrics-port", "0",
                                   "--threads", "1", "--offline", "--epochs", "2"};
  std::string out, last;
  EXPECT_EQ(RunCommand(args, "2>'" + dir.Sub("err.txt") + "'", &out, &last), 2) << out;
  std::string err;
  ASSERT_TRUE(ReadFileToString(dir.Sub("err.txt"), &err).ok());
  EXPECT_NE(err.find("--target DIR is required"), std::string::npos) << err;

  args.insert(args.end(), {"--target", target_dir});
  out.clear();
  ASSERT_EQ(RunCommand(args, "2>/dev/null", &out, &last), 0) << out;
  const nlohmann::json r = nlohmann::json::parse(last);
  EXPECT_EQ(r["draft_kind"], "eagle3") << last;
  EXPECT_EQ(r["version"], 1) << last;
  EXPECT_GT(r["overall_after"].get<double>(), r["overall_before"].get<double>() + 0.05) << last;
  const std::string v1 = dir.Sub("ckpt/v000001");
  EXPECT_TRUE(IsEagle3Dir(v1));
  std::unique_ptr<Eagle3Head> trained;
  const Status s = Eagle3Head::Load(v1, *target, LoadOptions(), &trained);
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::string meta_text, sha;
  ASSERT_TRUE(ReadFileToString(v1 + "/meta.json", &meta_text).ok());
  ASSERT_TRUE(Sha256File(v1 + "/model.safetensors", &sha).ok());
  EXPECT_EQ(nlohmann::json::parse(meta_text)["sha256"], sha);
}

TEST_F(TrainCommandTest, OnlineLoopPublishesACheckpointThatAWorkerFetches) {
  TempDir ckpt("specloop-train-online"), staging("specloop-train-staging");
  std::vector<std::string> args = TrainArgs(ckpt.path());
  for (const char* a : {"--pub", "tcp://127.0.0.1:*", "--router", "tcp://127.0.0.1:*",
                        "--eval-every", "20"}) {
    args.push_back(a);
  }
  Child trainer(args);
  std::string line;
  const std::regex ready(R"(announcing on (tcp://[0-9.:]+), serving on (tcp://[0-9.:]+))");
  ASSERT_TRUE(trainer.ReadUntil(ready, &line)) << trainer.log();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(line, m, ready));

  zmq::context_t ctx;
  FetcherOptions fo;
  fo.pub_endpoint = m[1];
  fo.router_endpoint = m[2];
  std::unique_ptr<DraftFetcher> fetcher;
  ASSERT_TRUE(DraftFetcher::Open(&ctx, fo, &fetcher).ok());
  DraftAnnouncement a;
  Status s = Status::NotFound("");
  for (int waited = 0; !s.ok() && waited < 240; ++waited) s = fetcher->WaitAnnouncement(1000, &a);
  ASSERT_TRUE(s.ok()) << s.ToString() << "\n" << trainer.log();
  EXPECT_EQ(a.version, 1u);
  std::string dir;
  ASSERT_TRUE(fetcher->Fetch(a, staging.path(), &dir).ok());
  std::unique_ptr<LlamaModel> fetched;
  ASSERT_TRUE(LlamaModel::Load(dir, {}, &fetched).ok());
  ModelConfig target;
  ASSERT_TRUE(ModelConfig::FromDir(SharedDir() + "/models/target-6m", &target).ok());
  EXPECT_TRUE(CheckDraftCompatible(target, fetched->config()).ok());
  EXPECT_EQ(trainer.Stop(SIGTERM), 0) << trainer.log();
}

}  // namespace
}  // namespace trainer
}  // namespace specloop
