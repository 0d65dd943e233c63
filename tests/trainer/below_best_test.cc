// The trainer's best served draft per domain (trainer.h: EvalResult::best) and what follows
// from it: a draft that lost a domain is refused by the gate ("below_best") even after it was
// published, and the domain it lost is then replayed more (its replay floor and weight rise).
// On testing::MakeTrafficBuffer's buffer (python, c, legal): the candidate is trained on python
// alone at a high learning rate until another domain falls, then published by force.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <map>

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
  o.gate.max_fall_below_best = 0.02;  // off by default
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

}  // namespace
}  // namespace trainer
}  // namespace specloop
