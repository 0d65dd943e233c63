// The trainer on a small real buffer: records logged from target-6m verifying draft-prose-1m
// over python, c and legal prompts (made once per test binary). Offline distillation must raise
// the held-out estimated alpha of every domain; the gate must refuse a damaged candidate; a
// restarted trainer resumes from `latest`; checkpoints keep the last N.
#include "trainer/trainer.h"

#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "buffer/replay_logger.h"
#include "common/channel/draft_channel.h"
#include "tests/trainer/test_util.h"
#include "tests/trainer/traffic_trainer_options.h"
#include "trainer/synthetic_traffic.h"

namespace specloop {
namespace trainer {
namespace {

using testing::SharedDir;
using testing::TempDir;

const char* const kDomains[] = {"python", "c", "legal"};

class TrainerLoopTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    const Status s = testing::MakeTrafficBuffer(dir_->Sub("buffer"));
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  static void TearDownTestSuite() { delete dir_; }

  static TrainerOptions Options(const std::string& checkpoints) {
    TrainerOptions o = testing::TrafficTrainerOptions(dir_->Sub("buffer"), checkpoints);
    o.gate.min_domain_positions = 30;
    return o;
  }

  static TempDir* dir_;
};
TempDir* TrainerLoopTest::dir_ = nullptr;

TEST_F(TrainerLoopTest, OfflineDistillationRaisesHeldOutAlphaOfEveryDomain) {
  TempDir ckpt;
  std::unique_ptr<Trainer> t;
  Status s = Trainer::Open(Options(ckpt.path()), nullptr, &t);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_GT(t->heldout_size(), 0u);
  EvalResult r;
  s = t->RunOffline(4, /*force=*/false, {}, &r);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (const char* d : kDomains) {
    ASSERT_TRUE(r.live.domains.count(d)) << d;
    std::cout << d << ": alpha " << r.live.domains[d].logged << " -> "
              << r.candidate.domains[d].logged << " on " << r.candidate.domains[d].positions
              << " held-out positions\n";
    EXPECT_GT(r.candidate.domains[d].logged, r.live.domains[d].logged + 0.01) << d;
  }
  EXPECT_TRUE(r.decision.publish) << r.decision.reason << ": " << r.decision.detail;
  EXPECT_EQ(r.version, 1u);
  // The checkpoint and its meta.json.
  const std::string dir = ckpt.Sub("v000001");
  for (const char* f : {"model.safetensors", "config.json", "meta.json"}) {
    EXPECT_TRUE(std::filesystem::exists(dir + "/" + f)) << f;
  }
  std::string text;
  ASSERT_TRUE(ReadFileToString(dir + "/meta.json", &text).ok());
  nlohmann::json meta = nlohmann::json::parse(text);
  for (const char* k : {"version", "parent", "sha256", "objective", "steps", "samples",
                        "alpha_before", "alpha_after", "created"}) {
    EXPECT_TRUE(meta.contains(k)) << k;
  }
  std::string sha;
  ASSERT_TRUE(Sha256File(dir + "/model.safetensors", &sha).ok());
  EXPECT_EQ(meta["sha256"], sha);
  EXPECT_EQ(meta["version"], 1);
  EXPECT_EQ(meta["parent"], 0);
  EXPECT_EQ(meta["objective"], "jsd:0.5");
  EXPECT_NEAR(meta["alpha_after"]["python"].get<double>(), r.candidate.domains["python"].logged,
              1e-12);
  ASSERT_TRUE(ReadFileToString(ckpt.Sub("latest"), &text).ok());
  EXPECT_EQ(text, "v000001\n");

  // A restarted trainer resumes from latest: the live draft is v1 and scores as before.
  std::unique_ptr<Trainer> again;
  ASSERT_TRUE(Trainer::Open(Options(ckpt.path()), nullptr, &again).ok());
  EXPECT_EQ(again->live_version(), 1u);
  EXPECT_EQ(again->steps(), t->steps());
  AlphaEstimate resumed;
  std::vector<Record> heldout;
  ASSERT_TRUE(again->LoadHeldOut(&heldout).ok());
  ASSERT_EQ(heldout.size(), again->heldout_size());
  ASSERT_TRUE(EstimateAlpha(*again->candidate(), heldout, 16, &resumed).ok());
  EXPECT_NEAR(resumed.overall.logged, r.candidate.overall.logged, 1e-5);
}

// With context_gradient off a record's prompt runs forward only: the step's loss is the same
// (the forward computes the same values) and the step is not (no gradient reaches the prompt).
TEST_F(TrainerLoopTest, ContextWithoutGradientTrainsOnTheSameLoss) {
  double loss[2] = {0, 0};
  std::vector<at::Tensor> weights[2];
  for (int with_context = 0; with_context < 2; ++with_context) {
    TempDir ckpt;
    TrainerOptions o = Options(ckpt.path());
    o.context_gradient = with_context == 1;
    std::unique_ptr<Trainer> t;
    ASSERT_TRUE(Trainer::Open(o, nullptr, &t).ok());
    std::vector<Record> records;
    ASSERT_TRUE(t->LoadHeldOut(&records).ok());  // any records will do for one step
    ASSERT_GE(records.size(), 6u);
    // Logged records carry prompt rows from position 1 on (nothing precedes the first trained
    // position); a prompt whose prefix the KV cache held has rows past that prefix only. Drop
    // the prompt rows: the prompt is then a context before the first trained position.
    for (Record& r : records) {
      const uint32_t prompt_len = r.prompt_len;
      r.steps.erase(std::remove_if(r.steps.begin(), r.steps.end(),
                                   [prompt_len](const SpecStep& st) {
                                     return st.start_pos < prompt_len;
                                   }),
                    r.steps.end());
    }
    std::vector<const Record*> batch;
    for (size_t i = 0; i < 6; ++i) batch.push_back(&records[i]);
    Status s = t->TrainStep(batch, &loss[with_context]);
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (const at::Tensor& w : t->candidate()->Parameters()) {
      weights[with_context].push_back(w.detach().clone());
    }
  }
  EXPECT_GT(loss[1], 0);
  EXPECT_NEAR(loss[0], loss[1], 1e-5 * loss[1]);
  double differ = 0;
  for (size_t i = 0; i < weights[0].size(); ++i) {
    differ = std::max(differ, (weights[0][i] - weights[1][i]).abs().max().item<double>());
  }
  EXPECT_GT(differ, 1e-6);  // a first AdamW step moves each weight it has a gradient for by ~lr/20
}

// Evaluation reads the held-out set in parts of eval_batch_records (its memory does not grow
// with the set): the parts, the last one short, must add up to one pass over the whole set.
TEST_F(TrainerLoopTest, EvaluationInPartsEqualsOnePassOverTheHeldOutSet) {
  TempDir ckpt;
  TrainerOptions o = Options(ckpt.path());
  o.eval_batch_records = 4;
  std::unique_ptr<Trainer> t;
  ASSERT_TRUE(Trainer::Open(o, nullptr, &t).ok());
  std::vector<Record> heldout;
  ASSERT_TRUE(t->LoadHeldOut(&heldout).ok());
  ASSERT_GT(heldout.size(), 4u);
  ASSERT_NE(heldout.size() % 4, 0u) << "the test wants a short last part";
  AlphaEstimate whole;
  ASSERT_TRUE(EstimateAlpha(*t->live(), heldout, 16, &whole).ok());

  EvalResult r;
  ASSERT_TRUE(t->Evaluate(&r).ok());
  EXPECT_EQ(t->heldout_size(), heldout.size());
  for (const AlphaEstimate* parts : {&r.live, &r.candidate}) {
    EXPECT_EQ(parts->overall.positions, whole.overall.positions);
    EXPECT_NEAR(parts->overall.logged, whole.overall.logged, 1e-5);
    EXPECT_NEAR(parts->overall.coarsened, whole.overall.coarsened, 1e-5);
    ASSERT_EQ(parts->logged_values.size(), whole.logged_values.size());
    for (const auto& [domain, values] : whole.logged_values) {
      const std::vector<double>& got = parts->logged_values.at(domain);
      ASSERT_EQ(got.size(), values.size()) << domain;
      for (size_t i = 0; i < values.size(); ++i) EXPECT_NEAR(got[i], values[i], 1e-5) << domain;
    }
  }
}

// The value of a counter sample `name` (with its labels) in the registry's exposition; -1
// when absent.
double Sample(const metrics::Registry& registry, const std::string& name) {
  const std::string text = registry.Serialize();
  const size_t at = text.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + name.size() + 2));
}

