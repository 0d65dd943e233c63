// The trainer with an EAGLE-3 head as its draft, on a small real buffer (target-6m verifying
// draft-prose-1m over python, c and legal prompts): offline training raises every domain's
// held-out alpha and writes a head checkpoint that a restarted trainer resumes from; a head
// without its target is refused; a first head, while nothing is served, is judged against plain
// decoding; the online loop trains and publishes a head as it does a draft model.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "common/model/eagle3_config.h"
#include "common/model/eagle3_head.h"
#include "tests/trainer/test_util.h"
#include "trainer/feature_draft_training.h"
#include "trainer/trainer.h"

namespace specloop {
namespace trainer {
namespace {

using testing::SharedDir;
using testing::TempDir;

const char* const kDomains[] = {"python", "c", "legal"};

class FeatureDraftTrainerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    Status s = testing::MakeTrafficBuffer(dir_->Sub("buffer"));
    ASSERT_TRUE(s.ok()) << s.ToString();
    std::unique_ptr<LlamaModel> target;
    ASSERT_TRUE(LlamaModel::Load(TargetDir(), {}, &target).ok());
    std::unique_ptr<Eagle3Head> head;
    s = Eagle3Head::InitFromTarget(*target, {}, &head);
    ASSERT_TRUE(s.ok()) << s.ToString();
    s = head->Save(dir_->Sub("head"));
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  static void TearDownTestSuite() { delete dir_; }

  static std::string TargetDir() { return SharedDir() + "/models/target-6m"; }

  static TrainerOptions Options(const std::string& checkpoints) {
    TrainerOptions o;
    o.draft_dir = dir_->Sub("head");
    o.target_dir = TargetDir();
    o.buffer_dirs = {dir_->Sub("buffer")};
    o.checkpoint_dir = checkpoints;
    o.heldout_fraction = 0.25;
    o.batch_records = 6;
    o.warmup_steps = 5;
    o.adamw.lr = 2e-3;
    o.gate.min_domain_positions = 30;
    o.seed = 7;
    return o;
  }

  static TempDir* dir_;
};
TempDir* FeatureDraftTrainerTest::dir_ = nullptr;

TEST_F(FeatureDraftTrainerTest, OfflineTrainingRaisesEveryDomainAndResumesFromTheCheckpoint) {
  TempDir ckpt;
  std::unique_ptr<Trainer> t;
  Status s = Trainer::Open(Options(ckpt.path()), nullptr, &t);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_NE(t->target(), nullptr);
  EXPECT_STREQ(t->candidate_draft()->kind(), "eagle3");
  EXPECT_EQ(t->candidate(), nullptr);  // not a draft model
  EXPECT_EQ(t->state().draft_kind, "eagle3");
  EvalResult r;
  s = t->RunOffline(2, /*force=*/false, {}, &r);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (const char* d : kDomains) {
    ASSERT_TRUE(r.live.domains.count(d)) << d;
    std::cout << d << ": alpha " << r.live.domains[d].logged << " -> "
              << r.candidate.domains[d].logged << " on " << r.candidate.domains[d].positions
              << " held-out positions\n";
    EXPECT_GT(r.candidate.domains[d].logged, r.live.domains[d].logged + 0.05) << d;
  }
  ASSERT_TRUE(r.decision.publish) << r.decision.reason << ": " << r.decision.detail;
  ASSERT_EQ(r.version, 1u);
  const std::string v1 = ckpt.Sub("v000001");
  for (const char* f : {"model.safetensors", "config.json", "meta.json"}) {
    EXPECT_TRUE(std::filesystem::exists(v1 + "/" + f)) << f;
  }
  EXPECT_TRUE(IsEagle3Dir(v1));
  // The published head is live: it scores what the candidate scored.
  std::vector<Record> heldout;
  ASSERT_TRUE(t->LoadHeldOut(&heldout).ok());
  std::vector<RecordAlpha> values;
  ASSERT_TRUE(t->live_draft()->Estimate(heldout, 16, &values).ok());
  AlphaAccumulator acc;
  for (const RecordAlpha& v : values) acc.Add(v);
  EXPECT_NEAR(acc.Estimate().overall.logged, r.candidate.overall.logged, 2e-3);

  // A restarted trainer resumes from v000001: its live head is the checkpoint.
  std::unique_ptr<Trainer> again;
  s = Trainer::Open(Options(ckpt.path()), nullptr, &again);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(again->live_version(), 1u);
  EXPECT_EQ(again->steps(), t->steps());
  ASSERT_TRUE(again->live_draft()->Estimate(heldout, 16, &values).ok());
  AlphaAccumulator resumed;
  for (const RecordAlpha& v : values) resumed.Add(v);
  EXPECT_NEAR(resumed.Estimate().overall.logged, r.candidate.overall.logged, 2e-3);

  // The same checkpoints with a draft model as --draft: refused, naming both kinds.
  TrainerOptions model = Options(ckpt.path());
  model.draft_dir = SharedDir() + "/models/draft-prose-1m";
  std::unique_ptr<Trainer> wrong;
  s = Trainer::Open(model, nullptr, &wrong);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.ToString().find("EAGLE-3 head"), std::string::npos) << s.ToString();
}

TEST_F(FeatureDraftTrainerTest, AHeadNeedsItsTarget) {
  TempDir ckpt;
  TrainerOptions o = Options(ckpt.path());
  o.target_dir.clear();
  std::unique_ptr<Trainer> t;
  const Status s = Trainer::Open(o, nullptr, &t);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.ToString().find("--target"), std::string::npos) << s.ToString();
}

