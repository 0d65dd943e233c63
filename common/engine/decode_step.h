// DecodeStep: one step of speculative decoding over a batch of sequences, the one decode loop
// of the server's scheduler, `specloop generate` (SpeculativeGeneration, a batch of one) and
// spec_bench. For every sequence it
//   1. picks k: fixed, or its SpeculationPolicy's choice for this batch size, context,
//      catch-up and remaining tokens, priced by the StepCostTable; with a suffix proposer or
//      prompt lookup (adaptive k only), the model-free block that promises the most tokens per
//      second instead, where it beats that k (see SuffixAcceptance); with a TreeAcceptance, a
//      token tree where it promises more than that k. The choice reads the context and past
//      steps only, so verification stays exact. Where the table says the batch's plain step
//      is due to be measured again (StepCostTable::PlainRefreshDue), every slot with a policy
//      decodes plainly instead, no block of any kind;
//   2. drafts: the sequences that draft with a model together (DraftModelProposer::ProposeBatch:
//      one batched draft forward per drafted position), those that draft from the target's
//      features likewise (FeatureDraftProposer::ProposeBatch), the others through their
//      proposer; the slot's `kind` names the plan taken (where the step verifies on the
//      device, the draft model's and the head's chains are drawn there: device_draw.h);
//   3. runs ONE target forward over every sequence's pending token and drafts (returning the
//      features a feature draft reads, when a slot has one);
//   4. verifies each sequence's rows (SpeculativeDecoder::Commit, exact; on a device, or where
//      DecodeStepOptions ask, the chains together on the logits' device, device_chain_verify.h)
//      and calls its `on_commit` (the server's sample logger), inside the step's timing;
//   5. feeds the measured costs to the table (the forward with its verification by rows and
//      attended context, the batched draft forwards, the catch-ups) and each outcome to its
//      sequence's policy.
// An exception while drafting, in the target forward or while verifying fails only the
// sequences it touched (`error` set; the batch's draft or target forward touches them all);
// the rest go on. Callers handle the outcome: metrics, text, finishing.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/engine/device_chain_verify.h"
#include "common/engine/draft_model_proposer.h"
#include "common/engine/feature_draft_proposer.h"
#include "common/engine/speculative_decoder.h"
#include "common/spec/acceptance_estimator.h"
#include "common/spec/prompt_lookup_proposer.h"
#include "common/spec/speculation_policy.h"
#include "common/spec/step_cost_table.h"
#include "common/spec/suffix_proposer.h"
#include "common/spec/tensor_topk.h"

namespace specloop {

// The acceptance of suffix-proposer blocks in one domain, per tested token, kept apart by the
// length of the context match a block came from: a long match (a recurring prompt, an output
// seen before) is a different bet from a short one (a common phrase), and failures of the
// short ones must not lock the long ones out. A block of n tokens from a match of m is
// taken, cut to n <= m tokens (ArcticInference's max_spec_factor 1), when
//   (1 + min(index estimate, tau(alpha[bucket(m)], n) - 1)) / target seconds of n + 1 rows
// beats the policy's expected rate at its k (its n rows cost no draft forward). The buckets'
// priors (over 8 tokens, half-life 32 steps as the policy's) rise with the match length, 0.3
// to 0.6: a short match is weak evidence, and each failed block costs a step of the draft's
// tokens, so short matches must earn their use while long ones are tried at once. A bucket
// whose estimate keeps losing still has the first token of every 32nd lost block verified, so
// that its estimate can rise where the traffic turns repetitive; a one-token probe costs the
// step at most the draft's expected tokens less one or two.
struct SuffixAcceptance {
  static constexpr int kBuckets = 4;  // match lengths 1-3, 4-7, 8-15, 16 and more
  static constexpr int kProbeInterval = 32;
  static int Bucket(int match_length) {
    return match_length < 4 ? 0 : match_length < 8 ? 1 : match_length < 16 ? 2 : 3;
  }
  spec::AcceptanceEstimator by_match[kBuckets] = {{0.3, 8, 32}, {0.4, 8, 32}, {0.5, 8, 32},
                                                  {0.6, 8, 32}};
  int64_t lost[kBuckets] = {};  // blocks that lost to the draft, for the probes
};

// Token trees on offer beside chains (adaptive k only; DraftModelProposer::set_tree_branching),
// per domain and draft version: the tree's shape, its per-depth acceptance (the chance that
// some child of an accepted node is accepted, a chain's alpha where each node has one child),
// and the steps it lost. A step drafts a tree of depth d where
//   tau(alpha_tree, d) / (batch * tree_draft(d) + target(batch * (nodes(d) + 1), L))
// beats the policy's expected rate at its k: tree_draft(d) is the draft's forwards for one
// sequence (the first feeds the context, each next one the tree so far: draft(nodes(j)) from
// the step cost table), not batched across sequences, so trees pay mostly at small batches.
// As for suffix blocks, every kProbeInterval-th lost step drafts a tree anyway, so that its
// alpha is measured (a tree's prior is the policy's, which a chain's measured alpha usually
// beats).
struct TreeAcceptance {
  static constexpr int kProbeInterval = 32;
  explicit TreeAcceptance(std::vector<int> branching_) : branching(std::move(branching_)) {}
  // Nodes of a tree of `depth` levels (depth <= branching.size()).
  int Nodes(int depth) const;
  // Expected tokens per second of one sequence's tree step of `depth`, in a batch.
  double Rate(const StepCostTable& costs, int depth, int batch, int64_t context) const;

