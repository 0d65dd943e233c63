// Goodness-of-fit helpers for the statistical exactness tests of common/spec.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace specloop {
namespace spec_test {

// Every exactness test in tests/spec rejects at this significance level: a correct verifier
// fails a given (fixed-seed) test with probability 1e-3, and each deliberately wrong verifier
// must be rejected at the same level by the same statistic.
constexpr double kSignificance = 1e-3;

struct GofResult {
  double statistic = 0.0;  // G = 2 sum O ln(O / E) over the pooled cells
  int df = 0;              // pooled cells - 1
  double p_value = 1.0;    // P(chi2_df >= G); 0 when `impossible`
  bool impossible = false; // a cell of probability 0 was observed
  std::string ToString() const;
};

// G-test of observed counts against cell probabilities (normalized here). Cells of probability
// 0 are dropped (any count in them makes the result `impossible`). Cells whose expected count is
// below min_expected are pooled, smallest first, into one cell until the pool's expected count
// reaches min_expected (if the pool still falls short it absorbs the next smallest cell). With
// fewer than two cells left there is nothing to test (p_value 1).
//   observed, probs: [cells]
GofResult GTest(const std::vector<int64_t>& observed, const std::vector<double>& probs,
                double min_expected = 5.0);

// P(chi2_df >= x), the upper tail of the chi-square distribution (regularized upper incomplete
// gamma Q(df/2, x/2)).
double ChiSquareSurvival(double x, int df);

}  // namespace spec_test
}  // namespace specloop