// An evaluation runs the live draft only on held-out records it has no values for: they are
// kept while it stays live, and a publish brings the candidate's. The estimates stay those of
// a full pass of the current live draft.
TEST_F(TrainerLoopTest, EvaluationRunsTheLiveDraftOnNewRecordsOnly) {
  TempDir ckpt;
  metrics::Registry registry;
  std::unique_ptr<Trainer> t;
  ASSERT_TRUE(Trainer::Open(Options(ckpt.path()), &registry, &t).ok());
  std::vector<Record> heldout;
  ASSERT_TRUE(t->LoadHeldOut(&heldout).ok());
  const double n = static_cast<double>(heldout.size());
  ASSERT_GT(n, 0);
  auto evaluated = [&](const char* model) {
    return Sample(registry,
                  std::string("specloop_train_evaluated_records_total{model=\"") + model + "\"}");
  };
  EvalResult first;
  ASSERT_TRUE(t->Evaluate(&first).ok());
  EXPECT_EQ(evaluated("live"), n);
  EXPECT_EQ(evaluated("candidate"), n);
  {
    at::NoGradGuard no_grad;
    at::manual_seed(5);
    for (at::Tensor& p : t->candidate()->Parameters()) p.add_(at::randn_like(p) * 0.02);
  }
  EvalResult r;
  ASSERT_TRUE(t->EvaluateAndPublish(nullptr, /*force=*/true, &r).ok());
  ASSERT_EQ(r.version, 1u);
  const TrainerState published = t->state();  // what /status.json shows
  EXPECT_EQ(published.evaluations, 1);
  EXPECT_TRUE(published.published);
  EXPECT_EQ(published.published_version, 1u);
  EXPECT_EQ(published.live_version, 1u);
  EXPECT_DOUBLE_EQ(published.candidate_alpha, r.candidate.overall.logged);
  EXPECT_EQ(evaluated("live"), n);  // the same live draft: nothing run again
  EXPECT_EQ(evaluated("candidate"), 2 * n);

  // The published candidate is live now, with the values it was evaluated with.
  ASSERT_TRUE(t->Evaluate(&r).ok());
  EXPECT_EQ(evaluated("live"), n);
  EXPECT_EQ(evaluated("candidate"), 3 * n);
  AlphaEstimate fresh;
  ASSERT_TRUE(EstimateAlpha(*t->live(), heldout, 16, &fresh).ok());
  EXPECT_GT(std::abs(fresh.overall.logged - first.live.overall.logged), 1e-3)
      << "the perturbation should have moved alpha";
  EXPECT_EQ(r.live.overall.positions, fresh.overall.positions);
  EXPECT_NEAR(r.live.overall.logged, fresh.overall.logged, 1e-5);
  EXPECT_NEAR(r.live.overall.coarsened, fresh.overall.coarsened, 1e-5);
  for (const auto& [domain, values] : fresh.logged_values) {
    const std::vector<double>& got = r.live.logged_values.at(domain);
    ASSERT_EQ(got.size(), values.size()) << domain;
    for (size_t i = 0; i < values.size(); ++i) EXPECT_NEAR(got[i], values[i], 1e-5) << domain;
  }
  EXPECT_NE(registry.Serialize().find("specloop_train_evaluation_duration_seconds_count 3"),
            std::string::npos);
}

