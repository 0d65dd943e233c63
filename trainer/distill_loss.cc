#include "trainer/distill_loss.h"

#include <ATen/core/grad_mode.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

namespace specloop {
namespace trainer {

namespace {

// Both distributions on the B buckets (B = K + 1, or K when K == V).
struct Buckets {
  at::Tensor log_p;  // [N, B] target log-mass, normalized; -inf where the mass is 0
  at::Tensor p;      // [N, B] exp(log_p)
  at::Tensor log_q;  // [N, B] draft log-mass, finite, carries the gradient
  at::Tensor q;      // [N, B] exp(log_q)
};

void CheckArgs(const at::Tensor& draft_logits, const at::Tensor& target_ids,
               const at::Tensor& target_logprobs, const at::Tensor& target_tail) {
  TORCH_CHECK(draft_logits.defined() && draft_logits.dim() == 2,
              "draft_logits must be [N, V], got ", draft_logits.sizes());
  TORCH_CHECK(draft_logits.scalar_type() == at::kFloat || draft_logits.scalar_type() == at::kDouble,
              "draft_logits must be float32 or float64, got ", draft_logits.scalar_type());
  const int64_t n = draft_logits.size(0);
  const int64_t v = draft_logits.size(1);
  TORCH_CHECK(target_ids.defined() && target_ids.dim() == 2 && target_ids.size(0) == n,
              "target_ids must be [N=", n, ", K], got ", target_ids.sizes());
  TORCH_CHECK(target_ids.scalar_type() == at::kLong || target_ids.scalar_type() == at::kInt,
              "target_ids must be int64 or int32, got ", target_ids.scalar_type());
  const int64_t k = target_ids.size(1);
  TORCH_CHECK(k >= 1 && k <= v, "need 1 <= K <= V, got K=", k, " V=", v);
  TORCH_CHECK(target_logprobs.defined() && target_logprobs.sizes() == target_ids.sizes(),
              "target_logprobs must be [N, K]=", target_ids.sizes(), ", got ",
              target_logprobs.sizes());
  TORCH_CHECK(at::isFloatingType(target_logprobs.scalar_type()),
              "target_logprobs must be floating, got ", target_logprobs.scalar_type());
  TORCH_CHECK(target_tail.defined() && target_tail.dim() == 1 && target_tail.size(0) == n,
              "target_tail must be [N=", n, "], got ", target_tail.sizes());
  TORCH_CHECK(at::isFloatingType(target_tail.scalar_type()),
              "target_tail must be floating, got ", target_tail.scalar_type());
}

// draft_logits [N, V], target_ids [N, K], target_logprobs [N, K], target_tail [N].
Buckets Coarsen(const at::Tensor& draft_logits, const at::Tensor& target_ids,
                const at::Tensor& target_logprobs, const at::Tensor& target_tail) {
  CheckArgs(draft_logits, target_ids, target_logprobs, target_tail);
  const auto opts = draft_logits.options().requires_grad(false);
  const int64_t v = draft_logits.size(1);
  const int64_t k = target_ids.size(1);
  const bool has_tail = k < v;
  const at::Tensor ids = target_ids.to(draft_logits.device(), at::kLong).detach();  // [N, K]

  // Draft: exact log-masses; the tail as a logsumexp over the unlogged logits.
  const at::Tensor lse_all = at::logsumexp(draft_logits, {1}, /*keepdim=*/true);  // [N, 1]
  at::Tensor log_q = at::gather(draft_logits, 1, ids) - lse_all;                  // [N, K]
  if (has_tail) {
    const at::Tensor logged = at::zeros_like(draft_logits, opts.dtype(at::kBool))
                                  .scatter_(1, ids, true);  // [N, V]
    const at::Tensor tail_logits =
        draft_logits.masked_fill(logged, -std::numeric_limits<double>::infinity());  // [N, V]
    const at::Tensor lse_tail = at::logsumexp(tail_logits, {1}, /*keepdim=*/true);    // [N, 1]
    log_q = at::cat({log_q, lse_tail - lse_all}, 1);                                 // [N, K+1]
  }

  // Target: logged log-probs plus the clamped tail, renormalized to sum 1.
  at::Tensor log_p = target_logprobs.detach().to(opts);  // [N, K]
  if (has_tail) {
    const at::Tensor tail = target_tail.detach().to(opts).clamp(0.0, 1.0);  // [N]
    log_p = at::cat({log_p, at::log(tail).unsqueeze(1)}, 1);                // [N, K+1]
  }
  at::Tensor log_z = at::logsumexp(log_p, {1}, /*keepdim=*/true);  // [N, 1]
  // A row with no mass at all (padding) keeps p = 0 instead of turning into NaN.
  log_z = at::where(at::isfinite(log_z), log_z, at::zeros_like(log_z));
  log_p = log_p - log_z;

  Buckets b;
  b.p = at::exp(log_p);
  b.log_p = log_p;
  b.q = at::exp(log_q);
  b.log_q = log_q;
  return b;
}

// sum_b a_b (log a_b - log_m_b), with 0 log 0 = 0 and a free of gradient-carrying -infs.
//   a, log_a, log_m: [N, B]; returns [N]
at::Tensor KlTo(const at::Tensor& a, const at::Tensor& log_a, const at::Tensor& log_m) {
  const at::Tensor safe_log_a = at::where(a > 0, log_a, at::zeros_like(log_a));
  return (a * (safe_log_a - log_m)).sum(1);
}

}  // namespace

Status ObjectiveSpec::Parse(const std::string& s, ObjectiveSpec* out) {
  ObjectiveSpec spec;
  if (s == "fkl") {
    spec.kind = Objective::kForwardKl;
  } else if (s == "rkl") {
    spec.kind = Objective::kReverseKl;
  } else if (s == "tvd") {
    spec.kind = Objective::kTvd;
  } else if (s == "jsd") {
    spec.kind = Objective::kJsd;
  } else if (s.rfind("jsd:", 0) == 0) {
    spec.kind = Objective::kJsd;
    const std::string num = s.substr(4);
    if (num.empty() || std::isspace(static_cast<unsigned char>(num[0]))) {
      return Status::InvalidArgument("objective '" + s + "': missing beta after 'jsd:'");
    }
    errno = 0;
    char* end = nullptr;
    const double beta = std::strtod(num.c_str(), &end);
    if (errno != 0 || end != num.c_str() + num.size() || !std::isfinite(beta)) {
      return Status::InvalidArgument("objective '" + s + "': beta is not a number");
    }
    if (!(beta > 0.0 && beta < 1.0)) {
      return Status::InvalidArgument("objective '" + s + "': beta must lie in (0, 1)");
    }
    spec.beta = beta;
  } else {
    return Status::InvalidArgument("objective '" + s + "': expected fkl, rkl, jsd[:beta] or tvd");
  }
  *out = spec;
  return Status::OK();
}

std::string ObjectiveSpec::ToString() const {
  switch (kind) {
    case Objective::kForwardKl: return "fkl";
    case Objective::kReverseKl: return "rkl";
    case Objective::kTvd: return "tvd";
    case Objective::kJsd: break;
  }
  // Shortest %g form that reads back as exactly beta.
  char buf[32];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, beta);
    if (std::strtod(buf, nullptr) == beta) break;
  }
  return std::string("jsd:") + buf;
}

