// Proposer: where draft tokens come from. Correctness never depends on the proposer (the
// verifier makes the output follow the target exactly); only speed does.
//
// Shaped like llama.cpp's common_speculative (begin/draft/accept) and vLLM's proposers: one
// object per sequence, told the committed context before each proposal.
#pragma once

#include <cstdint>
#include <vector>

namespace specloop {

// A block of draft tokens for one sequence: a chain, or a tree of candidates.
struct DraftBlock {
  std::vector<int> tokens;   // [k] proposed tokens, k may be 0
  // Tree drafts: parents[i] is the index of token i's parent, -1 for a child of the context's
  // last token; REQUIRES parents[i] < i, and siblings distinct (drawn without replacement).
  // Empty: a chain (parents[i] = i - 1).
  std::vector<int> parents;
  // Row-major [rows, vocab]: row r is the processed draft distribution the children of node
  // r - 1 were drawn from (row 0: the children of the context's last token). A chain has k
  // rows (row i: q of tokens[i]); a tree has k + 1 (rows of childless nodes unused). Empty
  // under greedy decoding, where verification needs no q.
  std::vector<float> probs;
  bool is_tree() const { return !parents.empty(); }
  void Clear() {
    tokens.clear();
    parents.clear();
    probs.clear();
  }
};

class Proposer {
 public:
  virtual ~Proposer() = default;

  // Proposes at most `max_k` tokens continuing `context` (every token of the sequence so far,
  // prompt included). Rejected drafts of an earlier call are not in `context`: a stateful
  // proposer rolls its own state back to the longest prefix it shares with `context`.
  virtual void Propose(const std::vector<int>& context, int max_k, DraftBlock* out) = 0;

  // Steady-state seconds of the last Propose(): its model forwards, excluding a catch-up
  // (below); 0 for free proposers; negative when the call measured nothing usable. The cost
  // model of adaptive speculation reads it.
  virtual double last_propose_seconds() const { return 0.0; }

  // Catch-up: context tokens a stateful proposer must process before it can draft after
  // `context`, beyond the one or two every block feeds (the pending token, and the last draft
  // after a fully accepted block). The whole prompt before a sequence's first block, the
  // tokens decoded plainly since its last block, everything after a draft swap: work that a
  // switch to speculation owes, which adaptive speculation prices. 0 for free proposers.
  virtual int64_t CatchUpTokens(const std::vector<int>& context) const { return 0; }
  // The catch-up done by the last Propose(): tokens, and seconds they took (0, 0 when none).
  struct CatchUp {
    int64_t tokens = 0;
    double seconds = 0.0;
  };
  virtual CatchUp last_catch_up() const { return {}; }
};

// Asks `first` (e.g. free prompt lookup) and, when it proposes nothing, `second` (e.g. the draft
// model). Both must outlive this object.
class FallbackProposer : public Proposer {
 public:
  FallbackProposer(Proposer* first, Proposer* second) : first_(first), second_(second) {}

  void Propose(const std::vector<int>& context, int max_k, DraftBlock* out) override {
    first_->Propose(context, max_k, out);
    seconds_ = first_->last_propose_seconds();
    catch_up_ = first_->last_catch_up();
    if (out->tokens.empty()) {
      second_->Propose(context, max_k, out);
      const double s = second_->last_propose_seconds();
      seconds_ = s < 0 || seconds_ < 0 ? -1.0 : seconds_ + s;
      const CatchUp c = second_->last_catch_up();
      catch_up_.tokens += c.tokens;
      catch_up_.seconds += c.seconds;
    }
  }
  double last_propose_seconds() const override { return seconds_; }
  int64_t CatchUpTokens(const std::vector<int>& context) const override {
    return first_->CatchUpTokens(context) + second_->CatchUpTokens(context);
  }
  CatchUp last_catch_up() const override { return catch_up_; }

 private:
  Proposer* first_;
  Proposer* second_;
  double seconds_ = 0.0;
  CatchUp catch_up_;
};

}  // namespace specloop
