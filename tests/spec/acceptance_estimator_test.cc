#include "common/spec/acceptance_estimator.h"

#include <random>

#include <gtest/gtest.h>

namespace specloop {
namespace spec {
namespace {

TEST(AcceptanceEstimator, CountsOnlyTestedPositions) {
  AcceptanceEstimator a(/*prior_alpha=*/0.5, /*prior_weight=*/0, /*half_life=*/1e9);
  EXPECT_DOUBLE_EQ(a.alpha(), 0.5);  // the prior while nothing is known
  a.Observe(4, 4);  // 4 successes, no failure
  a.Observe(4, 1);  // 1 success, 1 failure (positions 3 and 4 never tested)
  EXPECT_NEAR(a.alpha(), 5.0 / 6.0, 1e-9);
  a.Observe(0, 0);  // nothing drafted: ignored
  EXPECT_NEAR(a.alpha(), 5.0 / 6.0, 1e-9);
  EXPECT_NEAR(a.weight(), 6.0, 1e-6);
}

TEST(AcceptanceEstimator, PriorWeighsAsTestedTokens) {
  AcceptanceEstimator a(0.6, 8, 1e9);
  EXPECT_DOUBLE_EQ(a.alpha(), 0.6);
  a.Observe(2, 0);  // one failure
  EXPECT_NEAR(a.alpha(), 4.8 / 9.0, 1e-9);
}

TEST(AcceptanceEstimator, ExpectedSuccessesAndRebase) {
  AcceptanceEstimator a(0.0, 0, 1e9);
  a.ObserveExpected(2.5, 4);  // alpha* of a step: 2.5 expected acceptances over 4 positions
  a.ObserveExpected(0.5, 1);
  a.ObserveExpected(1.0, 0);  // no position: ignored
  EXPECT_NEAR(a.alpha(), 3.0 / 5, 1e-9);
  EXPECT_NEAR(a.weight(), 5.0, 1e-6);
  a.Rebase(0.2);  // the level a detector found, at the same weight
  EXPECT_NEAR(a.alpha(), 0.2, 1e-9);
  EXPECT_NEAR(a.weight(), 5.0, 1e-6);
  a.Observe(1, 1);
  EXPECT_NEAR(a.alpha(), 2.0 / 6, 1e-6);
  // Observe(d, a) is ObserveExpected(a, a + (a < d)).
  AcceptanceEstimator b(0.3, 2, 10), c(0.3, 2, 10);
  b.Observe(5, 3);
  c.ObserveExpected(3, 4);
  EXPECT_DOUBLE_EQ(b.alpha(), c.alpha());
}

// Per-token acceptance 0.8 (Bernoulli, fixed seed), blocks of k = 1 and k = 4: the estimate
// reads 0.8 at both, while accepted / drafted reads 0.8 and 0.59 (the companion: a k-dependent
// rate, which this estimator must not be). 4000 steps each; the estimate's standard error is
// about 0.006, so 0.03 is five of them.
TEST(AcceptanceEstimator, DoesNotDependOnTheBlockLength) {
  std::mt19937_64 rng(7);
  std::bernoulli_distribution accept(0.8);
  for (int k : {1, 4}) {
    AcceptanceEstimator a(0.5, 0, 1e9);
    int64_t drafted = 0, accepted = 0;
    for (int step = 0; step < 4000; ++step) {
      int n = 0;
      while (n < k && accept(rng)) ++n;
      a.Observe(k, n);
      drafted += k;
      accepted += n;
    }
    EXPECT_NEAR(a.alpha(), 0.8, 0.03) << "k = " << k;
    const double ratio = double(accepted) / drafted;
    if (k == 4) {
      EXPECT_NEAR(ratio, (0.8 + 0.64 + 0.512 + 0.4096) / 4, 0.03);
    }
  }
}

TEST(AcceptanceEstimator, FollowsChangeWithItsHalfLife) {
  AcceptanceEstimator a(0.5, 0, /*half_life=*/32);
  for (int i = 0; i < 2000; ++i) a.Observe(1, 0);  // alpha 0
  for (int i = 0; i < 32; ++i) a.Observe(1, 1);    // alpha 1 for one half-life
  EXPECT_NEAR(a.alpha(), 0.5, 0.01);
}

}  // namespace
}  // namespace spec
}  // namespace specloop
