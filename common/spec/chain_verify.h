// Chain verification of k draft tokens (Leviathan et al. 2023, "Fast Inference from Transformers
// via Speculative Decoding"; Chen et al. 2023, "Accelerating Large Language Model Decoding with
// Speculative Sampling"), shaped like vLLM's rejection_sample: free functions, no model.
//
// Terms (as in vLLM):
//  - accepted tokens: the longest prefix of the draft that passes verification;
//  - recovered token: drawn from norm(max(0, p_i - q_i)) at the first rejected position i;
//  - bonus token: drawn from p_k when all k draft tokens are accepted.
// Every step emits num_accepted + 1 tokens, and the emitted sequence is distributed exactly as
// sampling from the target one token at a time (p_i is the target's processed distribution
// given the prefix and the accepted drafts before position i).
#pragma once

#include <vector>

#include "common/base/rng.h"
#include "common/base/status.h"

namespace specloop {
namespace spec {

struct ChainOutcome {
  // Accepted draft tokens, in [0, k].
  int num_accepted = 0;
  // [num_accepted + 1]: the accepted draft tokens, then one recovered token (after a rejection)
  // or the bonus token (when all k were accepted).
  std::vector<int> tokens;
};

// Random verification. Position i (0-based) accepts draft_tokens[i] = x with probability
// min(1, p_i(x) / q_i(x)), decided by one rng->Uniform() u per position (accept iff
// u * q_i(x) < p_i(x)). At the first rejection one more Uniform() draws the recovered token from
// norm(max(0, p_i - q_i)); if all k are accepted one Uniform() draws the bonus token from p_k.
// Edge cases: q_i(x) == 0 (the proposer drafted a token its own distribution rules out) is a
// rejection, as in vLLM; where max(0, p_i - q_i) has no mass (p_i == q_i up to rounding, only
// reachable through such a rejection) the recovered token is drawn from p_i. k == 0 emits one
// token drawn from p_0.
// Rows are normalized internally (they need not sum exactly to 1).
// Returns InvalidArgument (and leaves *out cleared) for k < 0, vocab <= 0, a null pointer, a
// draft token outside [0, vocab), or a row it reads (rows up to the first rejection, and p_k
// when all are accepted) with no positive mass or a negative/non-finite entry.
//   draft_tokens: [k]
//   draft_probs:  [k, vocab] row-major; row i = q_i, the draft's processed distribution
//   target_probs: [k + 1, vocab] row-major; row i = p_i, the target's processed distribution
Status VerifyChain(int k, int vocab, const int* draft_tokens, const float* draft_probs,
                   const float* target_probs, Rng* rng, ChainOutcome* out);

// Greedy fast path (target temperature 0): accepts draft_tokens[i] iff it equals
// argmax(target_scores row i) (lowest id on ties, as common/base/sampling.h's Argmax); at the first
// mismatch emits that argmax; after k matches emits the argmax of row k. No draft
// distribution and no randomness are needed, and the emitted tokens are exactly the target's
// own greedy decoding. Rows may be logits or probabilities: only their argmax is used.
// Returns InvalidArgument for k < 0, vocab <= 0, a null pointer or a draft token out of range.
//   draft_tokens:  [k]
//   target_scores: [k + 1, vocab] row-major
Status VerifyChainGreedy(int k, int vocab, const int* draft_tokens, const float* target_scores,
                         ChainOutcome* out);

}  // namespace spec
}  // namespace specloop
