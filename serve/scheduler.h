// Scheduler: continuous batching of speculative decoding on one thread that owns the models
// and every sequence's state (llama.cpp's server "context", without the god-struct: a sequence
// is a RequestChannel plus a decoder, a proposer, a TextStream and a log trace).
//
// Each iteration:
//   1. installs a new draft from the DraftSwapHook, if one is ready;
//   2. admits waiting requests up to max_batch while the KV cache has blocks for them (a
//      preempted sequence first), and retires cancelled ones; a new sequence adopts its
//      prompt's longest cached prefix (prefix caching), the rest is prefilled in chunks that
//      ride in the steps' target forwards (chunked prefill: TakePrefillChunks), and it decodes
//      from the step after its last chunk; before the forwards every decoding sequence holds
//      the cache blocks its step may fill, the newest sequences preempted (their blocks freed,
//      their tokens recomputed later) where the pool runs short;
//   3. for every active sequence picks k (fixed, or the SpeculationPolicy of its domain and
//      draft version, given the batch size and the measured StepCostTable); the draft model
//      then drafts for all of them together, one batched draft forward per drafted position;
//   4. runs ONE target forward over all sequences (pending token + drafts each);
//   5. commits each sequence's rows (exact verification), streams out its new text, hands the
//      step to the SampleLogger, and retires finished sequences.
// Requests join and leave only between iterations. An engine exception fails the sequences it
// touched (HTTP 500, counted) and the loop goes on.
//
// Thread safety: Submit(), Stop() and the accessors from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/engine/decode_step.h"
#include "common/engine/draft.h"
#include "common/model/llama_model.h"
#include "common/spec/proposer.h"
#include "common/spec/speculation_policy.h"
#include "common/spec/step_cost_table.h"
#include "common/spec/suffix_proposer.h"
#include "common/tokenizer/tokenizer.h"
#include "serve/draft_swap_hook.h"
#include "serve/request.h"
#include "serve/sample_logger.h"
#include "serve/serving_metrics.h"

namespace specloop {

// The share of the machine's physical memory the default KV cache may take (--kv-cache-mb 0).
constexpr double kDefaultKvMemoryShare = 0.25;

struct SchedulerOptions {
  // Most sequences decoded together. Default: 16.
  int max_batch = 16;
  // Most requests waiting for a batch slot; more are refused (HTTP 429). Default: 64.
  size_t max_waiting = 64;
  // Speculation length: -1 = adaptive (SpeculationPolicy per domain and draft version), 0 = off (plain
  // decoding, the draft never runs), N > 0 = fixed. Default: -1.
  int k = -1;
  // Adaptive policy options (k_max caps every k). Default: SpeculationPolicyOptions().
  SpeculationPolicyOptions policy;
  // Time the batched target forward and the draft at Start() to seed the step costs.
  // Default: true.
  bool calibrate = true;
  // Suffix proposals (adaptive k only): tokens of finished requests (prompt and output) kept
  // per domain in a SuffixIndex (~70 bytes a token); a step takes the suffix block where it
  // promises more tokens per second than the draft (common/engine/decode_step.h). 0: off.
  // Default: 131072 (~9 MB a domain).
  int64_t suffix_tokens = int64_t{1} << 17;
  // Prompt lookup (adaptive k only): each sequence may also draft the tokens that followed the
  // last earlier occurrence of its context's last 2-4 tokens in its own prompt and output
  // (common/spec/prompt_lookup_proposer.h), taken where that block promises more tokens per
  // second than the draft and the suffix block, by its own acceptance per domain. Default: false.
  bool prompt_lookup = false;
  // Token trees (--draft-mode tree): children per node at each depth; empty: chains only.
  // With adaptive k each step of each sequence drafts a tree where it promises more tokens
  // per second than the policy's chain (TreeAcceptance per domain and draft version,
  // common/engine/decode_step.h); with a fixed k every step drafts a tree of depth k.
  // Default: empty.
  std::vector<int> tree_branching;
  // Memory for the KV caches of the target and the draft together, in MiB: one pool of
  // KVBlockPool::kBlockTokens-position blocks per model, as many blocks in each. A request is
  // admitted while blocks are free for it, one that could never fit is refused, and
  // decoding sequences that run out are preempted and recomputed later. 0: room for
  // max_batch sequences at the target's context limit (max_model_len), but at most
  // kDefaultKvMemoryShare of the machine's physical memory, which must hold one sequence at
  // the limit (else Start() fails: lower --max-model-len or set this); the memory is
  // reserved, and touched as blocks are first used. Default: 0.
  double kv_cache_mb = 0;
  // Prefix caching: full blocks of committed tokens stay cached (until their blocks are
  // needed, least recently used first), and a new request starts from the longest cached
  // prefix of its prompt, for the target and the draft. Default: true.
  bool prefix_caching = true;
  // Per-request speculative metrics in each response, as vLLM's --per-request-spec-decode-
  // metrics (serve/spec_decode_metrics.h): kNone, kSummary or kDetailed (adds the per-step
  // arrays). Default: kNone (off, as in vLLM).
  SpecMetricsLevel per_request_spec_metrics = SpecMetricsLevel::kNone;
};

struct Sequence;

class Scheduler {
 public:
  // `target`, `tokenizer`, `metrics` (required) and `sample_logger` (null: no logging) are not
  // owned and must outlive the scheduler. `draft` (a model or an EAGLE-3 head of `target`) may
  // be empty only when options.k == 0; a later draft (hot swap) must be of the same kind.
  Scheduler(const LlamaModel* target, Draft draft,
            const Tokenizer* tokenizer, ServingMetrics* metrics, SampleLogger* sample_logger,
            const SchedulerOptions& options);
  // Stop().
  ~Scheduler();

