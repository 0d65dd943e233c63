#include "common/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace specloop {
namespace {

// Against a double-precision sum, over lengths around the 8-lane width and values from 0 down
// past the clamp at -87; one test per property so a failure names it.
TEST(SumExpBelow, MatchesDoubleSumWithinFloatError) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> u(-100.0f, 0.0f);
  for (int n : {1, 7, 8, 9, 63, 4096, 4101}) {
    std::vector<float> x(n);
    for (float& v : x) v = u(gen);
    x[n / 2] = 0.5f;  // the max
    double want = 0;
    for (float v : x) want += std::exp(static_cast<double>(v) - 0.5);
    const double got = SumExpBelow(x.data(), n, 0.5f);
    EXPECT_NEAR(got / want, 1.0, 1e-6) << "n = " << n;
  }
}

TEST(SumExpBelow, EveryTermIsExactToAFewUlps) {
  // One term at a time: a wrong polynomial coefficient or exponent shift shows at some x.
  for (float x = -86.9f; x <= 0.0f; x += 0.0137f) {
    const double want = std::exp(static_cast<double>(x));
    EXPECT_NEAR(SumExpBelow(&x, 1, 0.0f) / want, 1.0, 3e-7) << "x = " << x;
  }
}

TEST(SumExpBelow, NegligibleTermsStayNegligible) {
  const std::vector<float> x = {0.0f, -1e30f, -INFINITY, -200.0f};
  EXPECT_NEAR(SumExpBelow(x.data(), 4, 0.0f), 1.0, 1e-6);
}

}  // namespace
}  // namespace specloop