  std::vector<int> branching;  // children per node at each depth
  spec::AcceptanceEstimator alpha{0.6, 8, 32};
  int64_t lost = 0;
};

// Where a step's block came from: the plan DecodeStep chose for a sequence.
enum class BlockKind {
  kNone,          // no block: a plain decoding step (k = 0)
  kDraftModel,    // a chain from the draft model (DraftModelProposer)
  kFeatureDraft,  // a chain from the EAGLE-3 head over the target's features
  kTree,          // a token tree from the draft model
  kSuffix,        // a model-free block from the domain's earlier requests (SuffixProposer)
  kLookup,        // a model-free block from the sequence's own context (prompt lookup)
  kProposer,      // any other proposer's block (DecodeSlot::proposer)
};
const char* BlockKindName(BlockKind kind);
inline bool IsModelFree(BlockKind kind) {
  return kind == BlockKind::kSuffix || kind == BlockKind::kLookup;
}

struct DecodeSlot {
  // Set by the caller (not owned).
  SpeculativeDecoder* decoder = nullptr;
  Proposer* proposer = nullptr;                  // the decoder's proposer
  DraftModelProposer* draft_proposer = nullptr;  // = proposer when it drafts with a model
  // = proposer when it drafts from the target's features (an EAGLE-3 head). Every slot with
  // one in a step must share its head (the target forward returns its layers' features).
  FeatureDraftProposer* feature_proposer = nullptr;
  SpeculationPolicy* policy = nullptr;           // null: fixed_k
  // False while the slot has nothing to draft with (a server that started without a draft and
  // has none yet): k is 0, and only model-free blocks are on offer.
  bool can_draft = true;
  int fixed_k = 0;
  // Optional (adaptive k only): a suffix proposer over the domain's earlier requests, and the
  // per-token acceptance of its blocks (its own estimator, not the policy's).
  SuffixProposer* suffix = nullptr;
  SuffixAcceptance* suffix_acceptance = nullptr;
  // Optional (adaptive k only): prompt lookup over the sequence's own context, and the
  // acceptance of its blocks, priced as the suffix proposer's (without an index estimate); the
  // step takes whichever model-free block promises the most, where it beats the policy's k.
  PromptLookupProposer* lookup = nullptr;
  SuffixAcceptance* lookup_acceptance = nullptr;
  // Optional (adaptive k, draft_proposer set): token trees on offer (TreeAcceptance); the step
  // sets the draft proposer's branching to the tree's or to none.
  TreeAcceptance* tree = nullptr;
  // Called after verification with this step's target rows (float32, CPU; the last drafted + 1
  // are the verified ones; the block is decoder->draft()); its time counts as the rows' cost.
  // May throw (the slot fails). The rows are undefined where logged_top_k holds the step and
  // the slot does not ask for them (commit_needs_rows false).
  std::function<void(const DecodeSlot&, const at::Tensor& rows)> on_commit;
  // Replay logging's K (0: none; needs on_commit). Where the step verifies this slot's chain
  // on the logits' device, DecodeStep takes the top-K of its verified rows there
  // (spec::TopKLogProbsToHost: every such slot's in one call, one copy to the host) into
  // logged_top_k before on_commit, so that only [k + 1, K] values travel instead of the rows.
  int log_top_k = 0;
  bool commit_needs_rows = true;  // false: on_commit reads logged_top_k alone where it is set
  // Tests only (null in serving, `generate` and the benches): called once this step's block is
  // drafted (decoder->draft(), non-empty), before the target forward; false drops the block and
  // the step decodes plainly, as when a block does not fit. Must not throw. Exactness REQUIRES
  // that a step's plan depend on the context and past steps only: tests install a review that
  // peeks at this step's target sample to show that their statistic catches such a chooser.
  std::function<bool(const DecodeSlot&)> review_block_for_testing;