TEST_F(TrainerLoopTest, GateRefusesADamagedCandidate) {
  TempDir ckpt;
  metrics::Registry registry;
  std::unique_ptr<Trainer> t;
  ASSERT_TRUE(Trainer::Open(Options(ckpt.path()), &registry, &t).ok());
  {
    at::NoGradGuard no_grad;
    at::manual_seed(3);
    for (at::Tensor& p : t->candidate()->Parameters()) p.add_(at::randn_like(p) * 0.05);
  }
  EvalResult r;
  ASSERT_TRUE(t->EvaluateAndPublish(nullptr, /*force=*/false, &r).ok());
  EXPECT_FALSE(r.decision.publish);
  EXPECT_TRUE(r.decision.reason == "no_gain" || r.decision.reason == "domain_regression")
      << r.decision.reason;
  EXPECT_LT(r.candidate.overall.logged, r.live.overall.logged);
  EXPECT_EQ(r.version, 0u);
  EXPECT_EQ(t->checkpoints().Latest(), 0u);
  const TrainerState refused = t->state();  // what /status.json shows
  EXPECT_EQ(refused.evaluations, 1);
  EXPECT_FALSE(refused.published);
  EXPECT_EQ(refused.reason, r.decision.reason);
  EXPECT_EQ(refused.detail, r.decision.detail);
  EXPECT_DOUBLE_EQ(refused.live_alpha, r.live.overall.logged);
  EXPECT_EQ(refused.live_version, 0u);
  EXPECT_FALSE(std::filesystem::exists(ckpt.Sub("v000001")));
  const std::string text = registry.Serialize();
  EXPECT_NE(text.find("specloop_train_checkpoints_rejected_total{reason=\"" + r.decision.reason +
                      "\"} 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("specloop_train_estimated_alpha{domain=\"python\",model=\"candidate\"}"),
            std::string::npos);
}

TEST(CheckpointStore, KeepsTheLastNAndNeverReusesVersions) {
  TempDir ckpt;
  std::unique_ptr<LlamaModel> m;
  ASSERT_TRUE(LlamaModel::Load(SharedDir() + "/models/draft-prose-1m", {}, &m).ok());
  std::unique_ptr<CheckpointStore> store;
  ASSERT_TRUE(CheckpointStore::Open(ckpt.path(), 2, &store).ok());
  EXPECT_EQ(store->Latest(), 0u);
  for (uint64_t v = 1; v <= 4; ++v) {
    CheckpointMeta meta;
    meta.parent = v - 1;
    ASSERT_TRUE(store->Save(*m, &meta).ok());
    EXPECT_EQ(meta.version, v);
    EXPECT_EQ(store->Latest(), v);
  }
  EXPECT_FALSE(std::filesystem::exists(ckpt.Sub("v000002")));
  EXPECT_TRUE(std::filesystem::exists(ckpt.Sub("v000003")));
  EXPECT_TRUE(std::filesystem::exists(ckpt.Sub("v000004")));
  CheckpointMeta meta;
  ASSERT_TRUE(store->ReadMeta(4, &meta).ok());
  EXPECT_EQ(meta.parent, 3u);
  std::unique_ptr<LlamaModel> loaded;
  ASSERT_TRUE(LlamaModel::Load(ckpt.Sub("v000004"), {}, &loaded).ok());
  EXPECT_TRUE(loaded->Parameters()[0].equal(m->Parameters()[0]));
}

}  // namespace
}  // namespace trainer
}  // namespace specloop
