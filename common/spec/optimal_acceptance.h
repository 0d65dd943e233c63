// alpha*: the optimal acceptance rate of multi-draft speculative decoding for a given draft
// distribution (Hu et al., ICLR 2025, "Towards Optimal Multi-Draft Speculative Decoding").
//
// A draft distribution Q draws a list of candidates X; a verifier emits Y ~ p and accepts when
// Y is in X. The best verifier's acceptance is the optimal-transport (max-flow) value
//   alpha* = max over couplings of (X, Y) of P(Y in X)
//          = 1 + min over token sets H of [ p(H) - Q(all candidates lie in H) ]      (min-cut)
// Hu et al. turn alpha* into this subset selection and solve it by sorting: for the draft
// constructions here the minimising H is a prefix of the tokens with q > 0 sorted by q(x)/p(x)
// descending (p = 0 first), so alpha* is one sort plus a linear scan over prefixes. The tests
// check every function against exhaustive min-cut and an independent max-flow (the primal) on
// random tiny vocabularies, so the prefix property is verified here, not only assumed.
// All functions normalize p and q first and REQUIRE rows with positive mass and no negative or
// non-finite entry (they return 0 otherwise), 1 <= n, and n <= vocab where stated.
#pragma once

namespace specloop {
namespace spec {

// n = 1: alpha* = sum_x min(p(x), q(x)), reached by single-draft speculative sampling.
//   p, q: [vocab]
double OptimalAcceptanceSingleDraft(int vocab, const float* target_probs,
                                    const float* draft_probs);

// The greedy construction of greedy_multi_draft.h (top n - 1 of q plus one draft from q').
// O(vocab log vocab). Equals GreedyMultiDraftAcceptance(): that verifier is optimal.
// REQUIRES: 1 <= n <= vocab.
//   p, q: [vocab]
double OptimalAcceptanceGreedy(int n, int vocab, const float* target_probs,
                               const float* draft_probs);

// n drafts drawn from q sequentially without replacement (min(n, |support(q)|) of them, as
// SampleWithoutReplacement in rrs.h). Q(all in H) for each prefix H is kept incrementally as a
// sum over ordered (n-1)-tuples inside H: O(vocab log vocab) for n <= 2 and
// O(vocab log vocab + vocab^(n-1)) in general. Compare with RecursiveRejectionAcceptance().
//   p, q: [vocab]
double OptimalAcceptanceWithoutReplacement(int n, int vocab, const float* target_probs,
                                           const float* draft_probs);

// n drafts drawn i.i.d. from q (with replacement): Q(all in H) = q(H)^n. O(vocab log vocab).
//   p, q: [vocab]
double OptimalAcceptanceWithReplacement(int n, int vocab, const float* target_probs,
                                        const float* draft_probs);

}  // namespace spec
}  // namespace specloop
