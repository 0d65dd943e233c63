// DraftModelProposer: drafts with a small LlamaModel sharing the target's vocabulary, one token
// per forward, each drawn from the draft's processed distribution q (the request's sampling
// params) or, under greedy decoding, its argmax. Keeps the draft's KV cache in step with the
// committed context, rolling back rejected drafts.
//
// Early stop: drafting ends before a token whose own draft probability is below
// `min_confidence` (the draft expects it to be rejected), so a block may be shorter than asked.
#pragma once

#include <vector>

#include "common/llama_model.h"
#include "common/proposer.h"
#include "common/sampling.h"

namespace specloop {

class DraftModelProposer : public Proposer {
 public:
  // REQUIRES: `draft` outlives this proposer and shares the target's vocabulary.
  // `seed` seeds the draft's own random draws (independent of the target's).
  DraftModelProposer(const LlamaModel* draft, const SamplingParams& sampling,
                     float min_confidence = 0.0f);

  void Propose(const std::vector<int>& context, int max_k, DraftBlock* out) override;
  double last_propose_seconds() const override { return last_seconds_; }
  void Prefill(const std::vector<int>& context) override;

  // Points the proposer at another draft model (hot-swap): the cache is rebuilt on next use.
  void SetDraft(const LlamaModel* draft);

 private:
  // Feeds context tokens the cache lacks (after rolling back what the context no longer has)
  // and returns the logits row for the next position; `*fed` = tokens fed.
  at::Tensor CatchUp(const std::vector<int>& context, size_t* fed);

  const LlamaModel* draft_;
  SamplingParams sampling_;
  float min_confidence_;
  Rng rng_;
  KVCache cache_;
  std::vector<int> cached_;  // the tokens in cache_, in order
  std::vector<float> scratch_;
  double last_seconds_ = 0.0;
};

}  // namespace specloop
