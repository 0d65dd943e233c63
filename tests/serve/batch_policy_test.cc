// The batch-aware side of SpeculationPolicy (common/speculation_policy.h): BatchCostModel and
// ChooseKInBatch, which must turn speculation down and off as the batch grows.
#include <gtest/gtest.h>

#include "common/speculation_policy.h"

namespace specloop {
namespace {

TEST(BatchCostModel, InterpolatesAndExtrapolates) {
  BatchCostModel m;
  EXPECT_TRUE(m.empty());
  EXPECT_EQ(m.Seconds(4), 0.0);
  m.Seed(1, 1.0);
  m.Seed(16, 2.5);
  EXPECT_FALSE(m.empty());
  EXPECT_DOUBLE_EQ(m.Seconds(1), 1.0);
  EXPECT_DOUBLE_EQ(m.Seconds(16), 2.5);
  EXPECT_NEAR(m.Seconds(6), 1.0 + 1.5 * 5 / 15, 1e-12);
  EXPECT_NEAR(m.Seconds(64), 2.5 * 4, 1e-9);  // proportional beyond the largest
  EXPECT_NEAR(m.SecondsPerSequence(4, 4), 2.5 / 4, 1e-12);
  // Observations pull a point toward what was measured.
  for (int i = 0; i < 200; ++i) m.Observe(16, 5.0);
  EXPECT_NEAR(m.Seconds(16), 5.0, 0.05);
}

// A CPU-like cost: a fixed overhead per forward plus a cost per row, so that a lone sequence
// pays mostly overhead (speculation is cheap) and a big batch pays mostly rows.
BatchCostModel CpuLike(double overhead, double per_row) {
  BatchCostModel m;
  for (int rows : {1, 2, 3, 4, 5, 8, 9, 16, 18, 27, 40, 60, 90, 135, 202, 303})
    m.Seed(rows, overhead + per_row * rows);
  return m;
}

TEST(SpeculationPolicyInBatch, TurnsSpeculationDownThenOffAsTheBatchGrows) {
  const BatchCostModel cost = CpuLike(1.0, 0.05);
  SpeculationPolicyOptions o;
  o.probe_interval = 1000000;  // no probes in this test
  SpeculationPolicy p(o);
  p.SeedDraft(0.12);  // a draft token costs 12% of a lone target forward
  for (int i = 0; i < 400; ++i) p.ObserveStep(4, i % 5 == 0 ? 2 : 4);  // alpha about 0.85
  const int k1 = p.ChooseKInBatch(cost, 1);
  const int k4 = p.ChooseKInBatch(cost, 4);
  const int k16 = p.ChooseKInBatch(cost, 16);
  const int k64 = p.ChooseKInBatch(cost, 64);
  EXPECT_GE(k1, 3);
  EXPECT_GE(k1, k4);
  EXPECT_GE(k4, k16);
  EXPECT_EQ(k64, 0);
  // Whatever it picks is the argmax of its own model.
  for (int b : {1, 4, 16, 64}) {
    const int k = p.ChooseKInBatch(cost, b);
    for (int j = 0; j <= o.k_max; ++j) {
      EXPECT_GE(p.ExpectedRateInBatch(k, cost, b), p.ExpectedRateInBatch(j, cost, b) - 1e-12);
    }
  }
}

TEST(SpeculationPolicyInBatch, ProbesLessOftenInBigBatches) {
  const BatchCostModel cost = CpuLike(1.0, 0.05);
  SpeculationPolicyOptions o;
  o.probe_interval = 16;
  o.max_probe_interval = 256;
  // Waits of 16, 32, 64, ... choices (doubling up to 256), scaled by the batch size.
  auto probes_at = [&](int batch) {
    SpeculationPolicy p(o);
    p.SeedDraft(0.5);
    for (int i = 0; i < 400; ++i) p.ObserveStep(4, 0);  // alpha near 0
    std::vector<int> at;
    for (int i = 1; i <= 1280; ++i) {
      if (p.ChooseKInBatch(cost, batch) > 0) at.push_back(i);
    }
    return at;
  };
  EXPECT_EQ(probes_at(8), (std::vector<int>{128, 384, 896}));
  EXPECT_EQ(probes_at(1), (std::vector<int>{16, 48, 112, 240, 496, 752, 1008, 1264}));
}

TEST(SpeculationPolicyInBatch, FallsBackToChooseKWithoutBatchCosts) {
  SpeculationPolicy p;
  EXPECT_EQ(p.ChooseKInBatch(BatchCostModel(), 8), p.ChooseK());
}

}  // namespace
}  // namespace specloop
