// SpeculativeDecoder: speculative decoding of one sequence, in three phases per step so that a
// scheduler can batch the target's verification across sequences:
//
//   Propose(k)     the proposer drafts up to k tokens;
//   TargetInput()  the target forward this step needs: the pending token plus the drafts, all
//                  k + 1 rows of logits;
//   Commit(rows)   verification (common/spec: exact rejection sampling, or greedy) over those
//                  rows; emits accepted drafts plus one recovered or bonus token, and rolls the
//                  target's cache back past rejected drafts.
//
// The emitted sequence follows the target's processed distribution exactly (greedy: equals the
// target's own greedy decoding), whatever the proposer drafts.
#pragma once

#include <memory>
#include <vector>

#include "common/engine/generate.h"
#include "common/model/llama_model.h"
#include "common/spec/chain_verify.h"
#include "common/spec/multi_draft.h"
#include "common/spec/proposer.h"
#include "common/spec/speculation_policy.h"
#include "common/spec/step_cost_table.h"

namespace specloop {

struct DecodeSlot;  // decode_step.h
class FeatureDraftProposer;  // feature_draft_proposer.h
class Eagle3Head;            // common/model/eagle3_head.h

struct SpeculativeStats {
  int64_t steps = 0;     // verification steps (target forwards after the prompt)
  int64_t drafts = 0;    // steps that verified a non-empty block (vLLM's num_drafts)
  int64_t drafted = 0;   // draft tokens proposed
  int64_t accepted = 0;  // draft tokens accepted
  // Draft positions verification tested: the accepted ones and, where a block was cut short,
  // its first rejection (a tree: the nodes with children on the accepted path).
  int64_t tested = 0;
  int64_t emitted = 0;   // tokens emitted by the steps (accepted + one per step, before cuts)
  int64_t k_sum = 0;     // sum of the k asked for, for the mean
  std::vector<int64_t> accepted_at;  // [i]: steps whose draft token i was accepted
  // alpha* (common/spec/optimal_acceptance.h) over the positions verification tested: the
  // optimal verifier's expected acceptances summed, and the positions (see last_optimal()).
  double optimal = 0.0;
  int64_t optimal_positions = 0;

  // The per-token acceptance rate, accepted / tested (spec::AcceptanceEstimator's count, not
  // accepted / drafted, which falls as k grows at a fixed per-token rate).
  double acceptance_rate() const { return tested ? double(accepted) / tested : 0.0; }
  // Mean tokens per target forward, steps with no draft included.
  double tokens_per_step() const { return steps ? double(emitted) / steps : 0.0; }
  // Mean acceptance length: 1 + accepted per verified draft (vLLM's definition).
  double mean_acceptance_length() const { return drafts ? 1.0 + double(accepted) / drafts : 0.0; }
  double k_mean() const { return steps ? double(k_sum) / steps : 0.0; }
  void Add(const SpeculativeStats& o);
};

class SpeculativeDecoder {
 public:
  // Runs the prompt but its last token through the target (REQUIRES: non-empty, shorter than
  // the context limit), unless `defer_prefill`: then the caller feeds it in chunks
  // (PrefillInput) before the first step. `target` and `proposer` must outlive the decoder.
  // The target's cache lies in `pool` (a server's, shared by its sequences), or in a pool of
  // its own when null (options.pool is not read: SpeculativeGeneration passes it here); where
  // the pool caches prefixes, the prompt's longest cached prefix is adopted instead of
  // computed (prefilled() starts there), and the committed full blocks are registered for
  // later requests as decoding goes.
  SpeculativeDecoder(const LlamaModel* target, Proposer* proposer, std::vector<int> prompt,
                     const GenerateOptions& options, bool defer_prefill = false,
                     std::shared_ptr<KVBlockPool> pool = nullptr);

  // A bounded pool (the server's): takes the cache blocks for `positions` in all (capped at
  // the context limit), false and nothing taken when the pool has too few. The server
  // reserves a step's worst case before it, so that no forward runs out of blocks.
  bool ReserveCache(int64_t positions);
  // Positions the cache's blocks hold.
  int64_t cache_capacity() const { return cache_.capacity(); }
  // Preemption by recomputation: registers the committed full blocks, then returns every
  // block to the pool; the tokens so far become a prompt to prefill again (prefill_remaining()
  // counts them) once AdoptCachedPrefix() has taken what the pool still caches. Sampling
  // state is kept: the output's distribution is unchanged, and greedy output is the same.
  void DropCache();
  // REQUIRES: an empty cache (after construction, or DropCache()).
  void AdoptCachedPrefix();

