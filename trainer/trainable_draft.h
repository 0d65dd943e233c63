// TrainableDraft: what the trainer distils, behind one interface, so that the loop, the gate,
// the checkpoint store and the publisher do not depend on the kind of draft:
//   - a draft MODEL (LlamaModel): trained on the logged top-K of the records' verified
//     positions (training_examples.h), evaluated by EstimateRecords (alpha_estimate.h);
//   - an EAGLE-3 feature HEAD (Eagle3Head): trained with training-time test against the full
//     distribution of the target the trainer runs itself, evaluated at the rows it drafts from
//     (feature_draft_training.h).
// Both write the same checkpoint files (config.json, model.safetensors), so checkpoints, the
// draft channel and serving's `--draft DIR` take either (the layout tells which: IsEagle3Dir).
//
// Thread safety: none (the trainer's one thread).
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "buffer/record.h"
#include "common/base/status.h"
#include "common/model/eagle3_head.h"
#include "common/model/llama_model.h"
#include "trainer/alpha_estimate.h"
#include "trainer/distill_loss.h"

namespace specloop {
namespace trainer {

struct DraftTrainingOptions {
  ObjectiveSpec objective{Objective::kJsd, 0.5};
  // Model drafts: backpropagate into a record's prompt too (TrainerOptions::context_gradient).
  bool context_gradient = false;
  // Heads: unrolled steps and their weight decay (UnrollOptions, feature_draft_training.h).
  int unroll_steps = 3;
  double step_decay = 0.8;
};

class TrainableDraft {
 public:
  virtual ~TrainableDraft() = default;

  // Loads the draft in DIR on `device` (float32): an EAGLE-3 head when IsEagle3Dir(DIR), which
  // needs `target` (non-null, outliving the draft; its features and embedding), else a draft
  // model (`target` unused). InvalidArgument when a head has no target.
  static Status Load(const std::string& dir, const LlamaModel* target, const std::string& device,
                     std::unique_ptr<TrainableDraft>* out);

  // "model" or "eagle3".
  virtual const char* kind() const = 0;
  // The trainable tensors (the optimizer's). From this call on the draft computes from them
  // (training-mode inference; see LlamaModel / Eagle3Head::Parameters()).
  virtual std::vector<at::Tensor> Parameters() = 0;
  // Forward and backward of the objective's mean loss over the batch's trained positions;
  // gradients accumulate into Parameters()' .grad. *loss: its value (0 and no backward when the
  // batch has no position); *domains gets one entry per trained position. IOError wraps a
  // LibTorch failure.
  virtual Status Backward(const std::vector<const Record*>& batch,
                          const DraftTrainingOptions& options, double* loss,
                          std::vector<std::string>* domains) = 0;
  // Held-out values per record (EstimateRecords' contract): the gate's numbers.
  virtual Status Estimate(const std::vector<Record>& records, int batch_records,
                          std::vector<RecordAlpha>* out) const = 0;
  // Writes DIR/config.json and DIR/model.safetensors (float32; DIR exists).
  virtual Status Write(const std::string& dir) const = 0;

  // The draft itself: the model of a "model" draft, the head of an "eagle3" one (else null).
  virtual LlamaModel* model() const { return nullptr; }
  virtual Eagle3Head* head() const { return nullptr; }
};

}  // namespace trainer
}  // namespace specloop
