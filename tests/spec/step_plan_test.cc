// Pricing a whole batched step (StepCostTable::StepSeconds) and the policy's rate over it,
// prompt chunks included: pure math over known costs.
#include <gtest/gtest.h>

#include "common/spec/acceptance.h"
#include "common/spec/speculation_policy.h"
#include "common/spec/step_cost_table.h"

namespace specloop {
namespace {

// A roofline target: a forward of R rows reads the weights once (1 s) until its arithmetic,
// 0.1 s a row, takes longer (from 10 rows on). A batched draft forward over b sequences
// 0.05 + 0.002 b.
StepCostTable Roofline() {
  StepCostTable t;
  for (int rows : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 24, 36, 54, 81, 121}) {
    t.ObserveTarget(rows, 0, std::max(1.0, 0.1 * rows), true);
  }
  for (int b : {1, 2, 4, 8, 16, 24}) t.ObserveDraft(b, 0.05 + 0.002 * b);
  return t;
}

SpeculationPolicyOptions Quiet() {
  SpeculationPolicyOptions o;
  o.probe_share = 0;             // no probes
  o.explore_interval = 1000000;  // nor exploration
  return o;
}

// alpha near 6 / 7 (a strong draft).
void Train(SpeculationPolicy* p) {
  for (int s = 0; s < 400; ++s) p->ObserveStep(4, s % 2 == 0 ? 2 : 4);
}

TEST(StepSeconds, DraftsRowsChunksAndAttention) {
  StepCostTable t = Roofline();
  StepCostTable::Step s;
  EXPECT_EQ(t.StepSeconds(s), 0.0);  // no rows
  s.rows = 12;
  EXPECT_EQ(StepCostTable().StepSeconds(s), 0.0);  // nothing measured
  EXPECT_NEAR(t.StepSeconds(s), 1.2, 1e-12);
  s.draft_forwards = 3;
  s.drafting = 4;
  EXPECT_NEAR(t.StepSeconds(s), 1.2 + 3 * (0.05 + 0.008), 1e-12);
  s.other_draft_seconds = 0.25;
  EXPECT_NEAR(t.StepSeconds(s), 1.2 + 3 * 0.058 + 0.25, 1e-12);
  // Prompt chunks move the rows up the curve; the rows pay their share of the forward.
  StepCostTable::Step c;
  c.rows = 4;
  EXPECT_NEAR(t.StepSeconds(c), 1.0, 1e-12);  // alone: the weights' read
  c.chunk_rows = 20;
  EXPECT_NEAR(t.StepSeconds(c), t.TargetSeconds(24, 0) * 4 / 24, 1e-12);
  EXPECT_NEAR(t.StepSeconds(c), 0.4, 1e-12);  // past the roofline: each row its arithmetic
  // Attention at the calibrated slope over the rows' attended tokens.
  t.set_context_slope(0.001);
  c.chunk_rows = 0;
  c.attended = 4 * 300.0;
  EXPECT_NEAR(t.StepSeconds(c), 1.0 + 1.2, 1e-12);
}

// Without chunks the policy's rate is the documented rule, over TargetSeconds and
// DraftSeconds.
TEST(StepSeconds, WithoutChunksTheRateIsTheRule) {
  StepCostTable costs = Roofline();
  costs.set_context_slope(1e-4);
  SpeculationPolicy p(Quiet());
  Train(&p);
  for (int b : {1, 3, 16}) {
    for (int k = 0; k <= 8; ++k) {
      const double seconds = (k > 0 ? k * costs.DraftSeconds(b) : 0.0) +
                             costs.TargetSeconds(b * (k + 1), 200);
      EXPECT_NEAR(p.ExpectedRate(costs, k, b, 200),
                  spec::ExpectedTokensPerStep(p.alpha(), k) / seconds, 1e-9);
    }
  }
}

// A block that pays beside the decoding rows alone does not where a long prompt chunk rides
// in the same forward: there each of its rows costs its arithmetic.
TEST(StepSeconds, ChunksInTheForwardTurnSpeculationDown) {
  const StepCostTable costs = Roofline();
  SpeculationPolicy a(Quiet()), b(Quiet());
  Train(&a);
  Train(&b);
  const int alone = a.ChooseK(costs, 2, 0);
  const int beside_chunk = b.ChooseK(costs, 2, 0, 0, 0, /*chunk_rows=*/60);
  EXPECT_GE(alone, 2);
  EXPECT_EQ(beside_chunk, 0);
  for (int k = 0; k <= 8; ++k) {  // its choice is the argmax of its own rates
    EXPECT_GE(b.ExpectedRate(costs, beside_chunk, 2, 0, 60),
              b.ExpectedRate(costs, k, 2, 0, 60) - 1e-12);
  }
}

}  // namespace
}  // namespace specloop