  // Chunked prefill (the server's scheduler interleaves prompt chunks with other sequences'
  // decode steps). Prompt tokens still to run through the target; a step taken before they are
  // feeds them with its block (TargetInput), their logits computed for nothing.
  int64_t prefill_remaining() const {
    return static_cast<int64_t>(tokens_.size()) - 1 - prefilled();
  }
  // Tokens in the target's cache: while prefilling, the prompt tokens prefilled so far.
  int64_t prefilled() const { return static_cast<int64_t>(cached_.size()); }
  // The forward of the next at most `max_tokens` (> 0) of them; the caller runs it (in a batch
  // with others; the decoder reads none of its logits, and a caller may ask for rows, as the
  // server does to log the prompt's), after which they count as prefilled. REQUIRES:
  // prefill_remaining() > 0.
  ForwardInput PrefillInput(int64_t max_tokens);

  bool finished() const { return finished_; }
  // Tokens of the prompt (tokens()[0, prompt_len())).
  int64_t prompt_len() const { return static_cast<int64_t>(prompt_len_); }
  // Generated tokens so far (prompt excluded).
  std::vector<int> generated() const;
  const std::vector<int>& tokens() const { return tokens_; }
  bool hit_eos() const { return hit_eos_; }
  const SpeculativeStats& stats() const { return stats_; }
  const DraftBlock& draft() const { return draft_; }
  // Draft tokens accepted by the last Commit().
  int last_accepted() const { return last_accepted_; }
  // Draft positions the last Commit() tested (see SpeculativeStats::tested).
  int last_tested() const { return last_tested_; }
  // After a tree's Commit(): the accepted path, as indices into draft().tokens from the root
  // down (last_accepted() of them); empty after a chain's.
  const std::vector<int>& last_tree_path() const { return last_tree_path_; }
  // Tokens the request may still generate (max_tokens less those generated).
  int64_t remaining() const {
    return options_.max_tokens - static_cast<int64_t>(tokens_.size() - prompt_len_);
  }
  // alpha* of the last Commit(): for each position verification tested (a chain's accepted
  // positions and its first rejection; a tree's nodes on the accepted path that had children),
  // what the optimal verifier would accept in expectation for the drafts proposed there, summed
  // into `expected` over `positions`. A chain position is sum min(p, q), equal to the
  // verifier's own expectation; a tree node of n <= 2 children is
  // OptimalAcceptanceWithoutReplacement (tree nodes of more children cost vocab^(n-1) and are
  // left out). Greedy: 1 where the target's argmax is among the drafts, else 0. Cost: one pass
  // over the vocabulary per chain position, one sort per tree node.
  struct OptimalAcceptance {
    double expected = 0.0;
    int positions = 0;
  };
  const OptimalAcceptance& last_optimal() const { return last_optimal_; }

  // The random verifier (default spec::VerifyChain). Tests swap in a wrong one to show that
  // their statistics catch it.
  using ChainVerifier = Status (*)(int k, int vocab, const int* draft_tokens,
                                   const float* draft_probs, const float* target_probs, Rng* rng,
                                   spec::ChainOutcome* out);
  void set_verifier_for_testing(ChainVerifier v) { verifier_ = v; }
  // The tree's per-node verifier (default spec::VerifyRecursiveRejection), likewise.
  using MultiDraftVerifier = Status (*)(int vocab, const std::vector<int>& drafts,
                                        const float* draft_probs, const float* target_probs,
                                        Rng* rng, spec::MultiDraftOutcome* out);
  void set_multi_draft_verifier_for_testing(MultiDraftVerifier v) { multi_verifier_ = v; }

