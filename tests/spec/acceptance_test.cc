#include "common/spec/acceptance.h"

#include <gtest/gtest.h>

#include <vector>

namespace specloop {
namespace spec {
namespace {

TEST(AcceptanceRate, IsOverlapMass) {
  const std::vector<float> p = {0.5f, 0.3f, 0.2f, 0.0f};
  const std::vector<float> q = {0.1f, 0.3f, 0.4f, 0.2f};
  EXPECT_NEAR(AcceptanceRate(p.data(), q.data(), 4), 0.1 + 0.3 + 0.2, 1e-6);
  EXPECT_NEAR(AcceptanceRate(p.data(), p.data(), 4), 1.0, 1e-6);
  const std::vector<float> disjoint = {0.0f, 0.0f, 0.0f, 1.0f};
  EXPECT_NEAR(AcceptanceRate(p.data(), disjoint.data(), 4), 0.0, 1e-9);
  // Rows are normalized first.
  const std::vector<float> q2 = {2.0f, 6.0f, 8.0f, 4.0f};
  EXPECT_NEAR(AcceptanceRate(p.data(), q2.data(), 4), 0.6, 1e-6);
  const std::vector<float> zero = {0.0f, 0.0f, 0.0f, 0.0f};
  EXPECT_EQ(AcceptanceRate(p.data(), zero.data(), 4), 0.0);
}

TEST(AcceptedCountDistribution, ProductOfAlphas) {
  std::vector<double> dist;
  AcceptedCountDistribution({0.5, 0.8, 0.25}, &dist);
  ASSERT_EQ(dist.size(), 4u);
  EXPECT_NEAR(dist[0], 0.5, 1e-12);
  EXPECT_NEAR(dist[1], 0.5 * 0.2, 1e-12);
  EXPECT_NEAR(dist[2], 0.4 * 0.75, 1e-12);
  EXPECT_NEAR(dist[3], 0.4 * 0.25, 1e-12);
  AcceptedCountDistribution({}, &dist);
  ASSERT_EQ(dist.size(), 1u);
  EXPECT_EQ(dist[0], 1.0);
}

TEST(ExpectedTokensPerStep, MatchesMeanOfAcceptedCountPlusOne) {
  for (double alpha : {0.0, 0.3, 0.7, 0.95, 1.0}) {
    for (int k = 0; k <= 6; ++k) {
      std::vector<double> dist;
      AcceptedCountDistribution(std::vector<double>(k, alpha), &dist);
      double mean = 0.0;
      for (int j = 0; j <= k; ++j) mean += (j + 1) * dist[j];
      EXPECT_NEAR(ExpectedTokensPerStep(alpha, k), mean, 1e-12) << alpha << " " << k;
    }
  }
}

}  // namespace
}  // namespace spec
}  // namespace specloop
