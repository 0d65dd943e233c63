// The batch side of SpeculationPolicy (common/spec/speculation_policy.h) over a StepCostTable: it
// must turn speculation down and off as the batch grows, and probe less often in big batches.
#include <gtest/gtest.h>

#include "common/spec/speculation_policy.h"
#include "common/spec/step_cost_table.h"

namespace specloop {
namespace {

// A CPU-like cost: a fixed overhead per forward plus a cost per row, so that a lone sequence
// pays mostly overhead (speculation is cheap) and a big batch pays mostly rows. The draft's
// batched forward likewise, at 12% of a lone target forward.
StepCostTable CpuLike(double overhead, double per_row) {
  StepCostTable t;
  for (int rows : {1, 2, 3, 4, 5, 8, 9, 16, 24, 36, 54, 81, 121, 181, 271, 406, 609}) {
    t.ObserveTarget(rows, 0, overhead + per_row * rows, true);
  }
  for (int b : {1, 2, 4, 8, 16, 64}) t.ObserveDraft(b, 0.12 * overhead + 0.01 * b);
  return t;
}

TEST(SpeculationPolicyInBatch, TurnsSpeculationDownThenOffAsTheBatchGrows) {
  const StepCostTable costs = CpuLike(1.0, 0.05);
  SpeculationPolicyOptions o;
  o.probe_share = 0;              // no probes in this test
  o.explore_interval = 1000000;  // nor exploration
  // Each batch size on a fresh policy (no hysteresis from the one before); alpha 6 / 7.
  auto choose = [&](int b) {
    SpeculationPolicy q(o);
    for (int s = 0; s < 400; ++s) q.ObserveStep(4, s % 2 == 0 ? 2 : 4);
    const int k = q.ChooseK(costs, b);
    // Whatever it picks is the argmax of its own rates.
    for (int j = 0; j <= o.k_max; ++j) {
      EXPECT_GE(q.ExpectedRate(costs, k, b), q.ExpectedRate(costs, j, b) - 1e-12);
    }
    return k;
  };
  const int k1 = choose(1), k4 = choose(4), k16 = choose(16), k64 = choose(64);
  EXPECT_GE(k1, 3);
  EXPECT_GE(k1, k4);
  EXPECT_GE(k4, k16);
  EXPECT_EQ(k64, 0);
}

// A probe delays the whole batch, and each sequence counts only its share of a plain step
// towards the next: in a batch of 8 a domain's sequences together probe about as often per
// second of plain decoding as a lone sequence does, so per choice several times less often.
TEST(SpeculationPolicyInBatch, ProbesLessOftenInBigBatches) {
  const StepCostTable costs = CpuLike(1.0, 0.05);
  auto probes = [&](int batch) {
    SpeculationPolicy p;
    for (int i = 0; i < 400; ++i) p.ObserveStep(4, 0);  // alpha near 0
    int n = 0;
    for (int i = 0; i < 20000; ++i) n += p.ChooseK(costs, batch) > 0;
    return n;
  };
  const int alone = probes(1), in8 = probes(8);
  EXPECT_GT(in8, 0);
  EXPECT_GT(alone, 4 * in8);
}

}  // namespace
}  // namespace specloop
