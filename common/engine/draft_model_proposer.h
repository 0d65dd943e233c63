// DraftModelProposer: drafts with a small LlamaModel sharing the target's vocabulary, one token
// per forward, each drawn from the draft's processed distribution q (the request's sampling
// params) or, under greedy decoding, its argmax. Keeps the draft's KV cache in step with the
// committed context, rolling back rejected drafts.
//
// Early stop: drafting ends at a position where the draft's most likely token has probability
// below `min_confidence` (the draft is unsure there, and its token is likely rejected), so a
// block may be shorter than asked. The decision reads q before the token is drawn, so a kept
// token still follows q and verification stays exact (as llama.cpp's --draft-p-min). Chains
// only: trees ignore it.
//
// Trees (set_tree_branching): depth d of the tree gives each node branching[d] children, drawn
// from the draft's distribution without replacement (greedy: its top tokens); one batched draft
// forward per level with tree attention. A block of depth k is asked for with max_k = k.
#pragma once

#include <memory>
#include <vector>

#include "common/base/sampling.h"
#include "common/model/llama_model.h"
#include "common/spec/proposer.h"

namespace specloop {

class DraftModelProposer : public Proposer {
 public:
  // REQUIRES: `draft` outlives this proposer and shares the target's vocabulary.
  // `sampling.seed` seeds the draft's own random draws (independent of the target's). The
  // draft's cache lies in `pool` (a server's, shared by its sequences; prefix caching when the
  // pool does it), or in a pool of its own when null.
  DraftModelProposer(const LlamaModel* draft, const SamplingParams& sampling,
                     float min_confidence = 0.0f, std::shared_ptr<KVBlockPool> pool = nullptr);

  void Propose(const std::vector<int>& context, int max_k, DraftBlock* out) override;
  double last_propose_seconds() const override { return last_seconds_; }
  int64_t CatchUpTokens(const std::vector<int>& context) const override;
  CatchUp last_catch_up() const override { return last_catch_up_; }

  // Chunked prefill: the forward feeding context[0, end) to the draft's cache (only what the
  // cache lacks), for the caller to run with others of the same draft model; empty tokens when
  // there is nothing to feed. A later Propose() then catches up on no more than the rest.
  // REQUIRES: end <= context.size().
  ForwardInput PrefillInput(const std::vector<int>& context, size_t end);

  // Points the proposer at another draft model (hot-swap), its cache in `pool` (as the
  // constructor's): the cache is rebuilt on next use.
  void SetDraft(const LlamaModel* draft, std::shared_ptr<KVBlockPool> pool = nullptr);

  // Takes cache blocks for `positions` in all (capped at the context limit): false, nothing
  // taken, when a bounded pool has too few. A server reserves before each step, so that no
  // draft forward runs out of blocks.
  bool ReserveCache(int64_t positions);
  // Preemption: publishes the committed full blocks of `context`, then returns every block to
  // the pool; the next Propose() or PrefillInput() adopts what the pool still caches and
  // computes the rest.
  void DropCache(const std::vector<int>& context);

  // One Propose() for each of several sequences, their draft forwards batched: the first feeds
  // every sequence's pending tokens in one forward, then each drafted position of all the
  // chains still drafting in one forward. Each proposer drafts what its own Propose() would
  // (the forward gives a row the same bits whatever else is in the batch); its
  // last_propose_seconds() and last_catch_up() get its share of the forwards (split by rows).
  // Tree proposers run their own Propose(). REQUIRES: every chain proposer has the same
  // draft model.
  //
  // `on_device` (DecodeStep's device path, device_chain_verify.h): each drafted position of the
  // chains is drawn where the draft's logits are, never copied to the host (device_draw.h).
  // Where no chain may stop early (min_confidence 0, as serving drafts) the drawn tokens stay
  // there too: each forward reads the last draw's (LlamaModel::Forward's token_ids), so the
  // forwards queue without waiting for the device, and one copy at the end brings every
  // chain's tokens back; otherwise one copy per forward. A sampled chain's q rows stay there
  // (device_probs()) and its DraftBlock::probs is left empty. The tokens are the host path's
  // with the same streams, up to float rounding at a CDF boundary or at min_confidence.
  struct BatchItem {
    DraftModelProposer* proposer;
    const std::vector<int>* context;
    int max_k;
    DraftBlock* out;
  };
  static void ProposeBatch(const std::vector<BatchItem>& items, bool on_device = false);

