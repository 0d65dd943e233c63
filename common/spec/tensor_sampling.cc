#include "common/spec/tensor_sampling.h"

#include <ATen/ATen.h>

#include <cmath>
#include <string>
#include <tuple>

#include "common/spec/tensor_upload.h"

namespace specloop {
namespace spec {
namespace {

// Top-k, then top-p (ProcessedProbsTensor's rule) of the temperature-scaled rows `p`
// [B, R, V], each row's k and top_p from the control ([B, 1, 1] views); rows that cut neither
// are returned as they are.
at::Tensor TopKTopP(const at::Tensor& p, const at::Tensor& ctl, const at::Tensor& k,
                    const at::Tensor& top_p) {
  const int64_t V = p.size(2);
  at::Tensor sorted, order;
  std::tie(sorted, order) = at::sort(p, /*stable=*/true, /*dim=*/2, /*descending=*/true);
  const at::Tensor rank = at::arange(V, ctl.options()).view({1, 1, V});
  const at::Tensor use_k = (k > 0) & (k < V), use_p = top_p < 1.0;
  const at::Tensor in_k = ~use_k | (rank < k);                 // [B, 1, V]
  const at::Tensor sorted_d = sorted.to(at::kDouble) * in_k;   // top-k set, others 0
  const at::Tensor cum = sorted_d.cumsum(2);
  const at::Tensor kept_mass =
      at::where(use_k, cum.narrow(2, V - 1, 1), at::ones_like(cum.narrow(2, V - 1, 1)));
  const at::Tensor reach = (cum >= top_p * kept_mass) & in_k;
  // Ranks before the first that reaches the target (V where none does: keep the whole set).
  const at::Tensor lead = (~reach).to(at::kLong).cumprod(2).sum(2, /*keepdim=*/true);
  const at::Tensor in_p = ~use_p | (rank <= lead);
  const at::Tensor keep = in_k & in_p;
  const at::Tensor kinv =
      (1.0 / (sorted_d * keep).sum(2, /*keepdim=*/true)).to(at::kFloat);
  const at::Tensor cut = at::zeros_like(p).scatter(
      2, order, at::where(keep, sorted * kinv, at::zeros_like(sorted)));
  return at::where(use_k | use_p, cut, p);
}

}  // namespace

Status ProcessedProbsTensor(const at::Tensor& logits, const std::vector<SamplingParams>& params,
                            at::Tensor* probs) {
  *probs = at::Tensor();
  if (!logits.defined() || logits.dim() != 3 || logits.size(2) < 1 ||
      !at::isFloatingType(logits.scalar_type())) {
    return Status::InvalidArgument("logits must be [B, R, V >= 1] floating");
  }
  const int64_t B = logits.size(0), V = logits.size(2);
  if (static_cast<int64_t>(params.size()) != B) {
    return Status::InvalidArgument("need one SamplingParams per sequence: " +
                                   std::to_string(params.size()) + " for " + std::to_string(B));
  }
  at::Tensor host = at::empty({B, 3}, at::kDouble);
  double* h = host.data_ptr<double>();
  for (int64_t b = 0; b < B; ++b) {
    const std::string bad = params[b].Validate();
    if (!bad.empty()) return Status::InvalidArgument("sequence " + std::to_string(b) + ": " + bad);
    h[b * 3 + 0] = params[b].temperature;
    h[b * 3 + 1] = params[b].top_k;
    h[b * 3 + 2] = params[b].top_p;  // float widened, as the host's target
  }
  const at::Tensor ctl = ToDeviceAsync(host, logits.device()).view({B, 3, 1, 1});  // the one upload
  const at::Tensor t = ctl.select(1, 0), k = ctl.select(1, 1), top_p = ctl.select(1, 2);
  const at::Tensor greedy = t <= 0;  // [B, 1, 1]
  const at::Tensor x = logits.to(at::kFloat);
  const at::Tensor key = at::where(at::isnan(x), at::full_like(x, -INFINITY), x);
  const at::Tensor mx = key.amax(2, /*keepdim=*/true);

  // Temperature (divide by T, as the host: 0 / tiny T stays 0).
  const at::Tensor tt = at::where(greedy, at::ones_like(t), t).to(at::kFloat);
  const at::Tensor e = at::exp((x - mx) / tt);
  const at::Tensor inv = (1.0 / e.to(at::kDouble).sum(2, /*keepdim=*/true)).to(at::kFloat);
  const at::Tensor p = e * inv;

  // Top-k, then top-p, over the sorted probabilities (no sort where no row cuts).
  bool cuts = false;
  for (const SamplingParams& q : params) {
    cuts = cuts || (!q.greedy() && ((q.top_k > 0 && q.top_k < V) || q.top_p < 1.0f));
  }
  at::Tensor out = p;
  if (cuts) out = TopKTopP(p, ctl, k, top_p);

  // Greedy rows: one-hot on the argmax.
  const at::Tensor ids = at::arange(V, ctl.options().dtype(at::kLong)).view({1, 1, V});
  const at::Tensor onehot = (ids == ArgmaxLowestId(x).unsqueeze(2)).to(at::kFloat);
  *probs = at::where(greedy, onehot, out);
  return Status::OK();
}

at::Tensor ArgmaxLowestId(const at::Tensor& scores) {
  const int64_t d = scores.dim() - 1;
  const at::Tensor key = at::where(at::isnan(scores), at::full_like(scores, -INFINITY), scores);
  // at::argmax returns the first of equal maxima (its documented tie rule, on CPU and CUDA).
  const at::Tensor best = key.argmax(d);
  // Where the maximum is -inf the row holds only -inf and NaN: the first -inf, else 0.
  const at::Tensor top = key.gather(d, best.unsqueeze(d)).squeeze(d);
  const at::Tensor ninf = scores == -INFINITY;
  const at::Tensor first_ninf = ninf.to(at::kByte).argmax(d);
  return at::where(top == -INFINITY, at::where(ninf.any(d), first_ninf, at::zeros_like(best)),
                   best);
}

at::Tensor InverseCdfTensor(const at::Tensor& dist, const at::Tensor& u) {
  const int64_t V = dist.size(1);
  const at::Tensor cum = dist.to(at::kDouble).cumsum(1);
  const at::Tensor target = (u * cum.select(1, V - 1)).unsqueeze(1);
  const at::Tensor below = (cum <= target).sum(1);
  const at::Tensor ids = at::arange(V, dist.options().dtype(at::kLong)).unsqueeze(0);
  const at::Tensor last = at::where(dist > 0, ids, at::full_like(ids, -1)).amax(1);
  return at::minimum(below, last).clamp_min(0);
}

}  // namespace spec
}  // namespace specloop
