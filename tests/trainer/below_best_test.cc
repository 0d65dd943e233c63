// The trainer's best served draft per domain (trainer.h: EvalResult::best) and what follows
// from it: a draft that lost a domain is refused by the gate ("below_best") even after it was
// published, and the domain it lost is then replayed more (its replay floor and weight rise).
// On testing::MakeTrafficBuffer's buffer (python, c, legal): the candidate is trained on python
// alone at a high learning rate until another domain falls, then published by force; or the
// trainer publishes a blend of it with the live draft (weight_blend.h) the gate accepts.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <utility>
#include <vector>

#include "buffer/replay_reader.h"
#include "tests/trainer/test_util.h"
#include "trainer/training_examples.h"
#include "trainer/trainer.h"

namespace specloop {
namespace trainer {
namespace {

using testing::SharedDir;
using testing::TempDir;

// Share of each domain among the records of `batches` batches.
std::map<std::string, double> BatchShares(Trainer* t, int batches) {
  std::map<std::string, double> n;
  double total = 0;
  for (int b = 0; b < batches; ++b) {
    std::vector<Record> batch;
    EXPECT_TRUE(t->SampleBatch(&batch).ok());
    for (const Record& r : batch) n[r.domain] += 1, total += 1;
  }
  for (auto& [d, x] : n) x /= total;
  return n;
}

// 40 steps of 6 of the buffer's python training records each (the candidate forgets the rest);
// *out: those records.
void TrainOnPythonAlone(Trainer* t, const TrainerOptions& o, std::vector<Record>* out) {
  std::unique_ptr<ReplayReader> reader;
  ASSERT_TRUE(ReplayReader::Open({}, o.buffer_dirs, &reader).ok());
  std::vector<Record> python;
  ASSERT_TRUE(reader
                  ->Scan({}, [&](size_t, const Record& r) {
                    if (r.domain == "python" && !IsHeldOut(r, o.heldout_fraction)) {
                      python.push_back(r);
                    }
                    return true;
                  })
                  .ok());
  ASSERT_GE(python.size(), 12u);
  for (int step = 0; step < 40; ++step) {
    std::vector<const Record*> batch;
    for (size_t i = 0; i < 6; ++i) batch.push_back(&python[(step * 6 + i) % python.size()]);
    double loss = 0;
    ASSERT_TRUE(t->TrainStep(batch, &loss).ok());
  }
  *out = std::move(python);
}

TEST(BelowBest, ALostDomainStaysBelowItsBestAfterAPublishAndIsReplayedMore) {
  TempDir dir;
  Status s = testing::MakeTrafficBuffer(dir.Sub("buffer"));
  ASSERT_TRUE(s.ok()) << s.ToString();
  TrainerOptions o;
  o.draft_dir = SharedDir() + "/models/draft-prose-1m";
  o.buffer_dirs = {dir.Sub("buffer")};
  o.checkpoint_dir = dir.Sub("checkpoints");
  o.heldout_fraction = 0.25;
  o.batch_records = 6;
  o.adamw.lr = 1e-2;  // forgets fast
  o.warmup_steps = 0;
  o.gate.min_domain_positions = 30;
  o.gate.max_fall_below_best = 0.02;  // the default, set here as the test relies on it
  o.seed = 7;
  std::unique_ptr<Trainer> t;
  s = Trainer::Open(o, nullptr, &t);
  ASSERT_TRUE(s.ok()) << s.ToString();

  // 1. The initial draft is served: it is every domain's best (candidate = live: no gain).
  EvalResult first;
  ASSERT_TRUE(t->EvaluateAndPublish(nullptr, false, &first).ok());
  EXPECT_EQ(first.decision.reason, "no_gain") << first.decision.detail;
  for (const auto& [d, a] : first.live.domains) {
    EXPECT_DOUBLE_EQ(first.best.domains.at(d).logged, a.logged) << d;
  }
  const std::map<std::string, double> shares_before = BatchShares(t.get(), 300);

  // 2. Train on python alone, publish by force whatever the gate says.
  std::vector<Record> python;
  TrainOnPythonAlone(t.get(), o, &python);
  if (HasFatalFailure()) return;
  EvalResult forced;
  ASSERT_TRUE(t->EvaluateAndPublish(nullptr, /*force=*/true, &forced).ok());
  ASSERT_EQ(forced.version, 1u);
  // The domain the candidate lost most.
  std::string lost;
  double fall = 0;
  for (const auto& [d, a] : forced.candidate.domains) {
    const double f = first.live.domains.at(d).logged - a.logged;
    std::cout << d << ": " << first.live.domains.at(d).logged << " -> " << a.logged << "\n";
    if (f > fall) lost = d, fall = f;
  }
  ASSERT_GT(fall, 0.05) << "training on python alone lost no domain: nothing to test";

  // 3. The forgetful draft is live now; the best on `lost` is still the initial draft's, on
  // the same records. A candidate equal to the live draft is refused for it.
  EvalResult after;
  ASSERT_TRUE(t->EvaluateAndPublish(nullptr, false, &after).ok());
  EXPECT_NEAR(after.best.domains.at(lost).logged, first.live.domains.at(lost).logged, 1e-9);
  EXPECT_NEAR(after.live.domains.at(lost).logged, forced.candidate.domains.at(lost).logged, 1e-9);
  EXPECT_EQ(after.decision.reason, "below_best") << after.decision.detail;
  EXPECT_NE(std::find(after.decision.below_best.begin(), after.decision.below_best.end(), lost),
            after.decision.below_best.end())
      << after.decision.detail;
  EXPECT_EQ(t->live_version(), 1u);
  // Blends of two equal drafts are that draft: each tried (TrainerOptions::below_best_blends),
  // each refused, and the refusal reported is the candidate's own.
  EXPECT_EQ(after.blends_tried, static_cast<int>(o.below_best_blends.size()));
  EXPECT_EQ(after.blend_lambda, 1.0);

  // 4. The domains the gate named are replayed more than before (their floors and weights
  // grow with the gap), the others less.
  const std::map<std::string, double> shares_after = BatchShares(t.get(), 300);
  double named_before = 0, named_after = 0;
  for (const auto& [d, share] : shares_after) {
    std::cout << d << " share of replay " << shares_before.at(d) << " -> " << share << "\n";
    const auto& named = after.decision.below_best;
    if (std::find(named.begin(), named.end(), d) != named.end()) {
      named_before += shares_before.at(d);
      named_after += share;
    } else {
      EXPECT_LT(share, shares_before.at(d)) << d;
    }
  }
  // What the other domains get shrinks by more than a third.
  EXPECT_LT(1 - named_after, (1 - named_before) * 2 / 3);
}

// A candidate trained on python alone holds domains below their best (the live
// draft's); the gate refuses it for that, and the trainer publishes the first blend of the live
// draft and the candidate (live + lambda * (candidate - live)) that the gate accepts: the
// published weights are that blend, and training goes on from them.
TEST(BelowBest, ARefusedCandidateIsPublishedAsABlend) {
  TempDir dir;
  Status s = testing::MakeTrafficBuffer(dir.Sub("buffer"));
  ASSERT_TRUE(s.ok()) << s.ToString();
  TrainerOptions o;
  o.draft_dir = SharedDir() + "/models/draft-prose-1m";
  o.buffer_dirs = {dir.Sub("buffer")};
  o.checkpoint_dir = dir.Sub("checkpoints");
  o.heldout_fraction = 0.25;
  o.adamw.lr = 2e-3;
  o.warmup_steps = 0;
  o.gate.min_domain_positions = 30;
  // The gate judges by the best alone here: no tolerance against the live draft, no least
  // gain (the candidate, overfit to python, may lose overall).
  o.gate.max_fall_below_best = 0.02;
  o.gate.max_domain_regression = 1;
  o.gate.min_gain = -1;
  o.below_best_blends = {0.5, 0.25, 0.125};
  o.seed = 7;
  std::unique_ptr<Trainer> t;
  s = Trainer::Open(o, nullptr, &t);
  ASSERT_TRUE(s.ok()) << s.ToString();
  auto clone = [&] {
    std::vector<at::Tensor> w;
    for (const at::Tensor& p : t->candidate_draft()->Parameters()) w.push_back(p.detach().clone());
    return w;
  };
  const std::vector<at::Tensor> live = clone();  // the candidate starts as the live draft

  std::vector<Record> python;
  TrainOnPythonAlone(t.get(), o, &python);
  if (HasFatalFailure()) return;
  const std::vector<at::Tensor> trained = clone();
  EvalResult r;
  ASSERT_TRUE(t->EvaluateAndPublish(nullptr, false, &r).ok());
  std::cout << r.decision.detail << "\n";
  ASSERT_GT(r.blends_tried, 0) << "the candidate was not refused for below_best alone: "
                               << r.decision.reason << ": " << r.decision.detail;
  ASSERT_EQ(r.decision.reason, "ok") << "no blend accepted: " << r.decision.detail;
  EXPECT_EQ(r.version, 1u);
  EXPECT_EQ(t->live_version(), 1u);
  EXPECT_EQ(r.blend_lambda, o.below_best_blends[r.blends_tried - 1]);
  // The candidate (what was published, and what training continues from) is the blend.
  const std::vector<at::Tensor> now = clone();
  ASSERT_EQ(now.size(), live.size());
  double moved = 0;
  for (size_t i = 0; i < now.size(); ++i) {
    const at::Tensor want = live[i] + (trained[i] - live[i]) * r.blend_lambda;
    EXPECT_TRUE(at::allclose(now[i], want, 1e-5, 1e-6)) << "tensor " << i;
    moved = std::max(moved, (trained[i] - live[i]).abs().max().item<double>());
  }
  EXPECT_GT(moved, 1e-3) << "training did not move the weights";
  // The blend lies between the two: below the best on the domains the candidate lost, by no
  // more than the gate allows; training goes on from it.
  EXPECT_GT(r.blend_lambda, 0);
  double loss = 0;
  std::vector<const Record*> batch = {&python[0], &python[1]};
  EXPECT_TRUE(t->TrainStep(batch, &loss).ok());
}

}  // namespace
}  // namespace trainer
}  // namespace specloop
