// One decode step's chain blocks verified together on the logits' device (issue 48 item 2):
// DecodeStep's path for a target whose logits are not on the CPU (or when a test forces it), so
// that a step copies one small packed result to the host instead of every sequence's
// [k + 1, vocab] logits rows. The arithmetic is common/spec/tensor_verify.h's (VerifyChainTensors
// for sampled sequences, VerifyChainGreedyTensors for greedy ones) over the target's processed
// distributions (tensor_sampling.h's ProcessedProbsTensor, each sequence's SamplingParams); alpha*
// (the tested positions' sum min(p, q)) is computed there too and travels in the same copy.
//
// Per step: one upload of the rows' indices and draft tokens, one of the sampled sequences' q
// rows where they are in host memory (DraftBlock::probs; none where the draft drew on the
// device, DeviceChain::draft_probs), the control (counts and uniforms) and the sampling
// parameters; one [B, K + 3] int64 copy back.
//
// Uniforms: sequence b's k_b + 1 uniforms are the first draws of `rng` (a copy of its decoder's
// Rng), in the order VerifyChain draws them, so that its outcome equals the host verifier's with
// the same stream except where a uniform falls within float rounding of an acceptance ratio or a
// CDF boundary. A plain step (k_b == 0) draws its token as SampleToken does: argmax (greedy), else
// the inverse CDF of the processed row at one uniform (SampleFrom's rule).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "common/base/rng.h"
#include "common/base/sampling.h"
#include "common/base/status.h"
#include "common/spec/chain_verify.h"
#include "common/spec/proposer.h"

namespace specloop {

// A chain to verify (not a tree).
struct DeviceChain {
  int64_t first_row = 0;            // its k + 1 verified rows: logits[first_row, first_row + k]
  const DraftBlock* draft = nullptr;  // k tokens; sampled: probs [k, vocab] (host), else unread
  SamplingParams sampling;           // the target's processing of its rows (seed unread)
  Rng rng;                           // a copy of its stream: the uniforms are its first draws
  // Sampled, where the draft drew on the device (DraftModelProposer::device_probs()): its q
  // rows, [k, vocab] on any device, read instead of draft->probs; else undefined.
  at::Tensor draft_probs;
};

struct DeviceChainResult {
  Status status;               // InvalidArgument: this chain's input was invalid (outcome empty)
  spec::ChainOutcome outcome;  // num_accepted + 1 tokens
  // alpha* of its tested positions (the accepted ones and a first rejection): sum over them of
  // sum_x min(p, q) with p and q normalized (spec::AcceptanceRate; a row with a negative or
  // non-finite entry or no mass counts 0). Greedy: num_accepted.
  double optimal = 0.0;
};

// The tensor verifier's signature (spec::VerifyChainTensors); tests swap in a broken one.
using ChainTensorVerifier = Status (*)(const at::Tensor& target_probs,
                                       const at::Tensor& draft_probs,
                                       const at::Tensor& draft_tokens, const at::Tensor& control,
                                       at::Tensor* packed);

// Verifies every chain of `chains` against its rows of `logits`, filling results[i] for
// chains[i]. Returns InvalidArgument (results undefined) for logits not [rows, V] floating.
// A chain fails alone (its result's status InvalidArgument) for rows outside `logits`, a null
// draft or a tree, invalid sampling, a sampled chain whose q (draft_probs, else draft->probs) is
// not [k, V], or bad values
// (a token outside [0, V), a row it reads without mass or with a negative or non-finite entry).
// Throws what LibTorch throws.
//   logits: [rows, V] on any device; `verifier`: null is spec::VerifyChainTensors
Status VerifyChainsOnDevice(const at::Tensor& logits, const std::vector<DeviceChain>& chains,
                            std::vector<DeviceChainResult>* results,
                            ChainTensorVerifier verifier = nullptr);

}  // namespace specloop
