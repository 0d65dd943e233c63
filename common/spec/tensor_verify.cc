#include "common/spec/tensor_verify.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <string>

#include "common/spec/tensor_sampling.h"
#include "common/spec/tensor_upload.h"

namespace specloop {
namespace spec {
namespace {

std::string Shape(const at::Tensor& t) {
  if (!t.defined()) return "undefined";
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

// The control's k_b column as host ints, checked against [0, K] and the batch.
Status ReadCounts(const at::Tensor& control, int64_t batch, int64_t max_k, int64_t min_cols,
                  std::vector<int64_t>* counts) {
  if (!control.defined() || control.dim() != 2 || control.size(0) != batch ||
      control.size(1) < min_cols || control.scalar_type() != at::kDouble ||
      !control.device().is_cpu()) {
    return Status::InvalidArgument("control must be [" + std::to_string(batch) + ", " +
                                   std::to_string(min_cols) +
                                   "] float64 on the CPU, got " + Shape(control));
  }
  const at::Tensor c = control.contiguous();
  const double* data = c.data_ptr<double>();
  counts->resize(batch);
  for (int64_t b = 0; b < batch; ++b) {
    const double k = data[b * c.size(1)];
    if (!(k >= 0 && k <= static_cast<double>(max_k)) || k != static_cast<int64_t>(k)) {
      return Status::InvalidArgument("sequence " + std::to_string(b) + " drafts " +
                                     std::to_string(k) + " tokens, outside [0, " +
                                     std::to_string(max_k) + "]");
    }
    (*counts)[b] = static_cast<int64_t>(k);
  }
  return Status::OK();
}

// Shared shape checks: scores [B, K + 1, V] floating, tokens [B, K] integral, same device.
Status CheckScoresAndTokens(const at::Tensor& scores, const at::Tensor& tokens) {
  if (!scores.defined() || scores.dim() != 3 || scores.size(1) < 1 || scores.size(2) < 1 ||
      !at::isFloatingType(scores.scalar_type())) {
    return Status::InvalidArgument("target rows must be [B, K + 1, V >= 1] floating, got " +
                                   Shape(scores));
  }
  const int64_t B = scores.size(0), K = scores.size(1) - 1;
  if (!tokens.defined() || tokens.dim() != 2 || tokens.size(0) != B || tokens.size(1) != K ||
      !at::isIntegralType(tokens.scalar_type(), /*includeBool=*/false) ||
      tokens.device() != scores.device()) {
    return Status::InvalidArgument("draft tokens must be [" + std::to_string(B) + ", " +
                                   std::to_string(K) + "] integral on the scores' device, got " +
                                   Shape(tokens));
  }
  return Status::OK();
}

// [B] bool: a draft token of b among its first k_b lies outside [0, V).
at::Tensor TokensOutOfRange(const at::Tensor& tokens, const at::Tensor& drafted, int64_t V) {
  if (tokens.size(1) == 0) return at::zeros({tokens.size(0)}, tokens.options().dtype(at::kBool));
  return ((tokens < 0) | (tokens >= V)).logical_and(drafted).any(1);
}

// [B, K] bool: position i < k_b.
at::Tensor Drafted(const at::Tensor& counts, int64_t K) {
  return at::arange(K, counts.options()).unsqueeze(0) < counts.unsqueeze(1);
}

// [B, R] bool: row has a negative or non-finite entry or no positive mass; *sums: [B, R].
at::Tensor BadRows(const at::Tensor& rows, at::Tensor* sums) {
  *sums = rows.sum(2);
  return (~at::isfinite(rows) | (rows < 0)).any(2) | ~(*sums > 0);
}

// Column 0 num_accepted (-1 where invalid), then the emitted tokens.
at::Tensor Pack(const at::Tensor& accepted, const at::Tensor& invalid, const at::Tensor& tokens) {
  return at::cat({at::where(invalid, at::full_like(accepted, -1), accepted).unsqueeze(1), tokens},
                 1);
}

}  // namespace

at::Tensor ChainControl(const std::vector<int>& num_drafts, int max_k,
                        const std::vector<Rng*>& rngs) {
  const int64_t B = static_cast<int64_t>(num_drafts.size());
  at::Tensor control = at::zeros({B, max_k + 2}, at::kDouble);
  double* c = control.data_ptr<double>();
  for (int64_t b = 0; b < B; ++b) {
    double* row = c + b * (max_k + 2);
    row[0] = num_drafts[b];
    if (rngs.empty()) continue;
    for (int i = 0; i <= num_drafts[b] && i <= max_k; ++i) row[1 + i] = rngs[b]->Uniform();
  }
  return control;
}

Status VerifyChainTensors(const at::Tensor& target_probs, const at::Tensor& draft_probs,
                          const at::Tensor& draft_tokens, const at::Tensor& control,
                          at::Tensor* packed) {
  *packed = at::Tensor();
  SPECLOOP_RETURN_IF_ERROR(CheckScoresAndTokens(target_probs, draft_tokens));
  const int64_t B = target_probs.size(0), K = target_probs.size(1) - 1, V = target_probs.size(2);
  if (!draft_probs.defined() || draft_probs.dim() != 3 || draft_probs.size(0) != B ||
      draft_probs.size(1) != K || draft_probs.size(2) != V ||
      !at::isFloatingType(draft_probs.scalar_type()) ||
      draft_probs.device() != target_probs.device()) {
    return Status::InvalidArgument("draft probs must be [" + std::to_string(B) + ", " +
                                   std::to_string(K) + ", " + std::to_string(V) +
                                   "] floating on the target's device, got " + Shape(draft_probs));
  }
  std::vector<int64_t> unused;
  SPECLOOP_RETURN_IF_ERROR(ReadCounts(control, B, K, K + 2, &unused));
  const at::ScalarType ftype =
      target_probs.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  // The step's one upload: counts and uniforms together.
  const at::Tensor ctl = ToDeviceAsync(control, target_probs.device());
  const at::Tensor n = ctl.select(1, 0).to(at::kLong);  // [B]
  const at::Tensor u = ctl.narrow(1, 1, K + 1);          // [B, K + 1] float64

  at::Tensor p_sum;
  at::Tensor p = target_probs.to(ftype);
  const at::Tensor p_bad = BadRows(p, &p_sum);  // [B, K + 1]
  p = p / p_sum.unsqueeze(2);
  const at::Tensor pos = at::arange(K + 1, n.options());  // [K + 1]
  const at::Tensor tokens = draft_tokens.to(at::kLong);
  const at::Tensor drafted = Drafted(n, K);  // [B, K]
  at::Tensor invalid = TokensOutOfRange(tokens, drafted, V);

  at::Tensor accepted = at::zeros({B}, n.options());
  at::Tensor q;
  if (K > 0) {
    at::Tensor q_sum;
    q = draft_probs.to(ftype);
    const at::Tensor q_bad = BadRows(q, &q_sum);  // [B, K]
    q = q / q_sum.unsqueeze(2);
    const at::Tensor safe = tokens.clamp(0, V - 1).unsqueeze(2);  // gathers stay in range
    const at::Tensor p_x = p.narrow(1, 0, K).gather(2, safe).squeeze(2);  // [B, K]
    const at::Tensor q_x = q.gather(2, safe).squeeze(2);
    const at::Tensor pass = (q_x > 0) & (u.narrow(1, 0, K) * q_x < p_x) & drafted;
    accepted = pass.to(at::kLong).cumprod(1).sum(1);
    // Draft rows read: 0..min(f, k_b - 1).
    const at::Tensor read_q = pos.narrow(0, 0, K).unsqueeze(0) <= accepted.unsqueeze(1);
    invalid = invalid | (q_bad & read_q & drafted).any(1);
  }
  const at::Tensor rejected = accepted < n;
  const at::Tensor p_f = p.gather(1, accepted.view({B, 1, 1}).expand({B, 1, V})).squeeze(1);
  at::Tensor dist = p_f;
  if (K > 0) {
    const at::Tensor q_f =
        q.gather(1, accepted.clamp_max(K - 1).view({B, 1, 1}).expand({B, 1, V})).squeeze(1);
    const at::Tensor residual = (p_f - q_f).clamp_min(0);
    const at::Tensor use = rejected & (residual.sum(1) > 0);
    dist = at::where(use.unsqueeze(1), residual, p_f);
  }
  const at::Tensor u_at = at::where(rejected, accepted + 1, n).unsqueeze(1);
  const at::Tensor last = InverseCdfTensor(dist, u.gather(1, u_at).squeeze(1));  // [B]
  // Target rows read: 0..f.
  invalid = invalid | (p_bad & (pos.unsqueeze(0) <= accepted.unsqueeze(1))).any(1);

  at::Tensor out = at::full({B, K + 1}, -1, n.options());
  if (K > 0) {
    const at::Tensor kept = pos.narrow(0, 0, K).unsqueeze(0) < accepted.unsqueeze(1);
    out.narrow(1, 0, K).copy_(at::where(kept, tokens, at::full_like(tokens, -1)));
  }
  out.scatter_(1, accepted.unsqueeze(1), last.unsqueeze(1));
  *packed = Pack(accepted, invalid, out);
  return Status::OK();
}

Status VerifyChainGreedyTensors(const at::Tensor& target_scores, const at::Tensor& draft_tokens,
                                const at::Tensor& control, at::Tensor* packed) {
  *packed = at::Tensor();
  SPECLOOP_RETURN_IF_ERROR(CheckScoresAndTokens(target_scores, draft_tokens));
  const int64_t B = target_scores.size(0), K = target_scores.size(1) - 1;
  const int64_t V = target_scores.size(2);
  std::vector<int64_t> unused;
  SPECLOOP_RETURN_IF_ERROR(ReadCounts(control, B, K, 1, &unused));
  const at::Tensor n =
      ToDeviceAsync(control.select(1, 0), target_scores.device()).to(at::kLong);
  const at::Tensor best = ArgmaxLowestId(target_scores);  // [B, K + 1]

  const at::Tensor tokens = draft_tokens.to(at::kLong);
  const at::Tensor drafted = Drafted(n, K);
  const at::Tensor invalid = TokensOutOfRange(tokens, drafted, V);
  at::Tensor accepted = at::zeros({B}, n.options());
  if (K > 0) {
    const at::Tensor match = (tokens == best.narrow(1, 0, K)) & drafted;
    accepted = match.to(at::kLong).cumprod(1).sum(1);
  }
  // Accepted drafts equal their rows' argmax, so the emitted tokens are best[0..f].
  const at::Tensor pos = at::arange(K + 1, n.options()).unsqueeze(0);
  const at::Tensor out = at::where(pos <= accepted.unsqueeze(1), best, at::full_like(best, -1));
  *packed = Pack(accepted, invalid, out);
  return Status::OK();
}

Status UnpackChainOutcomes(const at::Tensor& packed, ChainBatchOutcome* out) {
  out->outcomes.clear();
  out->status.clear();
  if (!packed.defined() || packed.dim() != 2 || packed.size(1) < 2 ||
      packed.scalar_type() != at::kLong) {
    return Status::InvalidArgument("packed outcomes must be [B, K + 2] int64, got " +
                                   Shape(packed));
  }
  const at::Tensor host = packed.to(at::kCPU).contiguous();  // the step's one host copy
  const int64_t B = host.size(0), cols = host.size(1), K = cols - 2;
  const int64_t* data = host.data_ptr<int64_t>();
  out->outcomes.resize(B);
  out->status.resize(B);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t* row = data + b * cols;
    const int64_t accepted = row[0];
    if (accepted < -1 || accepted > K) {
      out->outcomes.clear();
      out->status.clear();
      return Status::InvalidArgument("row " + std::to_string(b) + " accepts " +
                                     std::to_string(accepted) + " of at most " +
                                     std::to_string(K));
    }
    if (accepted == -1) {
      out->status[b] = Status::InvalidArgument(
          "sequence " + std::to_string(b) +
          ": a draft token outside the vocabulary, or a row it reads has no positive mass or a "
          "negative/non-finite entry");
      continue;
    }
    ChainOutcome& o = out->outcomes[b];
    o.num_accepted = static_cast<int>(accepted);
    for (int64_t i = 0; i <= accepted; ++i) {
      if (row[1 + i] < 0) {
        out->outcomes.clear();
        out->status.clear();
        return Status::InvalidArgument("row " + std::to_string(b) + " has " +
                                       std::to_string(i) + " tokens, needs " +
                                       std::to_string(accepted + 1));
      }
      o.tokens.push_back(static_cast<int>(row[1 + i]));
    }
  }
  return Status::OK();
}

}  // namespace spec
}  // namespace specloop
