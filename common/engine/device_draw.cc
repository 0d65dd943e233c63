#include "common/engine/device_draw.h"

#include <ATen/ATen.h>

#include <stdexcept>

#include "common/spec/tensor_sampling.h"
#include "common/spec/tensor_upload.h"

namespace specloop {
namespace {

// The rows' tokens on the logits' device, -1 where a chain stops; streams[r]: row r's stream
// advanced by the one uniform a sampled row draws with.
at::Tensor DrawTokens(const at::Tensor& logits_in, const std::vector<DrawRow>& rows,
                      at::Tensor* q, std::vector<Rng>* streams) {
  *q = at::Tensor();
  const int64_t n = static_cast<int64_t>(rows.size());
  const at::Tensor logits = logits_in.to(at::kFloat);
  // The one upload beside the sampling parameters': per row its uniform (drawn from a copy of
  // its stream), min_confidence and whether it is greedy.
  std::vector<SamplingParams> params;
  at::Tensor control = at::empty({n, 3}, at::kDouble);
  double* c = control.data_ptr<double>();
  bool any_sampled = false, any_stop = false;
  for (int64_t r = 0; r < n; ++r) {
    const DrawRow& row = rows[r];
    const bool greedy = row.sampling.greedy();
    params.push_back(row.sampling);
    streams->push_back(greedy ? Rng() : *row.rng);
    any_sampled = any_sampled || !greedy;
    any_stop = any_stop || row.min_confidence > 0.0f;
    c[r * 3 + 0] = greedy ? 0.0 : streams->back().Uniform();
    c[r * 3 + 1] = row.min_confidence;
    c[r * 3 + 2] = greedy ? 1.0 : 0.0;
  }
  const at::Tensor ctl = spec::ToDeviceAsync(control, logits.device());
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
  return token;
}

}  // namespace

std::vector<int64_t> DrawOnDevice(const at::Tensor& logits, const std::vector<DrawRow>& rows,
                                  at::Tensor* q) {
  std::vector<Rng> streams;
  const at::Tensor drawn = DrawTokens(logits, rows, q, &streams).to(at::kCPU);  // the one copy
  const int64_t n = static_cast<int64_t>(rows.size());
  std::vector<int64_t> tokens(drawn.data_ptr<int64_t>(), drawn.data_ptr<int64_t>() + n);
  for (int64_t r = 0; r < n; ++r) {
    if (tokens[r] >= 0 && !rows[r].sampling.greedy()) *rows[r].rng = streams[r];
  }
  return tokens;
}

at::Tensor DrawOnDeviceAsync(const at::Tensor& logits, const std::vector<DrawRow>& rows,
                             at::Tensor* q) {
  for (const DrawRow& row : rows) {
    if (row.min_confidence > 0.0f) {
      throw std::invalid_argument("DrawOnDeviceAsync: a row that may stop early");
    }
  }
  std::vector<Rng> streams;
  at::Tensor tokens = DrawTokens(logits, rows, q, &streams);
  for (size_t r = 0; r < rows.size(); ++r) {
    if (!rows[r].sampling.greedy()) *rows[r].rng = streams[r];
  }
  return tokens;
}

}  // namespace specloop
