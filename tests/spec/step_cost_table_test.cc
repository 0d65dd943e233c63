#include "common/spec/step_cost_table.h"

#include <gtest/gtest.h>

namespace specloop {
namespace {

TEST(StepCostTable, InterpolatesBetweenMeasuredSizesFlatBelowProportionalBeyond) {
  StepCostTable t;
  EXPECT_FALSE(t.ready());
  EXPECT_EQ(t.TargetSeconds(1, 0), 0.0);
  t.ObserveTarget(2, 0, 2.0, true);
  t.ObserveTarget(6, 0, 4.0, true);
  EXPECT_TRUE(t.ready());
  EXPECT_DOUBLE_EQ(t.TargetSeconds(1, 0), 2.0);   // below the smallest measured: flat
  EXPECT_DOUBLE_EQ(t.TargetSeconds(4, 0), 3.0);   // linear between 2 and 6
  EXPECT_DOUBLE_EQ(t.TargetSeconds(12, 0), 8.0);  // beyond the largest: proportional
  // Above 16 the grid steps by 1.5x (24, 36, ...); an observation between grid sizes lands
  // on the nearest, scaled by the curve's own ratio between the two.
  t.ObserveTarget(24, 0, 30.0, true);
  EXPECT_DOUBLE_EQ(t.TargetSeconds(24, 0), 30.0);
  EXPECT_DOUBLE_EQ(t.TargetSeconds(36, 0), 45.0);
  t.ObserveTarget(26, 0, 32.5, true);  // on the curve (30 * 26 / 24): the curve stays
  EXPECT_DOUBLE_EQ(t.TargetSeconds(24, 0), 30.0);
}

// A size whose observations ran slow for a reason of their own (on a 2-core machine serving
// 16 clients, the 15-row forwards that follow a request's end ran 2-4x a 16-row one's time:
// the HTTP and client threads woke beside the two compute threads) is priced at no more than
// a larger size: else the plain step at 15 sequences looked dearer than speculating at 30
// rows, and the batch speculated where it lost.
TEST(StepCostTable, NoSizeCostsMoreThanALargerMeasuredOne) {
  StepCostTable t;
  for (int i = 0; i < 20; ++i) t.ObserveTarget(16, 0, 8.0, true);
  for (int i = 0; i < 20; ++i) t.ObserveTarget(36, 0, 13.0, true);
  t.ObserveTarget(15, 0, 25.0, true);
  EXPECT_DOUBLE_EQ(t.TargetSeconds(15, 0), 8.0);  // capped by 16's
  EXPECT_DOUBLE_EQ(t.TargetSeconds(16, 0), 8.0);
  EXPECT_LT(t.TargetSeconds(24, 0), 13.0);        // between 16 and 36: interpolated
  EXPECT_GT(t.TargetSeconds(24, 0), 8.0);
  // Below every measured size but one slower than a larger one: flat at the cap.
  t.ObserveTarget(4, 0, 30.0, true);
  EXPECT_DOUBLE_EQ(t.TargetSeconds(2, 0), 8.0);
  EXPECT_DOUBLE_EQ(t.TargetSeconds(10, 0), 8.0);  // between 4 and 15: capped too
  // The draft's curve likewise.
  t.ObserveDraft(8, 1.0);
  t.ObserveDraft(4, 3.0);
  EXPECT_DOUBLE_EQ(t.DraftSeconds(4), 1.0);
  EXPECT_DOUBLE_EQ(t.DraftSeconds(6), 1.0);
}

// Only a larger size observed lately caps: one last timed long ago (a calibration's, on an
// idle machine, where a serving one runs slower) is not what the others cost now. With every
// stale time capping, a one-client server's live plain step was priced at an idle 16-row
// forward's time, and a freshly swapped draft was hardly ever tried.
TEST(StepCostTable, OnlyALargerSizeObservedLatelyCaps) {
  StepCostTable t(/*half_life=*/8);
  t.ObserveTarget(16, 0, 3.0, true);  // idle
  for (int i = 0; i < 16; ++i) t.ObserveTarget(1, 0, 4.0, true);  // two half-lives
  EXPECT_DOUBLE_EQ(t.TargetSeconds(1, 0), 3.0);  // 16's time is still recent: it caps
  t.ObserveTarget(1, 0, 4.0, true);
  EXPECT_DOUBLE_EQ(t.TargetSeconds(1, 0), 4.0);  // now it is old: the live time stands
  t.ObserveTarget(16, 0, 3.5, true);             // 16 observed again: it caps again
  EXPECT_LT(t.TargetSeconds(1, 0), 4.0);
}

TEST(StepCostTable, ContextAddsAttentionsSlopePerRowAndCachedToken) {
  StepCostTable t;
  t.set_context_slope(0.001);
  // 3 rows after 100 cached tokens each: 300 row-tokens of attention, 0.3 s of 1.3 s.
  t.ObserveTarget(3, 300, 1.3, true);
  EXPECT_DOUBLE_EQ(t.TargetSeconds(3, 0), 1.0);
  EXPECT_DOUBLE_EQ(t.TargetSeconds(3, 500), 2.5);
}

TEST(StepCostTable, DecayedMeanFollowsChangeWithItsHalfLife) {
  StepCostTable t(/*half_life=*/4);
  for (int i = 0; i < 400; ++i) t.ObserveTarget(2, 0, 1.0, true);
  for (int i = 0; i < 4; ++i) t.ObserveTarget(2, 0, 3.0, true);
  // After one half-life, half the weight: 1 + (3 - 1) / 2.
  EXPECT_NEAR(t.TargetSeconds(2, 0), 2.0, 1e-6);
  // Weights age with observations of any size: 400 steps elsewhere, then one at 2 rows, and
  // that one outweighs the 404 before it by 2^100.
  for (int i = 0; i < 400; ++i) t.ObserveTarget(5, 0, 10.0, true);
  t.ObserveTarget(2, 0, 7.0, true);
  EXPECT_NEAR(t.TargetSeconds(2, 0), 7.0, 1e-6);
}

TEST(StepCostTable, PlainForwardsRightAfterADraftAreNotRecorded) {
  StepCostTable t;
  for (int i = 0; i < 10; ++i) t.ObserveTarget(1, 0, 1.0, false);
  t.ObserveTarget(3, 0, 2.0, true);  // a speculative step
  for (int i = 0; i < StepCostTable::kColdPlainForwards; ++i) {
    t.ObserveTarget(1, 0, 5.0, false);  // cold
  }
  EXPECT_DOUBLE_EQ(t.TargetSeconds(1, 0), 1.0);
  t.ObserveTarget(1, 0, 5.0, false);  // warm again: recorded (so the rule above can fail)
  EXPECT_GT(t.TargetSeconds(1, 0), 1.0);
  // Verification-sized forwards are what they are after a draft: always recorded.
  t.ObserveTarget(3, 0, 4.0, true);
  EXPECT_GT(t.TargetSeconds(3, 0), 2.0);
}

TEST(StepCostTable, DraftByBatchAndCatchUpPerToken) {
  StepCostTable t;
  EXPECT_EQ(t.DraftSeconds(1), 0.0);
  t.ObserveDraft(1, 0.1);
  t.ObserveDraft(8, 0.3);
  EXPECT_NEAR(t.DraftSeconds(4), 0.1 + 0.2 * 3 / 7, 1e-12);
  EXPECT_EQ(t.CatchUpSeconds(10), 0.0);  // none measured
  t.ObserveCatchUp(100, 0.5);
  EXPECT_DOUBLE_EQ(t.CatchUpSeconds(40), 0.2);
  EXPECT_DOUBLE_EQ(t.CatchUpSeconds(1), 0.1);  // at least one draft forward
  EXPECT_EQ(t.CatchUpSeconds(0), 0.0);
}

}  // namespace
}  // namespace specloop
