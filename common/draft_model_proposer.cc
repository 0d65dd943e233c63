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

at::Tensor DraftModelProposer::CatchUp(const std::vector<int>& context, size_t* fed) {
  size_t keep = 0;
  while (keep < cached_.size() && keep < context.size() && cached_[keep] == context[keep]) ++keep;
  if (keep == context.size()) --keep;  // the last token must be fed to get the next row
  cache_.Truncate(keep);
  cached_.resize(keep);
  std::vector<int64_t> feed(context.begin() + keep, context.end());
  *fed = feed.size();
  cached_.insert(cached_.end(), context.begin() + keep, context.end());
  return draft_->Forward({{&cache_, std::move(feed), false}});
}

void DraftModelProposer::Prefill(const std::vector<int>& context) {
  c10::InferenceMode guard;
  if (context.size() < 2) return;
  size_t fed = 0;
  CatchUp(std::vector<int>(context.begin(), context.end() - 1), &fed);
}

void DraftModelProposer::Propose(const std::vector<int>& context, int max_k, DraftBlock* out) {
  using Clock = std::chrono::steady_clock;
  c10::InferenceMode guard;
  out->Clear();
  last_seconds_ = 0.0;
  const int V = draft_->config().vocab_size;
  const int limit = draft_->config().max_position_embeddings;
  if (max_k > 0 && !context.empty()) {
    // A catch-up of the pending token (and the last draft, after a fully accepted block) is
    // the block's first forward; a longer one is owed work and is not timed.
    auto t0 = Clock::now();
    size_t fed = 0;
    at::Tensor logits = CatchUp(context, &fed);
    const bool steady = fed <= 2;
    if (!steady) t0 = Clock::now();
    int forwards = steady ? 1 : 0;
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
      ++forwards;
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    // Scale what was timed to one forward per drafted token; nothing timed: unknown.
    const int drafted = out->tokens.size();
    last_seconds_ = forwards > 0 ? seconds * drafted / forwards : (drafted > 0 ? -1.0 : 0.0);
  }
}

}  // namespace specloop
