#include "common/spec/distribution.h"

#include <algorithm>
#include <cmath>

namespace specloop {
namespace spec {

double NormalizedCopy(const float* probs, int vocab, std::vector<double>* out) {
  out->assign(vocab, 0.0);
  double sum = 0.0;
  for (int i = 0; i < vocab; ++i) {
    const double v = probs[i];
    if (!(v >= 0.0) || !std::isfinite(v)) {
      out->assign(vocab, 0.0);
      return 0.0;
    }
    (*out)[i] = v;
    sum += v;
  }
  if (!(sum > 0.0)) return 0.0;
  for (double& v : *out) v /= sum;
  return sum;
}

double Normalize(std::vector<double>* dist) {
  double sum = 0.0;
  for (double v : *dist) sum += v;
  if (sum > 0.0) {
    for (double& v : *dist) v /= sum;
  }
  return sum;
}

double PositivePart(const double* p, const double* q, int vocab, std::vector<double>* out) {
  out->resize(vocab);
  double sum = 0.0;
  for (int i = 0; i < vocab; ++i) {
    const double d = p[i] - q[i];
    (*out)[i] = d > 0.0 ? d : 0.0;
    sum += (*out)[i];
  }
  return sum;
}

double OverlapMass(const double* p, const double* q, int vocab) {
  double sum = 0.0;
  for (int i = 0; i < vocab; ++i) sum += std::min(p[i], q[i]);
  return sum;
}

int SampleIndex(const double* dist, int vocab, Rng* rng) {
  double total = 0.0;
  for (int i = 0; i < vocab; ++i) {
    if (dist[i] > 0.0) total += dist[i];
  }
  const double u = rng->Uniform() * total;
  double cum = 0.0;
  int last = -1;
  for (int i = 0; i < vocab; ++i) {
    if (!(dist[i] > 0.0)) continue;
    cum += dist[i];
    last = i;
    if (u < cum) return i;
  }
  return last;  // rounding left u just above the final sum
}

}  // namespace spec
}  // namespace specloop