  // The hot-swap seam (see draft_swap_hook.h). Not owned; call before Start().
  void set_swap_hook(DraftSwapHook* hook) { swap_hook_ = hook; }

  // Captures the decode steps' CUDA graphs (on CUDA), calibrates (when asked) and starts the
  // scheduler thread.
  Status Start();
  // Fails every waiting and active request with 503, stops and joins the thread. Idempotent.
  void Stop();

  enum class SubmitResult { kOk, kQueueFull, kStopped, kTooLarge };
  // Queues a request. The channel then receives its events (request.h). kTooLarge: its prompt
  // and max_tokens need more KV cache positions than the pool holds (kv_cache_tokens()).
  SubmitResult Submit(std::shared_ptr<RequestChannel> channel);
  // Positions the KV cache pool holds (each pool: the target's and the draft's).
  int64_t kv_cache_tokens() const { return pool_blocks_ * KVBlockPool::kBlockTokens; }

  uint64_t draft_version() const { return draft_version_.load(); }
  int active() const { return active_count_.load(); }
  int waiting() const;
  // Whether the thread runs (for /health).
  bool running() const { return running_.load(); }

 private:
  void Loop();
  void PrepareGraphs();
  void Calibrate();
  void InstallDraft(DraftCandidate candidate);
  void Admit();
  void Step();
  bool SpeculationPays(const DecodeSlot& slot, int batch, int64_t context) const;
  double TakePrefillChunks(const std::vector<Sequence*>& prefilling, int decoding,
                           int decode_rows, double context, PrefillChunks* chunks,
                           std::vector<Sequence*>* chunked);
  // KV cache blocks (see SchedulerOptions::kv_cache_mb). Positions a sequence of `tokens`
  // may hold after its next step: its tokens and the largest block a step verifies.
  int64_t StepPositions(int64_t tokens) const;
  // Whether both pools have blocks for a sequence of `tokens` to start beside the active
  // ones (each of which may take a block or two in its next step).
  bool HasRoom(int64_t tokens) const;
  // Takes the blocks the decoding sequences' steps may fill, oldest first, preempting the
  // newest sequences where the pools run short.
  void ReserveForStep();
  // Frees a sequence's blocks (its committed full blocks stay cached) and queues it to be
  // prefilled again from its tokens so far.
  void Preempt(Sequence* seq);
  void Fail(Sequence* seq, int http_status, const std::string& message);
  void Finish(Sequence* seq, const std::string& reason);
  SpeculationPolicy* PolicyFor(const std::string& domain_label, uint64_t draft_version);
  TreeAcceptance* TreeFor(const std::string& domain_label, uint64_t draft_version);

  const LlamaModel* target_;
  Draft draft_;  // owned by the scheduler thread after Start()
  const Tokenizer* tokenizer_;
  ServingMetrics* metrics_;
  SampleLogger* sample_logger_;
  const SchedulerOptions options_;
  DraftSwapHook* swap_hook_ = nullptr;

  // The KV cache pools (the draft's null when k == 0), of pool_blocks_ blocks each, and the
  // most positions a step adds to a sequence's cache beyond its tokens (the largest k, or a
  // tree's nodes).
  int64_t pool_blocks_ = 0;
  int step_rows_ = 0;
  std::shared_ptr<KVBlockPool> target_pool_, draft_pool_;

  // Scheduler-thread state: the active sequences in admission order, and the preempted ones
  // waiting for blocks (re-admitted before new requests).
  std::vector<std::unique_ptr<Sequence>> active_;
  std::deque<std::unique_ptr<Sequence>> preempted_;
  // By domain label and draft version (only the current version's are kept).
  std::map<std::pair<std::string, uint64_t>, std::unique_ptr<SpeculationPolicy>> policies_;
  std::map<std::pair<std::string, uint64_t>, std::unique_ptr<TreeAcceptance>> trees_;
  // By domain label: earlier requests' tokens, and the acceptance of suffix blocks apart for
  // greedy [0] and sampled [1] requests. A deterministic block is accepted with the target's
  // probability of its tokens: near 1 where a greedy request repeats an earlier greedy answer,
  // far less under sampling. One estimate for both would keep taking suffix blocks for sampled
  // requests where they slow decoding down (bench/faster_over_time's recurring prompts).
  struct SuffixState {
    std::unique_ptr<SuffixIndex> index;
    SuffixAcceptance acceptance[2];
    SuffixAcceptance lookup_acceptance[2];  // prompt lookup's blocks, likewise
  };
  std::map<std::string, SuffixState> suffixes_;
  StepCostTable costs_;
  DecodeStepTimes last_decode_;  // the last step's decoding sequences and rows

  std::atomic<uint64_t> draft_version_{0};
  std::atomic<int> active_count_{0};
  std::atomic<bool> running_{false};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<RequestChannel>> waiting_;  // GUARDED_BY(mu_)
  bool stopping_ = false;                                // GUARDED_BY(mu_)
  std::thread thread_;
};

}  // namespace specloop
