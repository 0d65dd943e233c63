// SuffixIndex and SuffixProposer: model-free drafts from earlier requests (as Snowflake's
// SuffixDecoding, Oliaro et al. 2024, and its ArcticInference implementation). One index per
// domain holds the prompts and outputs of recent finished requests; the proposer finds the
// longest suffix of the current context that occurs in it and proposes what most often followed.
//
// The index is a depth-limited, path-compressed suffix trie (a suffix tree cut at `max_depth`):
// every suffix of every retained sequence, truncated to max_depth tokens, is a path from the
// root, and each node counts the occurrences of its string (occurrences of strings of at most
// max_depth tokens, exactly). An edge's label is not copied: it is read from the retained
// sequence its node references, the newest one through that node. Every node is branching, a
// leaf, or the end of a suffix (merged otherwise), so nodes <= 2 * retained tokens + 1.
//
// Memory is bounded by `max_tokens` retained tokens: Add() evicts the oldest sequences
// (first in, first out) until the rest fit, by removing their suffixes (decrementing counts along
// each path, freeing nodes that reach zero, merging a node left with one child). Eviction in
// insertion order is what keeps every edge label readable: a node's reference is the newest
// sequence through it, so once that sequence goes, every older one has gone and the node too.
// An index holds at most 2 nodes per retained token plus the root (tested); a node is 48 bytes
// plus its entry in its parent's child array, a token 4 bytes. num_nodes() gives the count.
//
// Costs: Add(n tokens) and the eviction of n tokens walk n suffixes of at most max_depth tokens,
// a child lookup (binary search over the node's children) per node passed: O(n * max_depth *
// log fanout), eviction included. Speculate() is O(max_match^2) token comparisons for the
// lookup plus O(k * fanout) for the walk, no model forward.
//
// The score is SuffixDecoding's: a drafted token's empirical probability is count(child) /
// count(parent) (at a node, the most frequent child; inside an edge, 1), and the walk proposes
// while the running product of these probabilities stays >= min_prob. The sum of the running
// products is the expected number of accepted draft tokens if the target followed the index's
// statistics. A string seen once has probability 1 throughout: the estimate is optimistic on a
// match of few occurrences, which match_length() and match_count() let a caller discount.
//
// Thread-safety: none. The index is read by one proposer at a time and updated (Add) between
// decode steps, all on one thread (the scheduler's); a proposer holds a pointer to it.
#pragma once

#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "common/spec/proposer.h"

namespace specloop {

class SuffixIndex {
 public:
  struct Options {
    // Deepest string indexed: bounds a proposal to max_depth - match length tokens, and the cost
    // of Add to max_depth lookups per token. 64 = the proposer's 32-token match plus 32 tokens
    // of continuation (k_max is 8 today). Memory hardly depends on it (a compressed trie).
    int max_depth = 64;
    // Retained tokens (prompts and outputs) at most; the oldest sequences go first. 1M tokens is
    // a few thousand requests of a domain at ~70 bytes a token (see above).
    int64_t max_tokens = int64_t{1} << 20;
  };

  // The greedy continuation of a context (Speculate).
  struct Speculation {
    std::vector<int> tokens;
    std::vector<double> probs;  // [tokens] running products of empirical probabilities
    int match_length = 0;       // context tokens matched; 0: no match with a continuation
    int64_t match_count = 0;    // occurrences of the matched string in the index
    double expected_accepted() const;  // sum of probs
  };

  SuffixIndex() : SuffixIndex(Options{}) {}
  explicit SuffixIndex(const Options& options);

  // Indexes `sequence` (a finished request's prompt and output, or any token sequence), then
  // evicts the oldest sequences while more than max_tokens are retained. A sequence longer than
  // max_tokens keeps its last max_tokens tokens. Empty sequences are ignored.
  void Add(const std::vector<int>& sequence);

  // The longest suffix of `context` of at most `max_match` tokens that occurs in the index
  // followed by at least one token; from there the greedy walk (most frequent child, ties to the
  // newest) of at most `max_k` tokens while the running product of probabilities is
  // >= `min_prob`. Fills `out` (emptied first; no match: no tokens, match_length 0).
  void Speculate(const std::vector<int>& context, int max_match, int max_k, double min_prob,
                 Speculation* out) const;

