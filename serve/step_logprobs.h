// The log-probs of the tokens one decode step emitted (DecodeSlot::emitted), from the target's
// logits rows that the step's on_commit receives (common/engine/decode_step.h): the server's
// scheduler and `specloop generate` read them there, so that whatever the speculation did
// (accepted drafts, suffix or lookup blocks, token trees, the bonus token) each value is the
// target's at that position, never the draft's.
#pragma once

#include <vector>

#include <ATen/ATen.h>

#include "common/engine/decode_step.h"
#include "serve/token_logprobs.h"

namespace specloop {

// Fills *out (resized to done.emitted.size()) with ComputeTokenLogprob of each emitted token
// under `sampling` with `top_n` alternatives. `rows`: the step's target rows as on_commit gets
// them (float32, CPU): a chain's verified rows are the last drafted + 1 (emitted token i at the
// i-th), a tree's the row before the tree, then its accepted path's nodes. Throws (c10::Error)
// on rows that do not hold the emitted tokens' positions.
void StepLogprobs(const DecodeSlot& done, const at::Tensor& rows, const SamplingParams& sampling,
                  int top_n, std::vector<float>* scratch, std::vector<TokenLogprob>* out);

}  // namespace specloop
