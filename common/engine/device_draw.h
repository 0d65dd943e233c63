// Drafting's draws on the device (DecodeStep's device path, issue 48 item 2): one drafted
// position of several chains, drawn where the draft's logits are, so that a draft forward's
// [chains, vocab] logits never travel to the host; one copy of the chains' tokens comes back.
// The rule is the host proposers' (DraftModelProposer::Draw, FeatureDraftProposer::Draw): the
// early stop reads q before the draw (greedy: the softmax at temperature 1 of the argmax;
// sampled: q's largest entry, below min_confidence stops the chain), then greedy takes the
// argmax (lowest id on ties), sampled the inverse CDF of the processed row q
// (spec::ProcessedProbsTensor) at the next uniform of the row's stream. The tokens equal the
// host's with the same streams, up to float rounding at a CDF boundary or at min_confidence.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "common/base/rng.h"
#include "common/base/sampling.h"

namespace specloop {

struct DrawRow {
  SamplingParams sampling;     // the draft's processing of this row (seed unread)
  float min_confidence = 0.0f;  // 0: no early stop
  Rng* rng = nullptr;           // sampled: advanced by one uniform where the row draws
};

// Returns each row's token (an index into the logits' last dimension), -1 where its chain
// stops before drawing; *q: [rows, V] float32 on the logits' device, the processed rows (a
// greedy row one-hot), undefined where every row is greedy. Throws std::invalid_argument for
// invalid sampling, and what LibTorch throws.
//   logits: [rows, V] floating, any device; rows: one per logits row
std::vector<int64_t> DrawOnDevice(const at::Tensor& logits, const std::vector<DrawRow>& rows,
                                  at::Tensor* q);

// DrawOnDevice for rows that never stop early (min_confidence 0: every row draws), without the
// copy back: the tokens stay where the logits are, [rows] int64, for the next draft forward to
// read there (LlamaModel::Forward's token_ids), so that a chain's forwards queue one after
// another with no wait for the device. Each sampled row's stream advances by one uniform.
// Throws std::invalid_argument for a row with min_confidence > 0, and as DrawOnDevice.
at::Tensor DrawOnDeviceAsync(const at::Tensor& logits, const std::vector<DrawRow>& rows,
                             at::Tensor* q);

}  // namespace specloop