  // Occurrences of tokens[0..n) in the retained sequences; REQUIRES 0 < n <= max_depth.
  int64_t Count(const int* tokens, int n) const;

  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_sequences() const { return static_cast<int64_t>(seqs_.size()); }
  int64_t num_nodes() const { return static_cast<int64_t>(nodes_.size() - free_.size()); }
  const Options& options() const { return options_; }

 private:
  struct Node {
    int64_t seq = -1;   // id of the newest sequence through this node: its label's source
    int32_t end = 0;    // position in `seq` of the node's last token
    int32_t len = 0;    // edge length: tokens from the parent to this node (0 for the root)
    int32_t count = 0;  // occurrences of the node's string (suffixes through or ending here)
    std::vector<std::pair<int32_t, int32_t>> children;  // (first token, node), by token
  };
  // A point in the trie: `off` tokens (1..len) into the edge of `node`; off == len: at the node.
  struct Point {
    int32_t node;
    int32_t off;
  };

  int Label(int node, int j) const;  // token j (0-based) of `node`'s edge
  int FindChild(int node, int token) const;
  void SetChild(int node, int token, int child);  // adds or replaces
  void EraseChild(int node, int token);
  int NewNode(int64_t seq, int end, int len, int count);
  void FreeNode(int node);
  // Walks tokens[0..n) from the root; false when they do not occur.
  bool Walk(const int* tokens, int n, Point* at) const;
  void InsertSuffix(int64_t id, const std::vector<int>& s, int i);
  void RemoveSuffix(const std::vector<int>& s, int i);
  void EvictOldest();

  Options options_;
  std::deque<std::vector<int>> seqs_;  // retained sequences, oldest first
  int64_t first_id_ = 0;               // id of seqs_.front()
  int64_t num_tokens_ = 0;
  std::vector<Node> nodes_;            // nodes_[0]: the root
  std::vector<int32_t> free_;          // freed node slots
  mutable std::vector<int32_t> path_;  // scratch of RemoveSuffix
};

// Proposes the index's greedy continuation of the context (SuffixIndex::Speculate). Drafts are
// deterministic, so q is one-hot on each drafted token: `probs` holds one-hot rows when
// sampling, none under greedy decoding, like PromptLookupProposer.
class SuffixProposer : public Proposer {
 public:
  // SuffixDecoding's default (ArcticInference's min_token_prob): a token whose estimated chance
  // of acceptance is under 10% adds under 0.1 expected tokens but costs a verified row.
  static constexpr double kDefaultMinProb = 0.1;
  // Longest context suffix looked up: lookup costs O(max_match^2), and 32 tokens of shared
  // context already pin a recurring template down; longer matches add little.
  static constexpr int kDefaultMaxMatch = 32;

  // `vocab` sizes the one-hot rows; `greedy` leaves them out. `index` (not owned) must outlive
  // this object; it may change between calls (Add), never during one.
  SuffixProposer(int vocab, bool greedy, const SuffixIndex* index, int max_match = kDefaultMaxMatch,
                 double min_prob = kDefaultMinProb)
      : vocab_(vocab), greedy_(greedy), max_match_(max_match), min_prob_(min_prob), index_(index) {}

  void Propose(const std::vector<int>& context, int max_k, DraftBlock* out) override;

  // Of the last Propose(): the expected number of accepted draft tokens (sum over positions of
  // the running product of empirical probabilities; 0 for an empty proposal), to compare with
  // the draft model's; and the match it came from (length 0: none).
  double expected_accepted() const { return last_.expected_accepted(); }
  int match_length() const { return last_.match_length; }
  int64_t match_count() const { return last_.match_count; }
  // Running products of the last proposal, one per drafted token.
  const std::vector<double>& token_probs() const { return last_.probs; }

 private:
  int vocab_;
  bool greedy_;
  int max_match_;
  double min_prob_;
  const SuffixIndex* index_;
  SuffixIndex::Speculation last_;
};

}  // namespace specloop
