// Chain verification as batched tensor ops on the model's device (issue 48 item 2): the same
// rule as chain_verify.h's VerifyChain / VerifyChainGreedy, for a whole batch at once, so that a
// GPU's [rows, vocab] logits need not be copied to the host. No model; LibTorch only (library
// specloop_spec_tensor, apart from the pure host library specloop_spec).
//
// One step is three calls:
//   1. ChainControl (host): each sequence's draft count and its k_b + 1 uniforms from its own Rng;
//   2. VerifyChainTensors / VerifyChainGreedyTensors: uploads the control in one copy, runs the
//      arithmetic on the device, returns one small packed int64 tensor there;
//   3. UnpackChainOutcomes: one host copy of the packed tensor, into ChainOutcomes.
//
// Packed layout, [B, K + 2] int64 on the device of the scores:
//   column 0:       num_accepted of sequence b in [0, k_b], or -1 when its input is invalid
//                   (a draft token outside [0, V), or a row it reads that has a negative or
//                   non-finite entry or no positive mass: what VerifyChain reports as
//                   InvalidArgument);
//   columns 1..K+1: the emitted tokens (num_accepted + 1 of them), then -1.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "common/base/rng.h"
#include "common/base/status.h"
#include "common/spec/chain_verify.h"

namespace specloop {
namespace spec {

// The host-side control of one step: [B, K + 2] float64 on the CPU. Row b holds k_b =
// num_drafts[b] in column 0, then k_b + 1 uniforms drawn in order by rngs[b]->Uniform() (exactly
// k_b + 1 draws, whatever is accepted), then zeros. With `rngs` empty no uniforms are drawn
// (enough for the greedy verifier). REQUIRES: 0 <= num_drafts[b] <= max_k, and rngs empty or
// of num_drafts.size() non-null entries.
at::Tensor ChainControl(const std::vector<int>& num_drafts, int max_k,
                        const std::vector<Rng*>& rngs);

// Random verification of B chains padded to K drafts. Sequence b verifies its first k_b drafts
// as VerifyChain does with the uniforms of its control row in the order VerifyChain draws them:
// position i accepts x = draft_tokens[b, i] iff u_i * q_i(x) < p_i(x) (q_i(x) == 0 rejects); at
// the first rejection i the recovered token is the inverse CDF of norm(max(0, p_i - q_i)) (of
// p_i where that has no mass) at u_{i+1}; after k_b acceptances the bonus token is the inverse
// CDF of p_{k_b} at u_{k_b}. k_b == 0 draws one token from p_0. Rows are normalized here.
// Arithmetic in float32 (float64 for float64 input; 16-bit input is widened), uniforms and CDF
// sums in float64: results equal VerifyChain's except where a uniform falls within rounding of
// an acceptance ratio or a CDF boundary.
// Returns InvalidArgument (leaving *packed undefined) for shapes that do not fit, a control
// that is not [B, K + 2] float64 on the CPU or holds a k_b outside [0, K], or non-floating
// probabilities; bad values of one sequence mark only its row (num_accepted -1).
//   target_probs: [B, K + 1, V] floating, any device; row i of b = p_i (rows past k_b ignored)
//   draft_probs:  [B, K, V] floating, same device; row i of b = q_i (rows past k_b - 1 ignored)
//   draft_tokens: [B, K] integral, same device (entries past k_b ignored)
//   control:      [B, K + 2] float64 on the CPU, from ChainControl
//   *packed:      [B, K + 2] int64 on the device of target_probs (layout above)
Status VerifyChainTensors(const at::Tensor& target_probs, const at::Tensor& draft_probs,
                          const at::Tensor& draft_tokens, const at::Tensor& control,
                          at::Tensor* packed);

// Greedy verification (VerifyChainGreedy per sequence): accepts draft i iff it equals the
// argmax of row i (lowest id on ties; NaN never the maximum; an all-NaN row's argmax is 0), emits
// the argmax at the first mismatch or of row k_b after k_b matches. Scores may be logits or
// probabilities of any floating dtype. Only column 0 of the control is read. Returns
// InvalidArgument as VerifyChainTensors does.
//   target_scores: [B, K + 1, V]; draft_tokens: [B, K]; control: [B, C >= 1] float64 on the CPU
Status VerifyChainGreedyTensors(const at::Tensor& target_scores, const at::Tensor& draft_tokens,
                                const at::Tensor& control, at::Tensor* packed);

// What one step's batch verification yields on the host.
struct ChainBatchOutcome {
  std::vector<ChainOutcome> outcomes;  // [B]; cleared where the sequence's input was invalid
  std::vector<Status> status;          // [B]; InvalidArgument where num_accepted was -1
};

// Copies `packed` to the host (the step's one device-to-host copy) and splits it per sequence.
// Returns InvalidArgument for a tensor not shaped [B, K + 2] int64, or with a row that breaks the
// layout (num_accepted outside [-1, K], fewer than num_accepted + 1 tokens).
Status UnpackChainOutcomes(const at::Tensor& packed, ChainBatchOutcome* out);

}  // namespace spec
}  // namespace specloop
