#include "common/speculation_policy.h"

#include "common/spec/acceptance.h"

#include <gtest/gtest.h>

namespace specloop {
namespace {

// A policy whose costs are known exactly: target a + b * n, draft d per token.
SpeculationPolicy Seeded(double a, double b, double d, int k_max = 8) {
  SpeculationPolicyOptions o;
  o.k_max = k_max;
  SpeculationPolicy p(o);
  for (int n = 1; n <= k_max + 1; ++n) p.SeedTarget(n, a + b * n);
  p.SeedDraft(d);
  return p;
}

// Feeds `steps` single-token steps whose successes follow a deterministic sequence with
// long-run rate alpha (floor((s + 1) alpha) - floor(s alpha)).
void Observe(SpeculationPolicy* p, double alpha, int steps) {
  for (int s = 0; s < steps; ++s) {
    const int success = static_cast<int>((s + 1) * alpha) - static_cast<int>(s * alpha);
    p->ObserveStep(1, success);
  }
}

TEST(SpeculationPolicy, ExpectedTokensPerStep) {
  EXPECT_DOUBLE_EQ(spec::ExpectedTokensPerStep(0.5, 0), 1.0);
  EXPECT_DOUBLE_EQ(spec::ExpectedTokensPerStep(0.5, 1), 1.5);
  EXPECT_DOUBLE_EQ(spec::ExpectedTokensPerStep(0.5, 3), 1.875);
  EXPECT_DOUBLE_EQ(spec::ExpectedTokensPerStep(1.0, 4), 5.0);
  EXPECT_DOUBLE_EQ(spec::ExpectedTokensPerStep(0.0, 4), 1.0);
}

TEST(SpeculationPolicy, ChoosesTheArgmaxOfTheCostModel) {
  // Cheap draft, flat verification cost, high acceptance: long blocks pay.
  SpeculationPolicy p = Seeded(1.0, 0.0, 0.02);
  Observe(&p, 0.9, 200);
  int brute = 0;
  for (int k = 1; k <= 8; ++k) {
    if (p.ExpectedRate(k) > p.ExpectedRate(brute)) brute = k;
  }
  EXPECT_EQ(p.ChooseK(), brute);
  EXPECT_GE(brute, 6);
  EXPECT_NEAR(p.alpha(), 0.9, 0.02);
}

TEST(SpeculationPolicy, TurnsSpeculationOffWhereItDoesNotPay) {
  // Verification cost grows with positions (as at large batch sizes) and acceptance is low.
  SpeculationPolicy p = Seeded(0.2, 1.0, 0.3);
  Observe(&p, 0.3, 200);
  EXPECT_EQ(p.ChooseK(), 0);
  // But it keeps probing, so acceptance stays measured: after 16 choices of 0, then 32, 64,
  // ... up to every 256 (the first ChooseK above was choice 1 of the first wait).
  std::vector<int> probe_at;
  for (int i = 2; i <= 1300; ++i) {
    if (p.ChooseK() > 0) probe_at.push_back(i);
  }
  EXPECT_EQ(probe_at, (std::vector<int>{16, 48, 112, 240, 496, 752, 1008, 1264}));
}

TEST(SpeculationPolicy, AcceptanceEstimateFollowsChange) {
  SpeculationPolicy p = Seeded(1.0, 0.05, 0.05);
  Observe(&p, 0.2, 300);
  const int low = p.ChooseK();
  Observe(&p, 0.9, 300);
  const int high = p.ChooseK();
  EXPECT_LT(low, high);
  EXPECT_NEAR(p.alpha(), 0.9, 0.03);
}

TEST(SpeculationPolicy, GeometricEstimateCountsOnlyTestedPositions) {
  SpeculationPolicyOptions o;
  o.prior_weight = 0;
  o.half_life_steps = 1e12;  // no forgetting: exact counts
  SpeculationPolicy p(o);
  p.ObserveStep(4, 4);  // 4 successes, no failure
  p.ObserveStep(4, 1);  // 1 success, 1 failure (positions 3 and 4 never tested)
  EXPECT_NEAR(p.alpha(), 5.0 / 6.0, 1e-9);
}

TEST(SpeculationPolicy, InterpolatesUnmeasuredSizes) {
  SpeculationPolicyOptions o;
  o.k_max = 4;
  SpeculationPolicy p(o);
  EXPECT_EQ(p.target_seconds(3), 0.0);
  EXPECT_EQ(p.ChooseK(), 2);  // nothing measured: k_max / 2
  p.SeedTarget(1, 1.0);
  p.SeedTarget(5, 3.0);
  EXPECT_DOUBLE_EQ(p.target_seconds(3), 2.0);
  EXPECT_DOUBLE_EQ(p.target_seconds(9), 3.0);  // flat beyond the largest measured size
  p.ObserveTarget(3, 4.0);
  EXPECT_DOUBLE_EQ(p.target_seconds(3), 4.0);  // the first observation replaces interpolation
}

}  // namespace
}  // namespace specloop

namespace specloop {
namespace {

TEST(SpeculationPolicy, RealizedRatesOverruleAnOptimisticModel) {
  // The model (cheap draft, flat verification, alpha 0.9) says long blocks pay...
  SpeculationPolicy p = Seeded(1.0, 0.0, 0.02);
  for (int i = 0; i < 200; ++i) p.ObserveStep(1, i % 10 != 0);
  const int model_choice = p.ChooseK();
  ASSERT_GE(model_choice, 4);
  // ... but steps at that length realize 1 token per 4 seconds (a slow machine, overheads).
  for (int i = 0; i < 8; ++i) p.ObserveRealized(model_choice, 1, 4.0);
  EXPECT_NEAR(p.RealizedRate(model_choice), 0.25, 1e-9);
  EXPECT_NE(p.ChooseK(), model_choice);
  // Every length realized below plain decoding's modelled 1 token/s: speculation goes off.
  for (int k = 1; k <= 8; ++k) {
    for (int i = 0; i < 8; ++i) p.ObserveRealized(k, 2, 4.0);
  }
  EXPECT_EQ(p.ChooseK(), 0);
  // Too few steps are not trusted.
  SpeculationPolicy q = Seeded(1.0, 0.0, 0.02);
  for (int i = 0; i < 7; ++i) q.ObserveRealized(3, 1, 4.0);
  EXPECT_LT(q.RealizedRate(3), 0);
}

}  // namespace
}  // namespace specloop