  // The last block's q rows, [k, V] float32 on the draft's device, where ProposeBatch drew a
  // sampled chain on the device; else undefined (q is in DraftBlock::probs, or greedy).
  const at::Tensor& device_probs() const { return device_probs_; }

  // Draft trees instead of chains: children per node at each depth (e.g. {3, 2, 1, 1}); empty
  // for chains. Verification needs a tree-aware verifier (SpeculativeDecoder handles both).
  void set_tree_branching(std::vector<int> branching) { branching_ = std::move(branching); }
  const std::vector<int>& tree_branching() const { return branching_; }
  // The last tree's level forwards (after the first, which feeds the context): the nodes each
  // fed (the whole tree so far) and its seconds, for the step cost table.
  struct LevelForward {
    int rows;
    double seconds;
  };
  const std::vector<LevelForward>& last_tree_forwards() const { return tree_forwards_; }

 private:
  // The forward input feeding the context tokens the cache lacks (after rolling back what the
  // context no longer has): its logits row is the next position's.
  ForwardInput FeedInput(const std::vector<int>& context);
  // Draws draft token i of a chain of at most max_k from the logits row `row` into `out`.
  // Returns the token to feed for the next position, or -1 when the block ends here.
  int Draw(const float* row, int i, int max_k, DraftBlock* out);
  // Appends the drawn draft token i to `out`; returns it when the next position is to be
  // drafted (it is fed), -1 when the block ends with it.
  int Keep(int token, int i, int max_k, DraftBlock* out);
  // Starts a block: clears `out` and the last block's timings.
  void Begin(DraftBlock* out);
  // An empty cache starts from the pool's cached blocks of context[0, limit).
  void Adopt(const std::vector<int>& context, size_t limit);
  // Length of the longest prefix of context[0, end) in the cache.
  size_t Common(const std::vector<int>& context, size_t end) const;
  // Length of the longest prefix of `context` in the cache, short of its last token (which
  // must be fed to get the next row).
  size_t Kept(const std::vector<int>& context) const;
  // Rolls the cache back to `keep` tokens and returns the forward feeding context[keep, end).
  ForwardInput Feed(const std::vector<int>& context, size_t keep, size_t end);

  // The first forward's `dt` split by the tokens each chain fed: a catch-up's share is its
  // last_catch_up_, a steady chain's is added to seconds[j] as its first timed forward.
  static void SplitFirstForward(const std::vector<const BatchItem*>& chains,
                                const std::vector<size_t>& fed, double dt,
                                std::vector<double>* seconds, std::vector<int>* forwards);
  // ProposeBatch's on-device path for chains none of which stops early (see ProposeBatch).
  static void ProposeChainsOnDevice(const std::vector<const BatchItem*>& chains);
  // Drafts a tree of depth <= max_k from `logits` (the row after the context) into `out`.
  void ProposeTree(int max_k, at::Tensor logits, DraftBlock* out, int* forwards);
  // Keeps in the cache only the path of the last tree that the context accepted.
  void SettleTree(const std::vector<int>& context);

  const LlamaModel* draft_;
  std::vector<int> branching_;
  // The last tree drafted, while its nodes sit in the cache: slot tree_past_ + i holds node i.
  DraftBlock tree_;
  int64_t tree_past_ = -1;
  std::vector<LevelForward> tree_forwards_;
  SamplingParams sampling_;
  float min_confidence_;
  Rng rng_;
  KVCache cache_;
  std::vector<int> cached_;  // the tokens in cache_, in order
  std::vector<float> scratch_;
  at::Tensor device_probs_;              // see device_probs()
  std::vector<at::Tensor> device_rows_;  // its rows while ProposeBatch draws them
  double last_seconds_ = 0.0;
  CatchUp last_catch_up_;
};

}  // namespace specloop
