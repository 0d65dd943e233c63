// Draft: what `--draft DIR` loads, of either kind: a draft model (a small LlamaModel sharing
// the target's vocabulary) or an EAGLE-3 head over the target's own features
// (common/model/eagle3_head.h). DIR/config.json's architecture tells which.
#pragma once

#include <memory>
#include <string>

#include "common/base/sampling.h"
#include "common/base/status.h"
#include "common/model/eagle3_head.h"
#include "common/model/llama_model.h"
#include "common/spec/proposer.h"

namespace specloop {

struct Draft {
  Draft() = default;
  Draft(std::unique_ptr<LlamaModel> m) : model(std::move(m)) {}  // NOLINT: a model draft
  Draft(std::unique_ptr<Eagle3Head> h) : head(std::move(h)) {}   // NOLINT: a head

  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<Eagle3Head> head;  // reads its target's embedding: the target outlives it

  explicit operator bool() const { return model != nullptr || head != nullptr; }
  // "model", "eagle3" or "none" (logs, metrics, status).
  const char* kind() const { return head ? "eagle3" : model ? "model" : "none"; }
};

// Loads DIR as a draft for `target`. A draft model loads with `model_load` (its own context
// limit: max_model_len 0, the draft stops drafting there) and must be CheckDraftCompatible
// with the target; a head loads on the target's device in the target's weight dtype (a
// 16-bit target's head streams half the bytes).
Status LoadDraft(const std::string& dir, const LlamaModel& target, const LoadOptions& model_load,
                 Draft* out);

// A proposer drafting with `draft` for one sequence sampled with `sampling`
// (DraftModelProposer, its cache in `pool`; or FeatureDraftProposer).
std::unique_ptr<Proposer> NewDraftProposer(const Draft& draft, const SamplingParams& sampling,
                                           float min_confidence,
                                           std::shared_ptr<KVBlockPool> pool = nullptr);

}  // namespace specloop
