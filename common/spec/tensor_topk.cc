#include "common/spec/tensor_topk.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>

#include "common/spec/tensor_upload.h"

namespace specloop {
namespace spec {

Status TopKLogProbs(const at::Tensor& logits, int top_k, TopKTensors* out) {
  *out = TopKTensors();
  if (!logits.defined() || logits.dim() != 2 || logits.size(1) < 1 ||
      !at::isFloatingType(logits.scalar_type())) {
    return Status::InvalidArgument("logits must be [R, V >= 1] floating");
  }
  if (top_k <= 0) return Status::InvalidArgument("top_k must be positive");
  const at::ScalarType ftype = logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor x = logits.to(ftype);
  const int64_t R = x.size(0), V = x.size(1);
  const int64_t K = std::min<int64_t>(top_k, V);
  const at::Tensor key = at::where(at::isnan(x), at::full_like(x, -INFINITY), x);
  // The K kept entries: all above the K-th largest value t, then the lowest ids equal to t
  // (at::topk's own choice among ties is unspecified). Laid out in id order, then a stable
  // descending sort of those K keeps ties toward the lower id.
  const at::Tensor t = std::get<0>(at::topk(key, K, 1)).narrow(1, K - 1, 1);  // [R, 1]
  const at::Tensor above = key > t, tie = key == t;
  const at::Tensor room = K - above.sum(1, /*keepdim=*/true);
  const at::Tensor keep = above | (tie & (tie.cumsum(1) <= room));  // exactly K a row
  const at::Tensor ids = at::arange(V, x.options().dtype(at::kLong)).expand({R, V});
  const at::Tensor slot = at::where(keep, keep.cumsum(1) - 1, at::full_like(ids, K));
  const at::Tensor chosen = at::zeros({R, K + 1}, ids.options()).scatter_(1, slot, ids)
                                .narrow(1, 0, K);  // column K took the others
  const at::Tensor by_value = std::get<1>(
      at::sort(key.gather(1, chosen), /*stable=*/true, /*dim=*/1, /*descending=*/true));
  at::Tensor order = chosen.gather(1, by_value);
  const at::Tensor lse = at::logsumexp(key, 1, /*keepdim=*/true);
  at::Tensor lp = x.gather(1, order) - lse;
  const at::Tensor kept = lp.to(at::kDouble).exp().sum(1);
  out->tail_mass = (1.0 - kept).clamp(0.0, 1.0).to(at::kFloat);
  if (K < top_k) {
    order = at::cat({order, at::zeros({R, top_k - K}, order.options())}, 1);
    lp = at::cat({lp, at::full({R, top_k - K}, -INFINITY, lp.options())}, 1);
  }
  out->ids = order;
  out->logprobs = lp.to(at::kFloat);
  return Status::OK();
}

Status TopKLogProbsToHost(const at::Tensor& logits, const std::vector<int64_t>& rows, int top_k,
                          TopKTensors* out) {
  *out = TopKTensors();
  if (!logits.defined() || logits.dim() != 2) {
    return Status::InvalidArgument("logits must be [R, V >= 1] floating");
  }
  for (const int64_t r : rows) {
    if (r < 0 || r >= logits.size(0)) {
      return Status::InvalidArgument("row " + std::to_string(r) + " outside the logits' " +
                                     std::to_string(logits.size(0)));
    }
  }
  const at::Tensor index =
      ToDeviceAsync(at::tensor(rows, at::TensorOptions().dtype(at::kLong)), logits.device());
  TopKTensors on_device;
  SPECLOOP_RETURN_IF_ERROR(TopKLogProbs(logits.index_select(0, index), top_k, &on_device));
  // One copy: [ids | logprobs | tail] as float64 (exact for ids below 2^53 and for float32).
  const at::Tensor packed =
      at::cat({on_device.ids.to(at::kDouble), on_device.logprobs.to(at::kDouble),
               on_device.tail_mass.to(at::kDouble).unsqueeze(1)},
              1)
          .to(at::kCPU);
  const int64_t K = on_device.ids.size(1);
  out->ids = packed.narrow(1, 0, K).to(at::kLong);
  out->logprobs = packed.narrow(1, K, K).to(at::kFloat);
  out->tail_mass = packed.select(1, 2 * K).to(at::kFloat);
  return Status::OK();
}

}  // namespace spec
}  // namespace specloop
