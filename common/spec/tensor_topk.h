// The top-K that replay logging keeps (buffer/record_builder.h's FillTopK), as tensor ops on the
// model's device: ids and log-probs of the K most likely tokens of each verified row, and the
// mass outside them, so that only [rows, K] values travel to the host. LibTorch; library
// specloop_spec_tensor.
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>

#include "common/base/status.h"

namespace specloop {
namespace spec {

struct TopKTensors {
  at::Tensor ids;        // [R, top_k] int64: larger logit first, ties toward the lower id
  at::Tensor logprobs;   // [R, top_k] float32: logit - logsumexp(row)
  at::Tensor tail_mass;  // [R] float32: clamp(1 - sum exp(logprobs), 0, 1)
};

// FillTopK's ranking and values on `logits`' device: log-probs at temperature 1 (the raw
// softmax), NaN logits rank last (their log-probs are NaN; the log-sum-exp leaves them out).
// When top_k > V the entries past V hold id 0 and log-prob -inf. Log-probs are computed in
// float32 (float64 for float64 input) and are not rounded to half as a record stores them.
// Returns InvalidArgument (outputs undefined) for logits not [R, V >= 1] floating or top_k <= 0.
//   logits: [R, V]
Status TopKLogProbs(const at::Tensor& logits, int top_k, TopKTensors* out);

// TopKLogProbs of the rows `rows` of `logits` (any device), brought to the host in one copy:
// *out's tensors on the CPU (ids int64, logprobs and tail_mass float32), row i of them
// `logits`' row rows[i], the same values TopKLogProbs gives on that device. An empty `rows`
// gives empty tensors. Returns InvalidArgument (outputs undefined) as TopKLogProbs does, or for
// a row outside [0, R).
Status TopKLogProbsToHost(const at::Tensor& logits, const std::vector<int64_t>& rows, int top_k,
                          TopKTensors* out);

}  // namespace spec
}  // namespace specloop
