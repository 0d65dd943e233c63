#include "serve/step_logprobs.h"

namespace specloop {

void StepLogprobs(const DecodeSlot& done, const at::Tensor& rows, const SamplingParams& sampling,
                  int top_n, std::vector<float>* scratch, std::vector<TokenLogprob>* out) {
  const at::Tensor r = rows.contiguous();
  TORCH_CHECK(r.dim() == 2 && r.scalar_type() == at::kFloat && r.device().is_cpu(),
              "logprobs: float32 CPU rows expected");
  const int64_t n = r.size(0), vocab = r.size(1);
  const DraftBlock& block = done.decoder->draft();
  const int64_t drafted = static_cast<int64_t>(block.tokens.size());
  const std::vector<int>& path = done.decoder->last_tree_path();
  out->resize(done.emitted.size());
  for (size_t i = 0; i < done.emitted.size(); ++i) {
    int64_t row = n - (drafted + 1) + static_cast<int64_t>(i);
    if (block.is_tree()) {
      TORCH_CHECK(i <= path.size(), "logprobs: more tokens than the tree's path");
      row = i == 0 ? n - drafted - 1 : n - drafted + path[i - 1];
    }
    TORCH_CHECK(row >= 0 && row < n, "logprobs: no target row for an emitted token");
    ComputeTokenLogprob(r.data_ptr<float>() + row * vocab, static_cast<int>(vocab), sampling,
                        done.emitted[i], top_n, scratch, &(*out)[i]);
  }
}

}  // namespace specloop
