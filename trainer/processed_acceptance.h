// Acceptance of one logged position under the request's own sampling: what speculative
// verification would accept there, estimated from what the replay buffer keeps. Pure math over
// float arrays; no model, no LibTorch.
//
// Serving verifies a draft token against the PROCESSED distributions (common/base/sampling.h
// ProcessedDistribution: temperature, then top-k, then top-p, ties toward lower ids), p for the
// target and q for the draft, and accepts with probability alpha = sum_x min(p(x), q(x)); under
// greedy decoding (temperature 0) it accepts exactly when the draft's argmax is the target's.
// A record keeps the target's RAW (temperature 1) distribution sparsely: the K most likely ids,
// their log-probs (fp16) and the tail mass t outside them (buffer/record.h). The draft's full
// logits are recomputed, so q is exact: ProcessedDistribution itself.
//
// The target's processed distribution is rebuilt from the logged entries, and the tail is
// BOUNDED, never guessed, so that the lower bound stays a lower bound:
//   - temperature T: a logged token's weight is exp((lp_i - lp_max) / T), the exact ratio of its
//     processed probability to the top token's. The tail's weight is unknown, but its n = V - K
//     tokens have raw probabilities x_j <= p_min (the smallest logged one: the logged entries
//     are the K most likely) summing to t, so sum_j x_j^(1/T) lies between the extreme
//     arrangements: as many tokens at p_min as t allows and the rest in one, or t spread evenly
//     over the n tokens (the first is the most when T < 1, the least when T > 1). At T = 1
//     both are t: exact.
//   - top-k (c = top_k): c <= K keeps the c highest logged entries and no tail (exact); c > K
//     keeps every logged entry and the c - K largest tail tokens, bounded as above.
//   - top-p: the cut is where the cumulative weight of the logged entries, most likely first,
//     reaches top_p times the kept weight; it is found for the least and for the most tail
//     weight possible.
// Each logged token's processed probability then lies in [lower, upper]:
//   lower = weight / (most kept weight possible), and 0 unless it is kept even with the least
//           tail weight (the earliest top-p cut);
//   upper = weight / (least kept weight possible), and 0 unless it is kept with the most.
// A lower bound of every logged p, so LowerAcceptance = sum over the logged ids of
// min(lower_i, q_i) <= sum over the logged ids of min(p_i, q_i) <= alpha: the tail contributes
// nothing, as at temperature 1 (a draft cannot score by moving mass where the target's is not
// logged). UpperAcceptance = sum of min(upper_i, q_i) plus min(tail_upper, q's mass outside the
// logged ids) >= alpha, tail_upper = min(1 - sum lower_i, most tail weight / least kept weight).
// At temperature 1 with no top-k or top-p cut, lower = upper = the logged probability over
// (logged mass + t), and the two bounds are the K-bucket and K+1-bucket acceptances of
// distill_loss.h (LoggedAcceptance, CoarsenedAcceptance); with top_k <= K (any temperature,
// any top-p) no tail token is kept and both equal alpha (up to the fp16 rounding of the logged
// log-probs).
//
// Greedy (temperature 0): both bounds are 1 when Argmax of the draft's logits (lowest id on ties,
// common/base/sampling.h) is the logged entry of the highest log-prob (lowest id on ties), else 0.
// Ties are judged on the fp16 log-probs, which can tie where the target's logits did not.
#pragma once

#include <cstdint>
#include <vector>

#include "common/base/sampling.h"

namespace specloop {
namespace trainer {

// The sampling regime of a request: "greedy" (temperature 0) or "sampled".
const char* SamplingRegime(const SamplingParams& sampling);

// One logged position of the target.
struct LoggedTarget {
  const int64_t* ids = nullptr;       // [k], distinct, in [0, vocab)
  const float* logprobs = nullptr;    // [k], raw (temperature 1); -inf for no mass
  int k = 0;                          // K, 1 <= K <= vocab
  double tail = 0;                    // raw mass outside the K ids, in [0, 1]
};

// Bounds on the processed target distribution at a logged position (see above).
struct ProcessedTargetBounds {
  std::vector<double> lower, upper;  // [K]: bounds of each logged id's processed probability
  double tail_upper = 0;             // bound of the processed mass outside the logged ids
};

// REQUIRES: sampling.Validate() is empty; `target` as LoggedTarget says.
void BoundProcessedTarget(const LoggedTarget& target, int vocab, const SamplingParams& sampling,
                          ProcessedTargetBounds* out);

struct AcceptanceBounds {
  double lower = 0;  // LowerAcceptance: the gate's metric
  double upper = 0;  // UpperAcceptance
};

// The acceptance bounds of `draft_logits[0, vocab)` against `target` under `sampling` (see
// above). `scratch` (may be null) is reused for the draft's processed distribution.
// REQUIRES: as BoundProcessedTarget; draft logits finite.
AcceptanceBounds ProcessedAcceptance(const float* draft_logits, int vocab,
                                     const LoggedTarget& target, const SamplingParams& sampling,
                                     std::vector<float>* scratch = nullptr);

// The same for a draft over a sub-vocabulary (an EAGLE-3 head's draft vocabulary): `draft_logits`
// [draft_vocab] over draft ids, draft id d being target id draft_to_target[d] (ascending). q is
// what FeatureDraftProposer draws from: the processed distribution over the draft ids (greedy:
// their argmax, lowest draft id on ties), zero on every other target id; the target side is as
// above over the target's `vocab`.
// REQUIRES: as ProcessedAcceptance; draft_to_target ascending ids in [0, vocab).
AcceptanceBounds ProcessedAcceptance(const float* draft_logits, int draft_vocab,
                                     const int* draft_to_target, int vocab,
                                     const LoggedTarget& target, const SamplingParams& sampling,
                                     std::vector<float>* scratch = nullptr);

}  // namespace trainer
}  // namespace specloop
