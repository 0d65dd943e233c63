// Small helpers over discrete distributions, shared by the verifiers in common/spec.
//
// Verifiers take float rows (the processed distributions of common/base/sampling.h) and work in
// double internally, so that residuals of residuals (recursive rejection sampling) do not
// accumulate float rounding. Rows need not sum exactly to 1: they are normalized first.
#pragma once

#include <vector>

#include "common/base/rng.h"

namespace specloop {
namespace spec {

// Copies probs[0..vocab) into *out as doubles, scaled to sum 1, and returns the sum before
// scaling. Returns 0 (leaving *out all zero) when the row has no positive mass or holds a
// negative or non-finite entry: callers treat 0 as an invalid row.
//   probs: [vocab]
double NormalizedCopy(const float* probs, int vocab, std::vector<double>* out);

// Scales *dist to sum 1 and returns the sum before scaling; a zero sum leaves it unchanged.
double Normalize(std::vector<double>* dist);

// out[x] = max(0, p[x] - q[x]) (not normalized); returns its sum, which for normalized p and q
// equals 1 - OverlapMass(p, q) = TVD(p, q).
//   p, q: [vocab]; *out resized to [vocab]
double PositivePart(const double* p, const double* q, int vocab, std::vector<double>* out);

// sum_x min(p[x], q[x]).
//   p, q: [vocab]
double OverlapMass(const double* p, const double* q, int vocab);

// Draws x with probability dist[x] / sum(dist) using exactly one rng->Uniform(). Entries <= 0
// are never drawn. REQUIRES: sum(dist) > 0.
//   dist: [vocab]
int SampleIndex(const double* dist, int vocab, Rng* rng);

}  // namespace spec
}  // namespace specloop
