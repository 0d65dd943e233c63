#include "common/draft_model_proposer.h"

#include <chrono>

#include <c10/core/InferenceMode.h>

namespace specloop {

DraftModelProposer::DraftModelProposer(const LlamaModel* draft, const SamplingParams& sampling,
                                       float min_confidence)
    : draft_(draft),
      sampling_(sampling),
      min_confidence_(min_confidence),
      rng_(sampling.seed ^ 0x5eed0fd4af7ULL),
      cache_(draft->NewCache()) {}

void DraftModelProposer::SetDraft(const LlamaModel* draft) {
  draft_ = draft;
  cache_ = draft->NewCache();
  cached_.clear();
}

at::Tensor DraftModelProposer::CatchUp(const std::vector<int>& context) {
  size_t keep = 0;
  while (keep < cached_.size() && keep < context.size() && cached_[keep] == context[keep]) ++keep;
  if (keep == context.size()) --keep;  // the last token must be fed to get the next row
  cache_.Truncate(keep);
  cached_.resize(keep);
  std::vector<int64_t> feed(context.begin() + keep, context.end());
  cached_.insert(cached_.end(), context.begin() + keep, context.end());
  return draft_->Forward({{&cache_, std::move(feed), false}});
}

void DraftModelProposer::Propose(const std::vector<int>& context, int max_k, DraftBlock* out) {
  c10::InferenceMode guard;
  const auto t0 = std::chrono::steady_clock::now();
  out->Clear();
  const int V = draft_->config().vocab_size;
  const int limit = draft_->config().max_position_embeddings;
  if (max_k > 0 && !context.empty()) {
    at::Tensor logits = CatchUp(context);
    for (int i = 0; i < max_k; ++i) {
      const float* row = logits.data_ptr<float>();
      int token;
      float confidence;
      if (sampling_.greedy()) {
        token = Argmax(row, V);
        if (min_confidence_ > 0.0f) {
          Softmax(row, V, &scratch_);
          confidence = scratch_[token];
        } else {
          confidence = 1.0f;
        }
      } else {
        ProcessedDistribution(row, V, sampling_, &scratch_);
        token = SampleFrom(scratch_.data(), V, &rng_);
        confidence = scratch_[token];
      }
      if (confidence < min_confidence_) break;
      out->tokens.push_back(token);
      if (!sampling_.greedy()) out->probs.insert(out->probs.end(), scratch_.begin(), scratch_.end());
      // The last token of a block is never fed: its q is all verification needs.
      if (i + 1 == max_k || static_cast<int>(cached_.size()) + 1 >= limit) break;
      logits = draft_->Forward({{&cache_, {token}, false}});
      cached_.push_back(token);
    }
  }
  last_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace specloop