// While nothing is served, the untrained head (alpha ~0.1 on this buffer) is refused as slower
// than plain decoding, although the live-vs-candidate gate would have nothing to compare (the
// same weights); with drafts made free it pays at any alpha above 0 and is published.
TEST_F(FeatureDraftTrainerTest, AFirstHeadIsJudgedAgainstPlainDecoding) {
  TempDir ckpt;
  TrainerOptions o = Options(ckpt.path());
  o.initial_draft_served = false;
  std::unique_ptr<Trainer> t;
  Status s = Trainer::Open(o, nullptr, &t);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EvalResult r;
  s = t->EvaluateAndPublish(nullptr, /*force=*/false, &r);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_FALSE(r.decision.publish) << r.decision.detail;
  EXPECT_EQ(r.decision.reason, "slower_than_plain") << r.decision.detail;
  EXPECT_LT(r.candidate.overall.logged, 0.3);

  o.gate.draft_cost = 0;
  o.gate.verify_cost = 0;
  o.gate.min_speedup = 1.0;
  s = Trainer::Open(o, nullptr, &t);
  ASSERT_TRUE(s.ok()) << s.ToString();
  s = t->EvaluateAndPublish(nullptr, /*force=*/false, &r);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(r.decision.publish) << r.decision.reason << ": " << r.decision.detail;
  EXPECT_EQ(r.version, 1u);
  // From then on a head is served: the next candidate must beat it (no gain: refused).
  s = t->EvaluateAndPublish(nullptr, /*force=*/false, &r);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_FALSE(r.decision.publish);
  EXPECT_EQ(r.decision.reason, "no_gain") << r.decision.detail;
}

TEST_F(FeatureDraftTrainerTest, OnlineLoopPublishesAHead) {
  TempDir ckpt;
  TrainerOptions o = Options(ckpt.path());
  o.eval_every_steps = 10;
  o.catch_up_interval_ms = 100;
  std::unique_ptr<Trainer> t;
  Status s = Trainer::Open(o, nullptr, &t);
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::atomic<bool> stop{false};
  Status loop;
  std::thread runner([&] { loop = t->RunOnline(stop, nullptr); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(150);
  TrainerState st;
  while (std::chrono::steady_clock::now() < deadline) {
    st = t->state();
    if (st.live_version > 0 || st.activity == "waiting for traffic") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  stop = true;
  runner.join();
  ASSERT_TRUE(loop.ok()) << loop.ToString();
  st = t->state();
  EXPECT_EQ(st.draft_kind, "eagle3");
  EXPECT_EQ(st.live_version, 1u) << st.reason << ": " << st.detail;
  EXPECT_GT(st.candidate_alpha, st.live_alpha);
  EXPECT_TRUE(IsEagle3Dir(ckpt.Sub("v000001")));
}

}  // namespace
}  // namespace trainer
}  // namespace specloop
