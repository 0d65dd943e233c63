// Greedy multi-draft construction and its optimal verifier (Hu et al., ICLR 2025, "Towards
// Optimal Multi-Draft Speculative Decoding", section on greedy draft sampling).
//
// Drafts for one position, n candidates: the first n - 1 are the top n - 1 tokens T of q
// (deterministic; ties toward lower ids), the last is drawn from q' = q restricted to the
// tokens outside T and renormalized (uniform over those tokens when q has no mass there).
// Verification runs single-draft speculative sampling of the last draft against q': accept
// x_n with probability min(1, p(x_n) / q'(x_n)), else draw from norm(max(0, p - q')). Because
// q' is 0 on T, that residual carries all of p's mass on T, so a "recovered" token in T is a
// draft too. The emitted token is distributed exactly as p, and the acceptance rate is
//   alpha = p(T) + sum_{x not in T} min(p(x), q'(x)),
// which equals the optimal acceptance alpha* of this draft distribution (see
// OptimalAcceptanceGreedy in optimal_acceptance.h): the verifier has no gap.
#pragma once

#include <vector>

#include "common/base/rng.h"
#include "common/base/status.h"
#include "common/spec/multi_draft.h"

namespace specloop {
namespace spec {

// The deterministic part of the construction, a function of q and n only.
struct GreedyDraftPlan {
  // [n - 1]: the top n - 1 tokens of q, most likely first (ties toward lower ids).
  std::vector<int> top;
  // [vocab]: q', the distribution of the last draft (0 on `top`, sums to 1).
  std::vector<double> last_probs;
};

// Builds the plan. Returns InvalidArgument unless 1 <= n <= vocab, draft_probs is non-null and
// q has positive mass with no negative or non-finite entry.
//   draft_probs: [vocab] (q)
Status MakeGreedyDraftPlan(int n, int vocab, const float* draft_probs, GreedyDraftPlan* plan);

// The n drafts: plan.top followed by one token drawn from plan.last_probs with one
// rng->Uniform(). Errors as MakeGreedyDraftPlan.
//   draft_probs: [vocab] (q); *drafts resized to [n]
Status SampleGreedyDrafts(int n, int vocab, const float* draft_probs, Rng* rng,
                          std::vector<int>* drafts);

// Verifies drafts made by SampleGreedyDrafts from the same q (n = drafts.size()); uses one
// rng->Uniform() for the last draft and one more on its rejection. q'(x_n) == 0 is a rejection.
// Returns InvalidArgument when the drafts are not of that form (wrong top n - 1, last draft in
// the top or out of range), or for the errors of MakeGreedyDraftPlan, or a bad target row.
//   drafts:       [n]
//   draft_probs:  [vocab] (q)
//   target_probs: [vocab] (p)
Status VerifyGreedyMultiDraft(int vocab, const std::vector<int>& drafts, const float* draft_probs,
                              const float* target_probs, Rng* rng, MultiDraftOutcome* out);

// The exact acceptance rate P(accepted_index >= 0) of SampleGreedyDrafts followed by
// VerifyGreedyMultiDraft, computed from the verifier's own accept and residual steps in
// O(vocab log vocab). REQUIRES: 1 <= n <= vocab, p and q rows with positive mass.
//   draft_probs, target_probs: [vocab]
double GreedyMultiDraftAcceptance(int n, int vocab, const float* draft_probs,
                                  const float* target_probs);

}  // namespace spec
}  // namespace specloop
