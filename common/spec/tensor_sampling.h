// The processed distributions of common/base/sampling.h (temperature, then top-k, then top-p;
// greedy as one-hot on the argmax) as batched tensor ops on the logits' device: the p and q
// rows that tensor_verify.h's verifier compares, without copying [rows, vocab] logits to the
// host. LibTorch; library specloop_spec_tensor.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "common/base/sampling.h"
#include "common/base/status.h"

namespace specloop {
namespace spec {

// ProcessedDistribution row by row, sequence b's rows under params[b] (its seed is not read):
// exp((x - max) / T) in float32 normalized by a float64 sum; top-k and top-p over the
// probabilities sorted descending with ties toward lower ids (a stable sort), top-p's cut at the
// first prefix whose float64 mass reaches top_p times the top-k set's mass (the whole set where
// rounding leaves it short), the kept entries renormalized; T == 0: one-hot on the argmax (lowest
// id on ties, NaN never the maximum). Equal to the host's up to float32 exp rounding (~1 ulp),
// which can move a top-p cut only where a prefix's mass is within rounding of the target.
// The parameters travel in one [B, 3] upload. Returns InvalidArgument (leaving *probs
// undefined) for logits not [B, R, V >= 1] floating, params.size() != B, or invalid params
// (SamplingParams::Validate).
//   logits: [B, R, V]; params: [B]; *probs: [B, R, V] float32 on the logits' device
Status ProcessedProbsTensor(const at::Tensor& logits, const std::vector<SamplingParams>& params,
                            at::Tensor* probs);

// common/base/sampling.h's Argmax along the last dimension: the index of the largest value,
// lowest index on ties, NaN never the largest (below -inf), 0 for a row of NaNs.
//   scores: [..., V] floating; returns [...] int64 on its device
at::Tensor ArgmaxLowestId(const at::Tensor& scores);

// common/base/sampling.h's SampleFrom per row: the first x whose cumulative mass exceeds
// u * total, the last positive entry where rounding leaves none; sums in float64. Equal to the
// host's draw at the same uniform except within float64 rounding of a CDF boundary.
//   dist: [B, V] non-negative; u: [B] float64 in [0, 1), same device; returns [B] int64
at::Tensor InverseCdfTensor(const at::Tensor& dist, const at::Tensor& u);

}  // namespace spec
}  // namespace specloop
