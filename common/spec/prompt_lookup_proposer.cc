#include "common/spec/prompt_lookup_proposer.h"

#include <algorithm>

namespace specloop {

void PromptLookupProposer::Propose(const std::vector<int>& context, int max_k, DraftBlock* out) {
  out->Clear();
  match_length_ = 0;
  const int len = static_cast<int>(context.size());
  if (max_k <= 0) return;
  for (int n = std::min(max_ngram_, len - 1); n >= min_ngram_; --n) {
    const int* tail = context.data() + len - n;
    // The most recent earlier match wins: it reflects the freshest context.
    for (int start = len - n - 1; start >= 0; --start) {
      if (!std::equal(tail, tail + n, context.data() + start)) continue;
      const int from = start + n;
      const int k = std::min(max_k, len - from);
      match_length_ = n;
      out->tokens.assign(context.begin() + from, context.begin() + from + k);
      if (!greedy_) {
        out->probs.assign(static_cast<size_t>(k) * vocab_, 0.0f);
        for (int i = 0; i < k; ++i) out->probs[static_cast<size_t>(i) * vocab_ + out->tokens[i]] = 1.0f;
      }
      return;
    }
  }
}

}  // namespace specloop
