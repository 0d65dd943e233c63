// Distillation losses on the coarsened target distribution (DESIGN.md section 6): pure tensor
// functions, no model and no buffer.
//
// The replay buffer logs, per verified position, the target's distribution at temperature 1
// sparsely: the top-K ids, their log-probabilities (fp16 on disk, float here) and the tail mass
// 1 - sum of the K probabilities. The trainer recomputes the draft's full logits on the logged
// context. Both distributions are compared on K+1 buckets: the K logged ids and one tail bucket
// holding every other token of the vocabulary.
//   target: p_k = exp(target_logprobs[k]), p_tail = clamp(target_tail, 0, 1), then all K+1
//           masses are divided by their sum (fp16 rounding leaves them off 1 by ~1e-3).
//   draft:  q_k = softmax(draft_logits)[id_k], q_tail = sum of softmax over the other V-K ids,
//           computed in log space (logsumexp over the unlogged logits minus logsumexp over all)
//           so a tiny tail keeps its exact log and gradient; nothing is computed as 1 - sum.
// When K == V there is no tail bucket and every loss is the exact full-vocabulary loss.
//
// Objectives, per position, over the buckets b:
//   fkl:  KL(p || q) = sum_b p_b (log p_b - log q_b), with 0 log 0 = 0.
//   rkl:  KL(q || p) = sum_b q_b (log q_b - log max(p_b, kMinTargetProb)).
//   jsd:  JSD_beta(p, q) = beta KL(p || m) + (1 - beta) KL(q || m), m = beta p + (1 - beta) q
//         (the generalized JSD of GKD / DistillSpec; beta = 0.5 is the usual JSD, bounded by
//         log 2). Every log term is finite: m_b > 0 wherever p_b > 0 or q_b > 0.
//   tvd:  0.5 sum_b |p_b - q_b|.
// Only reverse KL needs an epsilon: a bucket the target gives zero mass (or a log-prob that
// underflowed to -inf) makes the exact rkl infinite, so the target's mass is floored at
// kMinTargetProb inside that log alone. Draft log-masses are always finite (log_softmax of
// finite logits), so fkl, jsd and tvd use no epsilon and gradients stay finite.
//
// Coarsening merges tokens, and merging never decreases the overlap: on the tail,
// min(sum p, sum q) >= sum min(p, q). So the K+1-bucket acceptance is an UPPER bound of the
// true alpha = sum_x min(p(x), q(x)); the sum over the K logged buckets alone (tail dropped) is
// a LOWER bound; the two differ by at most min(p_tail, q_tail) and agree when K == V.
// These acceptances compare the RAW distributions (temperature 1, no top-k or top-p). The
// trainer's held-out estimate scores each record under its own sampling instead
// (processed_acceptance.h), of which these are the temperature-1 case.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "common/base/status.h"

namespace specloop {
namespace trainer {

// Floor on the target's bucket mass inside reverse KL's log (log(1e-10) = -23.03).
constexpr double kMinTargetProb = 1e-10;

enum class Objective { kForwardKl, kReverseKl, kJsd, kTvd };

struct ObjectiveSpec {
  Objective kind = Objective::kForwardKl;
  // JSD weight on p, in (0, 1); ignored by the other objectives. Default: 0.5.
  double beta = 0.5;

  // Parses "fkl", "rkl", "tvd", "jsd" (beta 0.5) or "jsd:<beta>" with 0 < beta < 1. On
  // success fills *out and returns OK; otherwise InvalidArgument and *out is unchanged.
  static Status Parse(const std::string& s, ObjectiveSpec* out);
  // The string Parse accepts back: "fkl", "rkl", "tvd" or "jsd:<beta>" (shortest exact form).
  std::string ToString() const;
};

// The loss of every position, before weighting. Autograd flows into draft_logits only.
//   draft_logits:    [N, V] float32 or float64, finite
//   target_ids:      [N, K] int64 (int32 accepted), distinct within a row, in [0, V), K <= V
//   target_logprobs: [N, K] any floating dtype (converted to draft_logits' dtype and device)
//   target_tail:     [N]    floating, the logged tail mass (ignored when K == V)
//   returns          [N]    draft_logits' dtype
// REQUIRES: every row of the target has positive total mass.
at::Tensor DistillLossPerPosition(const ObjectiveSpec& spec, const at::Tensor& draft_logits,
                                  const at::Tensor& target_ids, const at::Tensor& target_logprobs,
                                  const at::Tensor& target_tail);

// The weighted mean sum_n w_n l_n / sum_n w_n of DistillLossPerPosition; 0 when all weights are
// 0. Weights carry the padding mask and per-domain weights.
//   weights: [N] floating, >= 0, or an undefined tensor for all ones
//   returns  [] scalar, draft_logits' dtype, differentiable w.r.t. draft_logits
at::Tensor DistillLoss(const ObjectiveSpec& spec, const at::Tensor& draft_logits,
                       const at::Tensor& target_ids, const at::Tensor& target_logprobs,
                       const at::Tensor& target_tail, const at::Tensor& weights);

// The same objectives on FULL distributions over one vocabulary, no coarsening: for a trainer
// that has the target's whole distribution (feature drafts recompute the target:
// feature_draft_training.h). Exact; the epsilon of reverse KL as above.
//   draft_logits:    [N, V] float32 or float64, finite
//   target_logprobs: [N, V] floating, the target's log-probabilities (renormalized here; -inf
//                    for no mass)
//   returns          [N]    draft_logits' dtype; autograd flows into draft_logits only
at::Tensor FullDistillLossPerPosition(const ObjectiveSpec& spec, const at::Tensor& draft_logits,
                                      const at::Tensor& target_logprobs);
// Its weighted mean, as DistillLoss.
at::Tensor FullDistillLoss(const ObjectiveSpec& spec, const at::Tensor& draft_logits,
                           const at::Tensor& target_logprobs, const at::Tensor& weights);

// alpha-hat on the K+1 buckets, sum_b min(p_b, q_b): an UPPER bound of the true acceptance
// sum_x min(p(x), q(x)) (see above), exact when K == V. No gradient. Arguments as
// DistillLossPerPosition.
//   returns [N] draft_logits' dtype
at::Tensor CoarsenedAcceptance(const at::Tensor& draft_logits, const at::Tensor& target_ids,
                               const at::Tensor& target_logprobs, const at::Tensor& target_tail);

// sum over the K logged buckets of min(p_k, q_k), tail dropped: a LOWER bound of the true
// acceptance, exact when K == V. No gradient. Arguments as DistillLossPerPosition.
//   returns [N] draft_logits' dtype
at::Tensor LoggedAcceptance(const at::Tensor& draft_logits, const at::Tensor& target_ids,
                            const at::Tensor& target_logprobs, const at::Tensor& target_tail);

}  // namespace trainer
}  // namespace specloop
