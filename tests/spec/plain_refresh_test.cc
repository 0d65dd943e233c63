// SpeculationPolicy's plain refresh (SpeculationPolicyOptions::plain_refresh_steps): a batch
// that speculates keeps the plain step's cost measured, so that a stale plain cost (a start-up
// outlier) cannot hold it in speculation. Simulated steps over a known cost curve.
#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "common/spec/speculation_policy.h"
#include "common/spec/step_cost_table.h"

namespace specloop {
namespace {

// target-wide-46m float32 at 16 sequences on this project's 2-core CPU, as serve_bench's fixed-k
// arms measured it (issue 48): past 16 rows a forward is its arithmetic, ~1.07 ms a row.
double Bound(int rows) { return 0.0055 + 0.00107 * rows; }
// A memory-bound target: every forward up to 64 rows costs the weights' read.
double Flat(int rows) { return rows <= 64 ? 0.02 : 0.02 * rows / 64; }
constexpr double kDraft16 = 0.0012;  // one batched draft forward over 16 sequences

SpeculationPolicyOptions NoProbes() {
  SpeculationPolicyOptions o;
  o.probe_share = 0;             // no probes
  o.explore_interval = 1000000;  // nor neighbouring lengths
  return o;
}

// alpha near 0.65 (draft-mix-1m on target-wide-46m at temperature 0.8 read 0.59-0.70 in
// serve_bench): of 20 steps of two drafts, 8 accept both, 6 one, 6 none (22 of 34 tested).
void Train(SpeculationPolicy* p) {
  for (int s = 0; s < 400; ++s) p->ObserveStep(2, s % 20 < 8 ? 2 : s % 20 < 14 ? 1 : 0);
  ASSERT_NEAR(p->alpha(), 0.65, 0.05);
}

// A start-up calibration of `cost`, except that the 16-row forward read `outlier` seconds.
StepCostTable Calibrated(const std::function<double(int)>& cost, double outlier) {
  StepCostTable t;
  for (int rows : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 24, 36, 54, 81, 121}) {
    t.ObserveTarget(rows, 0, rows == 16 ? outlier : cost(rows), true);
  }
  t.ObserveDraft(16, kDraft16);
  return t;
}

// Runs `steps` decoding steps of `batch` sequences sharing one policy as DecodeStep does (a
// step the table says is due for a plain refresh decodes plainly; else each sequence chooses
// its k; the step's forward covers every row), observing `cost`; returns each step's rows.
std::vector<int> Simulate(SpeculationPolicy* p, StepCostTable* t,
                          const std::function<double(int)>& cost, int batch, int steps) {
  std::vector<int> rows_of;
  for (int s = 0; s < steps; ++s) {
    const bool refresh = t->PlainRefreshDue(batch, 0, p->options().plain_refresh_steps);
    if (refresh) t->MarkPlainRefresh();
    int rows = 0, longest = 0;
    for (int i = 0; i < batch; ++i) {
      const int k = refresh ? 0 : p->ChooseK(*t, batch);
      rows += k + 1;
      longest = std::max(longest, k);
    }
    t->ObserveTarget(rows, 0, cost(rows), longest > 0);
    if (longest > 0) t->ObserveDraft(batch, kDraft16);
    rows_of.push_back(rows);
  }
  return rows_of;
}

TEST(PlainRefresh, StalePlainOutlierNoLongerHoldsABatchInSpeculation) {
  // The 16-row forward calibrated at 7x its cost: every speculation length looks better.
  StepCostTable t = Calibrated(Bound, 7 * Bound(16));
  SpeculationPolicy p(NoProbes());
  Train(&p);
  ASSERT_GT(p.ChooseK(t, 16), 0);  // the outlier's choice
  // Plain decoding is in truth ~10% faster than k = 1 here (alpha 0.65: 1.65 tokens for
  // 1.8x the seconds).
  ASSERT_GT(1 / Bound(16), 1.65 / (Bound(32) + kDraft16));
  const std::vector<int> rows = Simulate(&p, &t, Bound, 16, 500);
  int plain = 0;
  for (size_t s = 300; s < rows.size(); ++s) plain += rows[s] == 16;
  // Once the plain step is measured again the batch decodes plainly (the old rule never took
  // a plain step amid speculation, so the outlier held: 0 of these 200).
  EXPECT_GE(plain, 195);
  EXPECT_EQ(p.ChooseK(t, 16), 0);
}

TEST(PlainRefresh, CostsAtMostOnePlainStepPerIntervalWhereSpeculationPays) {
  // Memory-bound: speculation's rows ride free. The refresh's plain steps are all it pays.
  StepCostTable t = Calibrated(Flat, Flat(16));
  SpeculationPolicyOptions o = NoProbes();
  SpeculationPolicy p(o);
  Train(&p);
  const std::vector<int> rows = Simulate(&p, &t, Flat, 16, 640);
  int plain = 0;
  for (int r : rows) plain += r == 16;
  EXPECT_GE(plain, 1);                             // refreshed ...
  EXPECT_LE(plain, 640 / o.plain_refresh_steps + 1);  // ... at most once an interval
  EXPECT_GT(p.ChooseK(t, 16), 0);
}

TEST(PlainRefresh, OffOrOneSequenceNeverRefreshes) {
  for (const int batch : {1, 16}) {
    StepCostTable t = Calibrated(Bound, 7 * Bound(16));
    SpeculationPolicyOptions o = NoProbes();
    if (batch == 16) o.plain_refresh_steps = 0;  // turned off
    SpeculationPolicy p(o);
    Train(&p);
    const std::vector<int> rows = Simulate(&p, &t, Bound, batch, 300);
    for (int r : rows) EXPECT_GT(r, batch) << "batch " << batch;
  }
}

TEST(PlainRefresh, TargetAgeCountsForwardsSinceASizesLastObservation) {
  StepCostTable t;
  EXPECT_EQ(t.TargetAge(16), 0);
  t.ObserveTarget(16, 0, 0.02, true);
  t.ObserveTarget(32, 0, 0.04, true);
  t.ObserveTarget(33, 0, 0.041, true);  // counts at 36, as 32 does
  EXPECT_EQ(t.TargetObservations(), 3);
  EXPECT_EQ(t.TargetAge(16), 2);
  EXPECT_EQ(t.TargetAge(32), 0);
  EXPECT_EQ(t.TargetAge(17), 2);   // 17 counts at 16
  EXPECT_EQ(t.TargetAge(100), 3);  // never observed: as old as every observation
  t.ObserveTarget(1, 0, 0.01, false);  // a cold one-row forward: not recorded, not counted
  EXPECT_EQ(t.TargetObservations(), 3);
}

TEST(PlainRefresh, DueOnceAnIntervalEvenWhereTheRefreshDidNotMeasureIt) {
  StepCostTable t;
  EXPECT_FALSE(t.PlainRefreshDue(16, 0, 4));  // nothing known yet
  t.ObserveTarget(16, 0, 0.02, true);
  for (int i = 0; i < 4; ++i) t.ObserveTarget(32, 0, 0.04, true);
  EXPECT_FALSE(t.PlainRefreshDue(16, 0, 4));  // 4 forwards old: not more than 4
  t.ObserveTarget(32, 0, 0.04, true);
  EXPECT_TRUE(t.PlainRefreshDue(16, 0, 4));
  EXPECT_FALSE(t.PlainRefreshDue(16, 0, 0));  // off
  EXPECT_FALSE(t.PlainRefreshDue(1, 15, 4));  // one sequence (and its chunk): never
  EXPECT_TRUE(t.PlainRefreshDue(10, 6, 4));   // 10 sequences and a 6-row chunk: 16 rows
  t.MarkPlainRefresh();
  // The refresh step's forward came out at another size (say a chunk was cut): not due again
  // until an interval has passed, then due while the size stays unmeasured.
  for (int i = 0; i < 4; ++i) {
    t.ObserveTarget(32, 0, 0.04, true);
    EXPECT_FALSE(t.PlainRefreshDue(16, 0, 4)) << i;
  }
  t.ObserveTarget(32, 0, 0.04, true);
  EXPECT_TRUE(t.PlainRefreshDue(16, 0, 4));
  t.ObserveTarget(16, 0, 0.02, true);  // measured: no longer due
  EXPECT_FALSE(t.PlainRefreshDue(16, 0, 4));
}

}  // namespace
}  // namespace specloop