namespace {

// The objective's loss of every row of `b` [N] (see distill_loss.h).
at::Tensor LossOf(const ObjectiveSpec& spec, const Buckets& b) {
  switch (spec.kind) {
    case Objective::kForwardKl:
      return KlTo(b.p, b.log_p, b.log_q);
    case Objective::kReverseKl: {
      const at::Tensor floored_log_p = b.log_p.clamp_min(std::log(kMinTargetProb));  // [N, B]
      return (b.q * (b.log_q - floored_log_p)).sum(1);
    }
    case Objective::kJsd: {
      const double beta = spec.beta;
      TORCH_CHECK(beta > 0.0 && beta < 1.0, "JSD beta must lie in (0, 1), got ", beta);
      // log m = log(beta p + (1 - beta) q) in log space: finite since q > 0, and exact for
      // buckets whose q underflows in exp.
      const at::Tensor log_m =
          at::logaddexp(b.log_p + std::log(beta), b.log_q + std::log1p(-beta));  // [N, B]
      return beta * KlTo(b.p, b.log_p, log_m) + (1.0 - beta) * KlTo(b.q, b.log_q, log_m);
    }
    case Objective::kTvd:
      return 0.5 * (b.p - b.q).abs().sum(1);
  }
  TORCH_CHECK(false, "unknown objective");
}

// Weighted mean of per-position losses (DistillLoss's contract).
at::Tensor WeightedMean(const at::Tensor& per_position, const at::Tensor& weights) {
  if (!weights.defined()) return per_position.mean();
  TORCH_CHECK(weights.dim() == 1 && weights.size(0) == per_position.size(0),
              "weights must be [N=", per_position.size(0), "], got ", weights.sizes());
  TORCH_CHECK(at::isFloatingType(weights.scalar_type()),
              "weights must be floating, got ", weights.scalar_type());
  const at::Tensor w = weights.detach().to(per_position.options().requires_grad(false));  // [N]
  // Rows of weight 0 (padding) are dropped, not multiplied by 0, so junk there cannot leak in.
  const at::Tensor kept = at::where(w > 0, per_position, at::zeros_like(per_position));  // [N]
  const at::Tensor total = w.sum();
  const at::Tensor denom = at::where(total > 0, total, at::ones_like(total));
  return (w * kept).sum() / denom;
}

// Both full distributions: draft_logits [N, V], target_logprobs [N, V].
Buckets Full(const at::Tensor& draft_logits, const at::Tensor& target_logprobs) {
  TORCH_CHECK(draft_logits.defined() && draft_logits.dim() == 2,
              "draft_logits must be [N, V], got ", draft_logits.sizes());
  TORCH_CHECK(draft_logits.scalar_type() == at::kFloat || draft_logits.scalar_type() == at::kDouble,
              "draft_logits must be float32 or float64, got ", draft_logits.scalar_type());
  TORCH_CHECK(target_logprobs.defined() && target_logprobs.sizes() == draft_logits.sizes(),
              "target_logprobs must be [N, V]=", draft_logits.sizes(), ", got ",
              target_logprobs.sizes());
  TORCH_CHECK(at::isFloatingType(target_logprobs.scalar_type()),
              "target_logprobs must be floating, got ", target_logprobs.scalar_type());
  const auto opts = draft_logits.options().requires_grad(false);
  at::Tensor log_p = target_logprobs.detach().to(opts);                 // [N, V]
  at::Tensor log_z = at::logsumexp(log_p, {1}, /*keepdim=*/true);       // [N, 1]
  log_z = at::where(at::isfinite(log_z), log_z, at::zeros_like(log_z));  // a row of no mass
  Buckets b;
  b.log_p = log_p - log_z;
  b.p = at::exp(b.log_p);
  b.log_q = at::log_softmax(draft_logits, 1);
  b.q = at::exp(b.log_q);
  return b;
}

}  // namespace

