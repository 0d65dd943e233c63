#include "common/engine/device_draw.h"

#include <ATen/ATen.h>

#include <stdexcept>

#include "common/spec/tensor_sampling.h"

namespace specloop {

std::vector<int64_t> DrawOnDevice(const at::Tensor& logits_in, const std::vector<DrawRow>& rows,
                                  at::Tensor* q) {
  *q = at::Tensor();
  const int64_t n = static_cast<int64_t>(rows.size());
  const at::Tensor logits = logits_in.to(at::kFloat);
  // The one upload beside the sampling parameters': per row its uniform (drawn from a copy of
  // its stream, kept only where the row draws), min_confidence and whether it is greedy.
  std::vector<SamplingParams> params;
  std::vector<Rng> streams;
  at::Tensor control = at::empty({n, 3}, at::kDouble);
  double* c = control.data_ptr<double>();
  bool any_sampled = false, any_stop = false;
  for (int64_t r = 0; r < n; ++r) {
    const DrawRow& row = rows[r];
    const bool greedy = row.sampling.greedy();
    params.push_back(row.sampling);
    streams.push_back(greedy ? Rng() : *row.rng);
    any_sampled = any_sampled || !greedy;
    any_stop = any_stop || row.min_confidence > 0.0f;
    c[r * 3 + 0] = greedy ? 0.0 : streams.back().Uniform();
    c[r * 3 + 1] = row.min_confidence;
    c[r * 3 + 2] = greedy ? 1.0 : 0.0;
  }
  const at::Tensor ctl = control.to(logits.device());
  const at::Tensor greedy = ctl.select(1, 2) > 0;
  const at::Tensor best = spec::ArgmaxLowestId(logits);
  at::Tensor token = best;
  if (any_sampled) {
    const Status s = spec::ProcessedProbsTensor(logits.unsqueeze(1), params, q);
    if (!s.ok()) throw std::invalid_argument("draft sampling: " + s.ToString());
    *q = q->squeeze(1);
    token = at::where(greedy, best, spec::InverseCdfTensor(*q, ctl.select(1, 0).contiguous()));
  }
  if (any_stop) {
    const at::Tensor top = at::softmax(logits, 1).gather(1, best.unsqueeze(1)).squeeze(1);
    const at::Tensor confidence = any_sampled ? at::where(greedy, top, q->amax(1)) : top;
    token = at::where(confidence < ctl.select(1, 1), at::full_like(token, -1), token);
  }
  const at::Tensor drawn = token.to(at::kCPU);  // the one copy back
  std::vector<int64_t> tokens(drawn.data_ptr<int64_t>(), drawn.data_ptr<int64_t>() + n);
  for (int64_t r = 0; r < n; ++r) {
    if (tokens[r] >= 0 && !params[r].greedy()) *rows[r].rng = streams[r];
  }
  return tokens;
}

}  // namespace specloop
