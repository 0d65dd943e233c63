#include "common/spec/acceptance.h"

#include <cmath>

#include "common/spec/distribution.h"

namespace specloop {
namespace spec {

double AcceptanceRate(const float* p, const float* q, int vocab) {
  std::vector<double> pd, qd;
  if (NormalizedCopy(p, vocab, &pd) <= 0.0 || NormalizedCopy(q, vocab, &qd) <= 0.0) return 0.0;
  return OverlapMass(pd.data(), qd.data(), vocab);
}

void AcceptedCountDistribution(const std::vector<double>& alphas, std::vector<double>* dist) {
  const int k = static_cast<int>(alphas.size());
  dist->assign(k + 1, 0.0);
  double reach = 1.0;  // P(N >= j)
  for (int j = 0; j < k; ++j) {
    (*dist)[j] = reach * (1.0 - alphas[j]);
    reach *= alphas[j];
  }
  (*dist)[k] = reach;
}

double ExpectedTokensPerStep(double alpha, int k) {
  if (alpha >= 1.0) return k + 1.0;
  return (1.0 - std::pow(alpha, k + 1)) / (1.0 - alpha);
}

}  // namespace spec
}  // namespace specloop