  // REQUIRES: !finished(). k is capped by the context left.
  void Propose(int k);
  // Propose(k) in halves, for a caller that drafts several sequences in one batch (see
  // DraftModelProposer::ProposeBatch): BeginPropose returns the k that fits; the caller fills
  // mutable_draft() with at most that many tokens continuing tokens(); EndPropose drops a
  // block that would not fit (the step then decodes plainly).
  int BeginPropose(int k);
  DraftBlock* mutable_draft() { return &draft_; }
  void EndPropose();
  ForwardInput TargetInput();
  // `rows`: float32 CPU logits, this sequence's rows of the forward of TargetInput() (all of
  // them, or at least the last k + 1 for a chain). Returns the tokens emitted by this step
  // (after EOS / max_tokens cuts). Tree drafts are verified node by node from the pending
  // token down: each node's children by recursive rejection sampling without replacement
  // (greedy: the child equal to the target's argmax), the first miss emitting a recovered
  // token, a leaf a bonus token.
  // `hidden`: when the proposer drafts from the target's features (FeatureDraftProposer), the
  // same forward's features of these rows (LlamaModel::Forward with feature_layers()); those
  // of the positions the cache keeps go to the proposer.
  std::vector<int> Commit(const at::Tensor& rows, const at::Tensor& hidden = at::Tensor());

  // Commit with the chain's verification done elsewhere (DecodeStep verifies a batch's chains
  // on the logits' device: device_chain_verify.h): `outcome` must come from this step's chain
  // (not a tree) and rows, processed under sampling(), with the uniforms that a copy of rng()
  // taken before this call draws. Advances rng() by exactly the draws Commit's verifier makes
  // (sampled: k + 1 after k acceptances, else num_accepted + 2; a plain step 1; greedy none), so
  // that the stream goes on as Commit's would; records the stats with `optimal` as the step's
  // alpha* (last_optimal(), over its tested positions), emits and rolls the cache back as
  // Commit does, and hands `hidden` (as Commit's) to a feature proposer. Throws (nothing
  // committed) on an outcome that does not fit the block: num_accepted outside [0, k], not
  // num_accepted + 1 tokens, accepted tokens other than the drafts, a token outside the
  // vocabulary.
  std::vector<int> CommitOutcome(const spec::ChainOutcome& outcome, double optimal,
                                 const at::Tensor& hidden = at::Tensor());
  // The target's processing of this sequence's rows, and its random stream (Commit's draws).
  const SamplingParams& sampling() const { return options_.sampling; }
  const Rng& rng() const { return rng_; }

  // The target layers whose inputs the proposer reads (empty: none): every forward of this
  // sequence should return them, and chunked prefill hand them to PrefillFeatures().
  std::vector<int> feature_layers() const;
  // The features of prompt positions [first, first + rows) from a PrefillInput() forward.
  void PrefillFeatures(int64_t first, const at::Tensor& rows);

 private:
  // Commit's verification; `kept` gets the rows (of `logits`) in the order their positions
  // follow the cache's committed ones (the first cached_.size() - before of them stay).
  std::vector<int> Verify(const at::Tensor& logits, std::vector<int64_t>* kept);
  // Tree verification: the outcome, and the new tokens of the forward (catch-up first) whose
  // keys and values stay in the cache.
  void VerifyTree(const at::Tensor& logits, spec::ChainOutcome* outcome, std::vector<int>* path);
  // Records stats and appends the outcome's tokens (cut at EOS, max_tokens, the context limit);
  // rolls the cache back to what the committed tokens keep. `before`: tokens_.size() before.
  std::vector<int> Emit(const spec::ChainOutcome& outcome, int k, size_t before);
  // Commit's last part: the features of the positions the cache keeps (the first
  // cached_.size() - past of `kept`, rows of `hidden`) go to the feature proposer.
  void KeepFeatures(int64_t past, std::vector<int64_t> kept, const at::Tensor& hidden);

