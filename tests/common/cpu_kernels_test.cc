#include "common/kernels/cpu_kernels.h"

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

TEST(ExpBelowInPlace, EveryTermAndTheSumMatchDoublePrecision) {
  std::mt19937 gen(11);
  std::uniform_real_distribution<float> u(-100.0f, 3.0f);
  for (int n : {1, 7, 8, 9, 300, 1027}) {
    std::vector<float> x(n);
    for (float& v : x) v = u(gen);
    const float shift = *std::max_element(x.begin(), x.end());
    std::vector<float> y = x;
    const float sum = ExpBelowInPlace(y.data(), n, shift);
    double want_sum = 0;
    for (int i = 0; i < n; ++i) {
      // Of the float difference, as the kernel takes it (its rounding is the caller's).
      const double want = std::exp(static_cast<double>(x[i] - shift));
      want_sum += want;
      // Terms below e^-87 count as e^-87 (negligible beside the max's 1).
      if (x[i] - shift > -87.0f) EXPECT_NEAR(y[i] / want, 1.0, 3e-7) << "n = " << n;
    }
    EXPECT_NEAR(sum / want_sum, 1.0, 1e-6) << "n = " << n;
  }
}

TEST(SiluMul, MatchesDoublePrecisionOverTheWholeRange) {
  std::vector<float> gate, up;
  for (float g = -120.0f; g <= 120.0f; g += 0.0371f) {
    gate.push_back(g);
    up.push_back(0.5f + (gate.size() % 7) * 0.25f);
  }
  std::vector<float> out(gate.size());
  SiluMul(gate.data(), up.data(), out.data(), gate.size());
  for (size_t i = 0; i < gate.size(); ++i) {
    const double g = gate[i];
    const double want = g / (1.0 + std::exp(-g)) * up[i];
    EXPECT_NEAR(out[i], want, 2e-6 * std::abs(want) + 1e-30) << "gate = " << gate[i];
  }
}

}  // namespace
}  // namespace specloop
