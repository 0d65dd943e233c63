// Recursive rejection sampling (RRS) without replacement: n candidate tokens for one position
// (SpecInfer, Miao et al. 2024; Yang et al. 2024 "Multi-Candidate Speculative Decoding";
// analysed in Hu et al., ICLR 2025, "Towards Optimal Multi-Draft Speculative Decoding").
//
// Drafts x_1..x_n are drawn from q sequentially without replacement: x_j from q_j, where q_1 = q
// and q_{j+1} is q_j with x_j removed and renormalized. Verification keeps a residual target
// r_1 = p. Candidate j is accepted with probability min(1, r_j(x_j) / q_j(x_j)); on rejection
// r_{j+1} = norm(max(0, r_j - q_j)) (which is 0 at x_j, so a rejected token is never emitted
// later). If every candidate is rejected the token is drawn from the final residual.
// By induction on the step, the emitted token is distributed exactly as p, whatever q is.
#pragma once

#include <vector>

#include "common/base/rng.h"
#include "common/base/status.h"
#include "common/spec/multi_draft.h"

namespace specloop {
namespace spec {

// Draws min(n, |support(q)|) distinct tokens from q sequentially without replacement, using one
// rng->Uniform() per token. Returns InvalidArgument for n < 1, vocab <= 0, a null pointer, or
// a row with no positive mass or a negative/non-finite entry.
//   draft_probs: [vocab] (q); *drafts resized to [min(n, |support(q)|)]
Status SampleWithoutReplacement(int n, int vocab, const float* draft_probs, Rng* rng,
                                std::vector<int>* drafts);

// RRS verification of drafts drawn as by SampleWithoutReplacement from the same q. Uses one
// rng->Uniform() per verified candidate and one more if all are rejected. A candidate with
// q_j(x_j) == 0 is rejected. Where a residual has no mass (r_j == q_j up to rounding, only
// reachable through such a rejection) the residual stays r_j. An empty draft list samples p.
// Returns InvalidArgument for vocab <= 0, a null pointer, a row with no positive mass or a
// negative/non-finite entry, a draft outside [0, vocab) or a repeated draft.
//   drafts:       [n]
//   draft_probs:  [vocab] (q)
//   target_probs: [vocab] (p)
Status VerifyRecursiveRejection(int vocab, const std::vector<int>& drafts,
                                const float* draft_probs, const float* target_probs, Rng* rng,
                                MultiDraftOutcome* out);

// The exact acceptance rate P(accepted_index >= 0) of SampleWithoutReplacement followed by
// VerifyRecursiveRejection, by enumerating every ordered draft list: O(vocab^n) time, for
// small vocabularies (tests, analysis). Compare with OptimalAcceptanceWithoutReplacement().
// REQUIRES: n >= 1, vocab >= 1, p and q rows with positive mass.
//   draft_probs, target_probs: [vocab]
double RecursiveRejectionAcceptance(int n, int vocab, const float* draft_probs,
                                    const float* target_probs);

}  // namespace spec
}  // namespace specloop