  // This step's outcome; the block verified is decoder->draft() until the next step.
  int k = 0;                      // asked (a tree's: its depth)
  BlockKind kind = BlockKind::kNone;  // the plan taken (kNone when k is 0)
  SuffixAcceptance* used_acceptance = nullptr;  // a model-free block: priced by this,
  int suffix_bucket = 0;          // ... from a match of this SuffixAcceptance bucket
  uint32_t start_pos = 0;         // the pending token's position
  double draft_seconds = 0;       // proposer's last_propose_seconds()
  std::vector<int> emitted;       // tokens out (after EOS / max_tokens cuts)
  // The verified rows' top-K (CPU) where log_top_k asked for it and the chain was verified on
  // the device; else undefined tensors, and on_commit takes the top-K from the rows.
  spec::TopKTensors logged_top_k;
  std::string error;              // non-empty: failed in this step ("draft failed: ...")
};

struct DecodeStepTimes {
  // The batched target forward (with the device path, kernels still queued on the device
  // when it returns finish inside the verification's copy back).
  double forward_seconds = 0;
  int sequences = 0;           // decoding sequences in it
  int rows = 0;                // their rows
  int chunks = 0;              // prompt chunks in it (PrefillChunks)
};

// Prompt chunks that ride in the step's target forward (chunked prefill: SpeculativeDecoder::
// PrefillInput), after the decoding sequences' rows. The forward's cost, chunks included, is
// what the step cost table observes.
struct PrefillChunks {
  std::vector<ForwardInput> inputs;
  // After the step, per input in order: the target's logits rows it asked for (its
  // ForwardInput::logit_rows; else all_logits' every row, else its last row, which nothing
  // reads), views into the step's CPU logits (float32 copies when the step verified on a
  // device: VerifyPlace). Empty when the forward failed.
  std::vector<at::Tensor> logits;
  // Per input, its tokens' features (every row) when the step's forward returned any (a slot
  // drafts from features: the chunk's sequence should get them, SpeculativeDecoder::
  // PrefillFeatures); else undefined.
  std::vector<at::Tensor> hidden;
  // The target layers to return features of (SpeculativeDecoder::feature_layers() of a chunk's
  // sequence), when no decoding slot of the step asks for them already.
  std::vector<int> feature_layers;
  std::string error;  // set when the target forward failed (the chunks are lost)
};

// Where a step verifies its chain blocks (trees are always verified on the host).
enum class VerifyPlace {
  // On the logits' device when the target's logits are not on the CPU, else on the host.
  kAuto,
  // Every sequence on the host: its rows copied to the CPU, SpeculativeDecoder::Commit.
  kHost,
  // The chains of the step in one batched call on the logits' device (device_chain_verify.h),
  // then SpeculativeDecoder::CommitOutcome, the draft model's and the head's chains drawn on
  // the device too (device_draw.h); on the CPU too (tests: the same tokens as
  // the host path with the same seeds, up to rounding at a uniform's boundary).
  kDevice,
};

struct DecodeStepOptions {
  // Default: kAuto (on the CPU the host path is faster: tests/spec/tensor_verify_timing).
  VerifyPlace verify = VerifyPlace::kAuto;
  // Tests only: the device path's sampled-chain verifier (null: spec::VerifyChainTensors), so
  // that a test can show that its comparison with the host path catches a broken one.
  ChainTensorVerifier chain_verifier_for_testing = nullptr;
};

// Resets every slot's outcome, then steps them, and runs `prefill`'s chunks (may be null) in
// the same target forward. REQUIRES: every slot's decoder is not finished and has no prompt
// left to prefill; a slot with a policy needs `costs` (null: nothing is measured).
// With the device path, on_commit still gets float32 CPU rows (only those slots' rows, and the
// prompt chunks' and the trees', are copied to the host), except a logged chain's where
// logged_top_k carries the step and commit_needs_rows is false.
void DecodeStep(const LlamaModel& target, StepCostTable* costs,
                const std::vector<DecodeSlot*>& slots, DecodeStepTimes* times = nullptr,
                PrefillChunks* prefill = nullptr,
                const DecodeStepOptions& options = DecodeStepOptions());

}  // namespace specloop