  const LlamaModel* target_;
  Proposer* proposer_;
  FeatureDraftProposer* features_;  // = proposer_ when it reads the target's features
  GenerateOptions options_;
  Rng rng_;
  KVCache cache_;
  std::vector<int> tokens_;  // prompt + generated; the last one is pending (not in cache_)
  size_t prompt_len_;
  std::vector<int> cached_;  // the tokens in cache_
  DraftBlock draft_;
  std::vector<float> p_;     // scratch: processed target rows
  std::vector<float> row_;   // scratch: one processed row
  bool finished_ = false, hit_eos_ = false;
  SpeculativeStats stats_;
  int last_k_ = 0;
  int last_accepted_ = 0;
  int last_tested_ = 0;
  std::vector<int> last_tree_path_;
  OptimalAcceptance last_optimal_;
  ChainVerifier verifier_;
  MultiDraftVerifier multi_verifier_;
};

struct TreeAcceptance;

struct SpeculativeOptions {
  GenerateOptions generate;
  // Fixed speculation length, used when `policy` is null. Default: 4.
  int k = 4;
  // Adaptive length (not owned; REQUIRES `costs`): fed this request's verification outcomes.
  SpeculationPolicy* policy = nullptr;
  // Step costs (not owned; may be set without a policy): fed this request's timings.
  StepCostTable* costs = nullptr;
  // With a policy and a DraftModelProposer: token trees on offer beside chains (not owned;
  // decode_step.h). Null: chains only (a fixed k drafts what the proposer is set to).
  TreeAcceptance* tree = nullptr;
};

// Decodes one sequence speculatively from `prompt` (BOS included). Timings as GeneratePlain:
// prefill_seconds is the target's prompt; the draft catches up on the prompt when it first
// drafts, inside decode_seconds (with a policy, only where speculating repays it).
GenerateResult GenerateSpeculative(const LlamaModel& target, Proposer* proposer,
                                   const std::vector<int>& prompt,
                                   const SpeculativeOptions& options, SpeculativeStats* stats);

// GenerateSpeculative one verification step at a time (as PlainGeneration; spec_bench steps
// decoders in lockstep): each Step() is DecodeStep (decode_step.h) over a batch of one, the
// server's decode loop. `target`, `proposer` and the policy must outlive it.
class SpeculativeGeneration {
 public:
  // Runs the prompt but its last token through the target (prefill_seconds).
  SpeculativeGeneration(const LlamaModel& target, Proposer* proposer,
                        const std::vector<int>& prompt, const SpeculativeOptions& options);
  ~SpeculativeGeneration();
  bool finished() const { return decoder_->finished(); }
  // Chooses k, drafts, verifies and feeds the policy its measurements; timed into
  // decode_seconds. REQUIRES: !finished().
  void Step();
  // The tokens so far, EOS and the timings.
  GenerateResult result() const;
  double decode_seconds() const { return decode_seconds_; }
  const SpeculativeStats& stats() const { return decoder_->stats(); }

 private:
  const LlamaModel& target_;
  Proposer* proposer_;
  SpeculativeOptions options_;
  std::unique_ptr<SpeculativeDecoder> decoder_;
  std::unique_ptr<DecodeSlot> slot_;  // the decoder's place in DecodeStep, a batch of one
  double prefill_seconds_ = 0, decode_seconds_ = 0;
};

struct CalibrationOptions {
  // Cached tokens the forwards are timed after, and a second, shorter context: the two fix
  // attention's cost per row and cached token (StepCostTable::set_context_slope). Default:
  // 256, 16.
  int context = 256;
  int short_context = 16;
  // Batch sizes 1, 2, 4, ... up to max_batch are timed (a server's batches). Default: 1.
  int max_batch = 1;
  // Each row's processing into a distribution is added (none for greedy). Default:
  // SamplingParams() (temperature 1).
  SamplingParams sampling;
  // The draft is this EAGLE-3 head (CalibrateStepCosts' `draft` null): its drafting forwards
  // are timed instead. Not owned. Default: none.
  const Eagle3Head* head = nullptr;
};

// Seeds `costs` with timed forwards: the target over 1 .. k_max + 1 rows of one sequence (7
// interleaved rounds, medians; each verification-sized forward after a draft forward, as
// decoding runs it, and plain decoding's one-row forwards back to back on a growing cache),
// at both contexts; for larger batches the target over b * n rows for n in {1, 2, 3, 5,
// k_max + 1} and the draft over b sequences; the draft's catch-up on `context` tokens.
// `draft` may be null: a head's costs (CalibrationOptions::head), else a free proposer's (none).
void CalibrateStepCosts(const LlamaModel& target, const LlamaModel* draft, int k_max,
                        StepCostTable* costs,
                        const CalibrationOptions& options = CalibrationOptions());

// Seconds to turn one row of logits into a processed distribution under `sampling` (0 for
// greedy), measured on this machine.
double VerificationSecondsPerRow(int vocab, const SamplingParams& sampling);

}  // namespace specloop
