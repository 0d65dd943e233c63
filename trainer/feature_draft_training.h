// Feature-draft training: an EAGLE-3 head (common/model/eagle3_head.h) distilled toward its
// target on replay records with training-time test (the head unrolled on its own outputs, as it
// drafts at serving), and its held-out acceptance as the publish gate reads it.
//
// The target's features are recomputed, not logged: the trainer runs its own copy of the target
// over each record's tokens (one forward, no gradient), which also gives the target's FULL
// distribution at every position, prompt included (a record logs the top-K of the verified
// positions only). Logging them instead would multiply a record's size: a record of N tokens
// holds ~N x K log-probs, its features N x 3 x hidden values.
//
// Alignment, for a record of N tokens. Feature row t (0 <= t < N - 1) is the residual stream of
// the target entering the head's aux layers at position t. Row t of unrolled step j reads it with
// tokens[t + 1 .. t + j + 1] and predicts tokens[t + j + 2]; its target is the target's
// distribution at position t + j + 1 (the target's logits row there), restricted to the draft
// vocabulary and renormalized. Rows with t + j + 1 > N - 1 lie past the record and are masked.
// At serving, a block starting at a step's start_pos (buffer/record.h: the pending token is at
// start_pos - 1, the last verified position start_pos - 2) drafts tokens[start_pos + j] from
// step j at row start_pos - 2 (FeatureDraftProposer::ProposeBatch); evaluation reads exactly
// those rows.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "buffer/record.h"
#include "common/base/status.h"
#include "common/model/eagle3_head.h"
#include "common/model/llama_model.h"
#include "trainer/adamw.h"
#include "trainer/alpha_estimate.h"
#include "trainer/distill_loss.h"
#include "trainer/training_examples.h"

namespace specloop {
namespace trainer {

// One record as the head trains on it.
struct FeatureExample {
  std::string domain;
  // The record's tokens (cut at the target's context limit): N of them.
  std::vector<int64_t> tokens;
  // [N - 1, head.feature_width()] float32 on the target's device: positions 0 .. N - 2.
  // Undefined when N < 3 (nothing to predict): such an example is skipped.
  at::Tensor features;
  // [N - 1, head.draft_vocab_size()] float32: row r holds the target's log-probabilities at
  // position r + 1 (predicting tokens[r + 2]) over the draft vocabulary, renormalized. Only when
  // built with targets.
  at::Tensor target_logprobs;
  int64_t rows() const { return features.defined() ? features.size(0) : 0; }
};

// Runs `target` over the records (in forwards of at most kMaxForwardTokens tokens, a longer
// record alone) with no gradient and fills one example per record, in order. with_targets: also
// target_logprobs. The tensors are plain (not inference) tensors, usable as constants under
// autograd. IOError wraps a LibTorch failure.
Status BuildFeatureExamples(const LlamaModel& target, const Eagle3Head& head,
                            const std::vector<const Record*>& records, bool with_targets,
                            std::vector<FeatureExample>* out);

struct UnrollOptions {
  // Default: jsd:0.5, as the model drafts' (trainer/README.md).
  ObjectiveSpec objective{Objective::kJsd, 0.5};
  // Unrolled steps S (EAGLE-3 trains 7); a step's time grows with S. Default: 3.
  int steps = 3;
  // Step j's loss weighs step_decay^j (EAGLE-3's 0.8). Default: 0.8.
  double step_decay = 0.8;
};

// The head's logits over its draft vocabulary at every step for `ex`: Eagle3Head::
// ForwardUnrolled over its rows, the tokens past the record padded with id 0 (only rows masked
// above read them). [rows, draft_vocab] per step; autograd flows into the head's parameters
// when enabled. REQUIRES: ex.rows() > 0, steps >= 1.
std::vector<at::Tensor> UnrollHead(const Eagle3Head& head, const FeatureExample& ex, int steps);

// Per step j < o.steps, the sum over the example's valid rows (t < rows - j; none when
// j >= rows) of the objective's loss between the head's step-j distribution and the target's.
// REQUIRES: ex built with targets.
std::vector<at::Tensor> StepLossSums(const Eagle3Head& head, const FeatureExample& ex,
                                     const UnrollOptions& o);

// The training-time-test loss of a batch, backpropagated: sum_j w_j L_j / sum_j w_j with
// w_j = step_decay^j and L_j the mean loss over the batch's valid step-j rows, one example's
// forward and backward at a time (gradients accumulate into the parameters' .grad: the head's
// Parameters() with requires_grad set). *loss: its value (0 and no backward when the batch
// has no row). *domains (may be null) gets one entry per step-0 row trained. IOError wraps a
// LibTorch failure.
Status AccumulateHeadGradients(const LlamaModel& target, const Eagle3Head& head,
                               const std::vector<const Record*>& batch, const UnrollOptions& o,
                               double* loss, std::vector<std::string>* domains);

// The same loss and backward over examples already built with targets (BuildFeatureExamples',
// or others aligned as its are, e.g. from the forwards that sampled them: head_warmup.h).
Status AccumulateExampleGradients(const Eagle3Head& head,
                                  const std::vector<FeatureExample>& examples,
                                  const UnrollOptions& o, double* loss,
                                  std::vector<std::string>* domains);

// One optimizer step: ZeroGrad, AccumulateHeadGradients, optimizer->Step(lr_scale) (which
// clips). `optimizer` holds the head's Parameters().
Status HeadTrainStep(const LlamaModel& target, const Eagle3Head& head, AdamW* optimizer,
                     const std::vector<const Record*>& batch, const UnrollOptions& o,
                     double lr_scale, double* loss);

// The logged positions of `records` the head can be judged on (Positions::kGenerated rows
// j <= num_accepted of each step, as for a model draft, with start_pos >= 2: the head needs the
// features of start_pos - 2) in *positions (its inputs / logit_rows are not meaningful here),
// and the head's logits there in *logits [N, draft_vocab] float32 on the CPU: row n from step
// draft_index[n] at row predicted[n] - draft_index[n] - 2. Inference only (no gradient).
Status HeadLogitsAtLoggedPositions(const LlamaModel& target, const Eagle3Head& head,
                                   const std::vector<const Record*>& records,
                                   PositionBatch* positions, at::Tensor* logits);

// EstimateRecords (alpha_estimate.h) for a head: one RecordAlpha per record, the positions of
// HeadLogitsAtLoggedPositions scored under the record's sampling by ProcessedAcceptance over
// the draft vocabulary (what FeatureDraftProposer draws from), in groups of at most
// `batch_records` records and kMaxForwardTokens tokens. A record whose sampling is invalid
// gets no values. AlphaAccumulator::Add(RecordAlpha) builds the gate's estimate from them.
Status EstimateHeadRecords(const LlamaModel& target, const Eagle3Head& head,
                           const std::vector<Record>& records, int batch_records,
                           std::vector<RecordAlpha>* out);

}  // namespace trainer
}  // namespace specloop
