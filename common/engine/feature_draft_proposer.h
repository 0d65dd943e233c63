// FeatureDraftProposer: drafts chains with an EAGLE-3 head (common/model/eagle3_head.h) that
// reads the target's own hidden states, one proposer per sequence.
//
// The target's forward returns the features of every position it runs (LlamaModel::Forward
// with the head's aux layers); the decoder hands the proposer those of the positions it keeps
// (AddFeatures), at no extra target work. A block then runs the head over the positions fed
// since the last block (the head's cache keeps the target's features only: its own drafts are
// recomputed from the target's features once verified, as EAGLE does), and drafts on from its
// own output hidden state, one head forward per drafted token, each token drawn from the
// head's processed distribution q (greedy: its argmax) over the draft vocabulary, mapped to
// target ids; q rows are over the target's vocabulary (zero outside the draft vocabulary), so
// verification is the same exact rejection sampling as for any draft.
//
// Early stop as DraftModelProposer's (min_confidence, read before the draw). Chains only.
#pragma once

#include <vector>

#include <ATen/ATen.h>

#include "common/base/rng.h"
#include "common/base/sampling.h"
#include "common/model/eagle3_head.h"
#include "common/spec/proposer.h"

namespace specloop {

class FeatureDraftProposer : public Proposer {
 public:
  // REQUIRES: `head` outlives the proposer (or is replaced by SetHead first).
  FeatureDraftProposer(const Eagle3Head* head, const SamplingParams& sampling,
                       float min_confidence = 0.0f);

  // The target layers whose inputs the head reads (LlamaModel::Forward's `layers`).
  const std::vector<int>& feature_layers() const { return head_->config().aux_layers; }
  // The target's features [rows, head->feature_width()] of the sequence's positions first,
  // first + 1, ... (on the target's device). Positions must follow those given before, or
  // replace a suffix of them (a rolled-back or recomputed context); a gap drops what came
  // before (the head then starts its context at `first`).
  void AddFeatures(int64_t first, const at::Tensor& rows);

  void Propose(const std::vector<int>& context, int max_k, DraftBlock* out) override;
  double last_propose_seconds() const override { return last_seconds_; }
  // Positions whose features the next block must run beyond those of the last block verified.
  int64_t CatchUpTokens(const std::vector<int>& context) const override;
  CatchUp last_catch_up() const override { return last_catch_up_; }

  // Hot swap: the head's cache is rebuilt from the features still held (the positions fed to
  // the old head are gone: the new head's context starts after them). A head reading other
  // layers drops the features too.
  void SetHead(const Eagle3Head* head);
  const Eagle3Head* head() const { return head_; }

  // One Propose() for each of several sequences, their head forwards batched: the first runs
  // every sequence's new positions, then each drafted position of the chains still drafting.
  // REQUIRES: every proposer has the same head. `on_device`: the drafted positions are drawn
  // where the head's logits are (device_draw.h), as DraftModelProposer::ProposeBatch's (where
  // no chain stops early, the drawn tokens stay there until one copy after the last forward);
  // a sampled chain's q rows (over the target's vocabulary) stay there, device_probs().
  struct BatchItem {
    FeatureDraftProposer* proposer;
    const std::vector<int>* context;
    int max_k;
    DraftBlock* out;
  };
  static void ProposeBatch(const std::vector<BatchItem>& items, bool on_device = false);

  // The last block's q rows, [k, vocab] float32 on the head's device, where ProposeBatch drew a
  // sampled chain on the device; else undefined (q is in DraftBlock::probs, or greedy).
  const at::Tensor& device_probs() const { return device_probs_; }

 private:
  // Draws draft token i of at most max_k from the head's logits row (draft vocabulary) into
  // `out`; returns its target id, or -1 when the block ends before it.
  int Draw(const float* row, DraftBlock* out);
  // First target position whose features the head has not run.
  int64_t next_position() const { return base_ + fed_; }

  const Eagle3Head* head_;
  SamplingParams sampling_;
  float min_confidence_;
  Rng rng_;
  Eagle3Head::Cache cache_;
  int64_t base_ = 0;  // target position of cache slot 0 (RoPE is relative: slots count from 0)
  int64_t fed_ = 0;   // cache slots holding target features; slots after them hold drafts
  at::Tensor pending_;  // features of positions next_position(), ... not yet run
  int last_block_ = 0;  // tokens drafted by the last block
  std::vector<float> scratch_;
  at::Tensor device_probs_;              // see device_probs()
  std::vector<at::Tensor> device_rows_;  // its rows while ProposeBatch draws them
  double last_seconds_ = 0.0;
  CatchUp last_catch_up_;
};

}  // namespace specloop
