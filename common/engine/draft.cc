#include "common/engine/draft.h"

#include "common/engine/draft_model_proposer.h"
#include "common/engine/feature_draft_proposer.h"

namespace specloop {

Status LoadDraft(const std::string& dir, const LlamaModel& target, const LoadOptions& model_load,
                 Draft* out) {
  *out = Draft();
  if (IsEagle3Dir(dir)) {
    LoadOptions o;
    o.device = target.device().str();
    const at::ScalarType t = target.dtype();
    o.dtype = t == at::kHalf ? "float16" : t == at::kBFloat16 ? "bfloat16" : "float32";
    return Eagle3Head::Load(dir, target, o, &out->head);
  }
  LoadOptions o = model_load;
  o.max_model_len = 0;
  SPECLOOP_RETURN_IF_ERROR(LlamaModel::Load(dir, o, &out->model));
  Status s = CheckDraftCompatible(target.config(), out->model->config());
  if (!s.ok()) out->model.reset();
  return s;
}

std::unique_ptr<Proposer> NewDraftProposer(const Draft& draft, const SamplingParams& sampling,
                                           float min_confidence,
                                           std::shared_ptr<KVBlockPool> pool) {
  if (draft.head) {
    return std::make_unique<FeatureDraftProposer>(draft.head.get(), sampling, min_confidence);
  }
  return std::make_unique<DraftModelProposer>(draft.model.get(), sampling, min_confidence,
                                              std::move(pool));
}

}  // namespace specloop
