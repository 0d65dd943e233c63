// Acceptance rates of chain speculative decoding (DESIGN.md section 4).
//
// With target p and draft q at one position (both processed: temperature, top-k, top-p), a
// chain verifier accepts the draft token with probability
//   alpha = sum_x min(p(x), q(x)) = 1 - TVD(p, q).
// Over k positions with acceptance rates alpha_1..alpha_k the number of accepted tokens N
// satisfies P(N >= j) = alpha_1 * ... * alpha_j, and every step emits N + 1 tokens. With equal
// alphas, E[N + 1] = tau = (1 - alpha^(k+1)) / (1 - alpha).
#pragma once

#include <vector>

namespace specloop {
namespace spec {

// alpha = sum_x min(p(x), q(x)) after normalizing both rows. Returns 0 when either row has no
// positive mass.
//   p, q: [vocab]
double AcceptanceRate(const float* p, const float* q, int vocab);

// The exact law of the accepted count N of a chain of k = alphas.size() positions whose
// acceptance rates are alphas[0..k): (*dist)[j] = P(N = j) for j in [0, k].
//   alphas: [k]; *dist resized to [k + 1]
void AcceptedCountDistribution(const std::vector<double>& alphas, std::vector<double>* dist);

// tau = E[tokens emitted per step] = (1 - alpha^(k+1)) / (1 - alpha) (k + 1 when alpha = 1).
// REQUIRES: 0 <= alpha <= 1, k >= 0.
double ExpectedTokensPerStep(double alpha, int k);

}  // namespace spec
}  // namespace specloop