at::Tensor DistillLossPerPosition(const ObjectiveSpec& spec, const at::Tensor& draft_logits,
                                  const at::Tensor& target_ids, const at::Tensor& target_logprobs,
                                  const at::Tensor& target_tail) {
  return LossOf(spec, Coarsen(draft_logits, target_ids, target_logprobs, target_tail));
}

at::Tensor DistillLoss(const ObjectiveSpec& spec, const at::Tensor& draft_logits,
                       const at::Tensor& target_ids, const at::Tensor& target_logprobs,
                       const at::Tensor& target_tail, const at::Tensor& weights) {
  return WeightedMean(
      DistillLossPerPosition(spec, draft_logits, target_ids, target_logprobs, target_tail),
      weights);
}

at::Tensor FullDistillLossPerPosition(const ObjectiveSpec& spec, const at::Tensor& draft_logits,
                                      const at::Tensor& target_logprobs) {
  return LossOf(spec, Full(draft_logits, target_logprobs));
}

at::Tensor FullDistillLoss(const ObjectiveSpec& spec, const at::Tensor& draft_logits,
                           const at::Tensor& target_logprobs, const at::Tensor& weights) {
  return WeightedMean(FullDistillLossPerPosition(spec, draft_logits, target_logprobs), weights);
}

at::Tensor CoarsenedAcceptance(const at::Tensor& draft_logits, const at::Tensor& target_ids,
                               const at::Tensor& target_logprobs, const at::Tensor& target_tail) {
  at::NoGradGuard no_grad;
  const Buckets b = Coarsen(draft_logits, target_ids, target_logprobs, target_tail);
  return at::minimum(b.p, b.q).sum(1);
}

at::Tensor LoggedAcceptance(const at::Tensor& draft_logits, const at::Tensor& target_ids,
                            const at::Tensor& target_logprobs, const at::Tensor& target_tail) {
  at::NoGradGuard no_grad;
  const Buckets b = Coarsen(draft_logits, target_ids, target_logprobs, target_tail);
  const int64_t k = target_ids.size(1);
  return at::minimum(b.p, b.q).narrow(1, 0, k).sum(1);
}

}  // namespace trainer
}  // namespace specloop
