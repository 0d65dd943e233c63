#include "tests/spec/stat_util.h"

#include <gtest/gtest.h>

#include <cmath>

namespace specloop {
namespace spec_test {
namespace {

TEST(ChiSquareSurvival, MatchesTabulatedQuantiles) {
  // Upper 0.1% and 5% points of chi-square from standard tables.
  EXPECT_NEAR(ChiSquareSurvival(10.828, 1), 1e-3, 2e-6);
  EXPECT_NEAR(ChiSquareSurvival(13.816, 2), 1e-3, 2e-6);
  EXPECT_NEAR(ChiSquareSurvival(20.515, 5), 1e-3, 2e-6);
  EXPECT_NEAR(ChiSquareSurvival(29.588, 10), 1e-3, 2e-6);
  EXPECT_NEAR(ChiSquareSurvival(3.841, 1), 0.05, 2e-5);
  EXPECT_NEAR(ChiSquareSurvival(7.815, 3), 0.05, 2e-5);
  EXPECT_NEAR(ChiSquareSurvival(2.0, 2), std::exp(-1.0), 1e-12);  // df 2 is exponential
  EXPECT_DOUBLE_EQ(ChiSquareSurvival(0.0, 4), 1.0);
}

TEST(GTest, PerfectFitHasZeroStatistic) {
  const GofResult r = GTest({250, 500, 250}, {0.25, 0.5, 0.25});
  EXPECT_NEAR(r.statistic, 0.0, 1e-9);
  EXPECT_EQ(r.df, 2);
  EXPECT_NEAR(r.p_value, 1.0, 1e-9);
}

TEST(GTest, ObservationInZeroProbabilityCellIsImpossible) {
  const GofResult r = GTest({10, 1, 10}, {0.5, 0.0, 0.5});
  EXPECT_TRUE(r.impossible);
  EXPECT_EQ(r.p_value, 0.0);
  // Zero cells with zero counts are simply dropped.
  const GofResult ok = GTest({10, 0, 10}, {0.5, 0.0, 0.5});
  EXPECT_FALSE(ok.impossible);
  EXPECT_EQ(ok.df, 1);
}

TEST(GTest, PoolsSmallCells) {
  // n = 1000: expected 1, 1, 3, 495, 500 -> the three small cells pool into one of 5.
  const GofResult r = GTest({1, 2, 2, 495, 500}, {0.001, 0.001, 0.003, 0.495, 0.5});
  EXPECT_EQ(r.df, 2);
  EXPECT_GT(r.p_value, 0.5);
}

TEST(GTest, DetectsAClearDeviation) {
  const GofResult r = GTest({5200, 4800}, {0.5, 0.5});  // 4 sigma
  EXPECT_LT(r.p_value, kSignificance);
  const GofResult fine = GTest({5050, 4950}, {0.5, 0.5});  // 1 sigma
  EXPECT_GT(fine.p_value, 0.1);
}

}  // namespace
}  // namespace spec_test
}  // namespace specloop
