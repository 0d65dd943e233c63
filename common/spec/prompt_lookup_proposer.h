// PromptLookupProposer: drafts by n-gram match against the sequence's own context (prompt
// lookup decoding): finds the most recent earlier occurrence of the context's last n tokens
// (n from max_ngram down to min_ngram) and proposes the tokens that followed it. Costs no model
// forward. Drafts are deterministic, so q is one-hot on each drafted token.
//
// Example: context [1 2 3 4 2 3], n in [2, 3], k = 4: [2 3] occurred at positions 1-2 and was
// followed by [4 2 3]; the proposal is [4 2 3] (only 3 tokens follow).
#pragma once

#include "common/spec/proposer.h"

namespace specloop {

class PromptLookupProposer : public Proposer {
 public:
  // `vocab` sizes the one-hot rows; `greedy` leaves them out (verification needs none).
  PromptLookupProposer(int vocab, bool greedy, int min_ngram = 2, int max_ngram = 4)
      : vocab_(vocab), greedy_(greedy), min_ngram_(min_ngram), max_ngram_(max_ngram) {}

  void Propose(const std::vector<int>& context, int max_k, DraftBlock* out) override;

  // Of the last Propose(): the length of the n-gram it matched (0: no proposal).
  int match_length() const { return match_length_; }

 private:
  int vocab_;
  bool greedy_;
  int min_ngram_, max_ngram_;
  int match_length_ = 0;
};

}  // namespace specloop
