#include "common/spec/acceptance.h"

#include <algorithm>
#include <cmath>


namespace specloop {
namespace spec {

// Two passes and no allocation: the decoder calls it on every tested position (alpha*).
double AcceptanceRate(const float* p, const float* q, int vocab) {
  double sp = 0.0, sq = 0.0;
  for (int i = 0; i < vocab; ++i) {
    const double a = p[i], b = q[i];
    if (!(a >= 0.0) || !(b >= 0.0) || !std::isfinite(a) || !std::isfinite(b)) return 0.0;
    sp += a;
    sq += b;
  }
  if (!(sp > 0.0) || !(sq > 0.0)) return 0.0;
  double overlap = 0.0;
  for (int i = 0; i < vocab; ++i) overlap += std::min(p[i] / sp, q[i] / sq);
  return overlap;
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
