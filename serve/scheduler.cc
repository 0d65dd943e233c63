#include "serve/scheduler.h"

#include <algorithm>
#include <chrono>

#include <unistd.h>

#include <c10/core/InferenceMode.h>

#include "common/base/clock.h"
#include "common/engine/decode_step.h"
#include "common/engine/speculative_decoder.h"
#include "serve/prefill_budget.h"
#include "serve/sequence.h"
#include "serve/step_logprobs.h"

namespace specloop {

using Clock = std::chrono::steady_clock;

namespace {

// Cuts `tokens` after the first of `stop_ids`; returns whether there was one.
bool CutAtStopId(const std::vector<int>& stop_ids, std::vector<int>* tokens) {
  for (size_t i = 0; i < tokens->size(); ++i) {
    if (std::find(stop_ids.begin(), stop_ids.end(), (*tokens)[i]) != stop_ids.end()) {
      tokens->resize(i + 1);
      return true;
    }
  }
  return false;
}

// This machine's physical memory in bytes (0 when unknown).
int64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}
}  // namespace

Scheduler::Scheduler(const LlamaModel* target, Draft draft,
                     const Tokenizer* tokenizer, ServingMetrics* metrics,
                     SampleLogger* sample_logger, const SchedulerOptions& options)
    : target_(target),
      draft_(std::move(draft)),
      tokenizer_(tokenizer),
      metrics_(metrics),
      sample_logger_(sample_logger),
      options_(options) {
  step_rows_ = options_.k > 0 ? options_.k : options_.k < 0 ? options_.policy.k_max : 0;
  if (!options_.tree_branching.empty() && options_.k != 0) {
    const TreeAcceptance shape(options_.tree_branching);
    step_rows_ = std::max(step_rows_, shape.Nodes(step_rows_));
  }
  const int64_t per_block =
      target_->CacheBlockBytes() +
      (draft_.model && options_.k != 0 ? draft_.model->CacheBlockBytes() : 0);
  if (options_.kv_cache_mb > 0) {
    pool_blocks_ = static_cast<int64_t>(options_.kv_cache_mb * (1 << 20) / per_block);
  } else {
    // max_batch sequences at the context limit, with the headroom HasRoom asks for, within
    // kDefaultKvMemoryShare of the machine's memory.
    pool_blocks_ = options_.max_batch * (KVBlockPool::BlocksFor(target_->config().max_model_len) +
                                         KVBlockPool::BlocksFor(step_rows_) + 1);
    const int64_t memory = PhysicalMemoryBytes();
    if (memory > 0) {
      pool_blocks_ = std::min<int64_t>(
          pool_blocks_, static_cast<int64_t>(memory * kDefaultKvMemoryShare) / per_block);
    }
  }
}

Scheduler::~Scheduler() { Stop(); }

Status Scheduler::Start() {
  if (options_.k > 0 && !draft_) return Status::InvalidArgument("a fixed --k needs a draft");
  if (options_.k < 0 && !draft_ && !options_.tree_branching.empty()) {
    return Status::InvalidArgument("token trees need a draft model");
  }
  if (options_.max_batch < 1) return Status::InvalidArgument("max_batch must be >= 1");
  if (options_.kv_cache_mb <= 0 &&
      pool_blocks_ < KVBlockPool::BlocksFor(StepPositions(target_->config().max_model_len)) + 1) {
    return Status::InvalidArgument(
        "the default KV cache (" + std::to_string(static_cast<int>(kDefaultKvMemoryShare * 100)) +
        "% of this machine's memory) holds " + std::to_string(kv_cache_tokens()) +
        " positions, fewer than one sequence of max_model_len " +
        std::to_string(target_->config().max_model_len) +
        ": lower --max-model-len or set --kv-cache-mb");
  }
  if (pool_blocks_ < KVBlockPool::BlocksFor(step_rows_ + 2) + 1) {
    return Status::InvalidArgument("a KV cache of " + std::to_string(options_.kv_cache_mb) +
                                   " MiB holds " + std::to_string(kv_cache_tokens()) +
                                   " positions: too few for any request");
  }
  target_pool_ = target_->NewBlockPool(pool_blocks_, options_.prefix_caching);
  if (draft_.model && options_.k != 0) {
    draft_pool_ = draft_.model->NewBlockPool(pool_blocks_, options_.prefix_caching);
  }
  metrics_->SetKvCache(0, pool_blocks_, KVBlockPool::kBlockTokens);
  try {
    PrepareGraphs();
  } catch (const std::exception& e) {
    return Status::IOError(std::string("preparing the decode steps' CUDA graphs failed: ") +
                           e.what());
  }
  try {
    if (options_.calibrate && options_.k < 0) Calibrate();
  } catch (const std::exception& e) {
    return Status::IOError(std::string("calibration failed: ") + e.what());
  }
  metrics_->SetDraftVersion(0);
  metrics_->SetDraftKind(draft_.kind());
  running_ = true;
  thread_ = std::thread([this] { Loop(); });
  return Status::OK();
}

void Scheduler::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  running_ = false;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& ch : waiting_) {
    RequestEvent e;
    e.type = RequestEvent::Type::kError;
    e.http_status = 503;
    e.error = "server shutting down";
    ch->Post(std::move(e));
  }
  waiting_.clear();
}

Scheduler::SubmitResult Scheduler::Submit(std::shared_ptr<RequestChannel> channel) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return SubmitResult::kStopped;
    const CompletionParams& p = channel->params();
    if (KVBlockPool::BlocksFor(StepPositions(p.prompt.size() + p.generate.max_tokens)) >
        pool_blocks_) {
      return SubmitResult::kTooLarge;
    }
    if (waiting_.size() >= options_.max_waiting) return SubmitResult::kQueueFull;
    waiting_.push_back(std::move(channel));
  }
  cv_.notify_all();
  return SubmitResult::kOk;
}

int Scheduler::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(waiting_.size());
}

// On CUDA, the graphs of every padded shape a decode step can take, captured before the first
// request (LlamaModel::PrepareStaticShapes; nothing off CUDA): the target's forwards (with the
// head's features where a head drafts) and the draft's, of up to max_batch sequences of up to
// kStaticTokens new tokens (verification blocks, trees, catch-ups and short prompt chunks)
// over any context the pool holds.
void Scheduler::PrepareGraphs() {
  const int64_t context = std::min<int64_t>(target_->config().max_model_len, kv_cache_tokens());
  const std::vector<int> features =
      draft_.head && options_.k != 0 ? draft_.head->config().aux_layers : std::vector<int>();
  target_->PrepareStaticShapes(target_pool_, options_.max_batch, LlamaModel::kStaticTokens,
                               context, features);
  if (draft_pool_) {
    draft_.model->PrepareStaticShapes(draft_pool_, options_.max_batch, LlamaModel::kStaticTokens,
                                      context);
  }
}

// Seeds the step costs before traffic refines them: batched target forwards up to max_batch
// sequences, the draft, the verifier's work per row at temperature 1.
void Scheduler::Calibrate() {
  CalibrationOptions co;
  co.max_batch = options_.max_batch;
  co.head = draft_.head.get();
  CalibrateStepCosts(*target_, draft_.model.get(), options_.policy.k_max, &costs_, co);
}

SpeculationPolicy* Scheduler::PolicyFor(const std::string& label, uint64_t draft_version) {
  auto& p = policies_[{label, draft_version}];
  if (!p) p = std::make_unique<SpeculationPolicy>(options_.policy);
  return p.get();
}

TreeAcceptance* Scheduler::TreeFor(const std::string& label, uint64_t draft_version) {
  auto& t = trees_[{label, draft_version}];
  if (!t) t = std::make_unique<TreeAcceptance>(options_.tree_branching);
  return t.get();
}

void Scheduler::Loop() {
  c10::InferenceMode guard;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (active_.empty()) {
        cv_.wait_for(lock, std::chrono::milliseconds(50),
                     [this] { return stopping_ || !waiting_.empty(); });
      }
      if (stopping_) break;
    }
    if (swap_hook_) {
      DraftCandidate candidate;
      if (swap_hook_->TakeReady(&candidate)) InstallDraft(std::move(candidate));
    }
    Admit();
    if (!active_.empty()) Step();
    active_.erase(std::remove_if(active_.begin(), active_.end(),
                                 [](const std::unique_ptr<Sequence>& s) { return s->done; }),
                  active_.end());
    active_count_ = static_cast<int>(active_.size());
    metrics_->SetQueue(active_count_, waiting() + static_cast<int>(preempted_.size()));
    metrics_->SetKvCache(target_pool_->used(), pool_blocks_, KVBlockPool::kBlockTokens);
    metrics_->SetPrefixCache(target_pool_->query_tokens(), target_pool_->hit_tokens());
    if (target_->device().is_cuda()) {
      const LlamaModel::StaticStats t = target_->static_stats();
      metrics_->SetCudaGraphs("target", t.captures, t.capture_failures);
      if (draft_.model) {
        const LlamaModel::StaticStats d = draft_.model->static_stats();
        metrics_->SetCudaGraphs("draft", d.captures, d.capture_failures);
      }
    }
  }
  for (auto& seq : active_) Fail(seq.get(), 503, "server shutting down");
  for (auto& seq : preempted_) Fail(seq.get(), 503, "server shutting down");
  active_.clear();
  preempted_.clear();
  active_count_ = 0;
}

void Scheduler::InstallDraft(DraftCandidate candidate) {
  const uint64_t version = candidate.version;
  Draft& next = candidate.draft;
  Status s = !next ? Status::InvalidArgument("no draft")
             : !draft_ && next.model
                 ? Status::InvalidArgument("a server started without a draft takes heads only")
             : draft_ && std::string(next.kind()) != draft_.kind()
                 ? Status::InvalidArgument(std::string("a draft of kind ") + next.kind() +
                                           " cannot replace one of kind " + draft_.kind())
             : next.model ? CheckDraftCompatible(target_->config(), next.model->config())
             : &next.head->target() != target_
                 ? Status::InvalidArgument("a head loaded for another target")
                 : Status::OK();
  if (s.ok() && options_.k != 0) {
    // The old draft's cached keys and values are not the new one's: a pool of the new shape,
    // or the same pool emptied of cached prefixes once every cache has left it.
    std::shared_ptr<KVBlockPool> pool = draft_pool_;
    if (next.model && !(pool->shape() == next.model->CacheShape())) {
      pool = next.model->NewBlockPool(pool_blocks_, options_.prefix_caching);
    }
    auto swap = [&](Sequence* seq) {
      DecodeSlot& slot = seq->slot;
      if (slot.draft_proposer) slot.draft_proposer->SetDraft(next.model.get(), pool);
      if (slot.feature_proposer) slot.feature_proposer->SetHead(next.head.get());
      seq->draft_version = version;  // reported in the response (the record keeps its start)
      if (slot.policy) slot.policy = PolicyFor(seq->series->label, version);
      if (slot.tree) slot.tree = TreeFor(seq->series->label, version);
    };
    for (auto& seq : active_) swap(seq.get());
    for (auto& seq : preempted_) swap(seq.get());
    if (draft_pool_) draft_pool_->DropCached();
    draft_pool_ = pool;
    // Acceptance is per draft version: the old version's estimates go.
    for (auto it = policies_.begin(); it != policies_.end();) {
      it = it->first.second == version ? std::next(it) : policies_.erase(it);
    }
    for (auto it = trees_.begin(); it != trees_.end();) {
      it = it->first.second == version ? std::next(it) : trees_.erase(it);
    }
    draft_ = std::move(next);  // the old draft is no longer referenced
    draft_version_ = version;
    metrics_->SetDraftVersion(version);
    metrics_->SetDraftKind(draft_.kind());
    metrics_->ObserveSwap();
  } else if (!s.ok()) {
    metrics_->ObserveSwapFailure("incompatible");
  }
  swap_hook_->OnInstalled(version, s);
}

int64_t Scheduler::StepPositions(int64_t tokens) const {
  return std::min<int64_t>(tokens + step_rows_, target_->config().max_model_len);
}

bool Scheduler::HasRoom(int64_t tokens) const {
  const int64_t need = KVBlockPool::BlocksFor(StepPositions(tokens)) +
                       static_cast<int64_t>(active_.size()) *
                           (KVBlockPool::BlocksFor(step_rows_) + 1);
  return target_pool_->available() >= need && (!draft_pool_ || draft_pool_->available() >= need);
}

void Scheduler::Admit() {
  // Preempted sequences first, in the order they were preempted.
  while (!preempted_.empty() && static_cast<int>(active_.size()) < options_.max_batch) {
    Sequence* seq = preempted_.front().get();
    if (seq->channel->cancelled()) {
      Finish(seq, "cancelled");
      preempted_.pop_front();
      continue;
    }
    if (!HasRoom(static_cast<int64_t>(seq->decoder->tokens().size()))) return;
    seq->preempted = false;
    seq->decoder->AdoptCachedPrefix();
    active_.push_back(std::move(preempted_.front()));
    preempted_.pop_front();
  }
  if (!preempted_.empty()) return;
  while (static_cast<int>(active_.size()) < options_.max_batch) {
    std::shared_ptr<RequestChannel> ch;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (waiting_.empty()) return;
      // In arrival order: a request waits for blocks rather than let later ones pass it.
      if (!waiting_.front()->cancelled() &&
          !HasRoom(static_cast<int64_t>(waiting_.front()->params().prompt.size()))) {
        return;
      }
      ch = std::move(waiting_.front());
      waiting_.pop_front();
    }
    const CompletionParams& p = ch->params();
    auto seq = std::make_unique<Sequence>();
    seq->channel = ch;
    seq->series = metrics_->ForDomain(metrics_->DomainLabel(p.domain));
    if (options_.per_request_spec_metrics != SpecMetricsLevel::kNone) {
      // A step's chain holds at most k tokens, k_max under adaptive k (a model-free block's
      // room, a tree's depth: common/engine/decode_step.cc).
      const int spec_tokens =
          options_.k > 0 ? options_.k : options_.k < 0 ? options_.policy.k_max : 0;
      seq->spec_decode.Begin(options_.per_request_spec_metrics, spec_tokens);
    }
    if (ch->cancelled()) {
      Finish(seq.get(), "cancelled");
      continue;
    }
    try {
      DecodeSlot& slot = seq->slot;
      if (options_.k == 0 || !draft_) {  // (without a draft yet: model-free blocks only)
        seq->proposer = std::make_unique<NullProposer>();
        slot.can_draft = false;
      } else {
        seq->proposer = NewDraftProposer(draft_, p.generate.sampling, 0.0f, draft_pool_);
        slot.draft_proposer = dynamic_cast<DraftModelProposer*>(seq->proposer.get());
        slot.feature_proposer = dynamic_cast<FeatureDraftProposer*>(seq->proposer.get());
      }
      slot.fixed_k = std::max(0, options_.k);
      if (options_.k < 0) slot.policy = PolicyFor(seq->series->label, draft_version_);
      if (!options_.tree_branching.empty() && slot.draft_proposer != nullptr) {
        if (options_.k < 0) {
          slot.tree = TreeFor(seq->series->label, draft_version_);
        } else {
          slot.draft_proposer->set_tree_branching(options_.tree_branching);
        }
      }
      const int greedy = p.generate.sampling.greedy() ? 0 : 1;
      if (options_.k < 0 && options_.prompt_lookup) {
        seq->lookup = std::make_unique<PromptLookupProposer>(target_->config().vocab_size,
                                                             p.generate.sampling.greedy());
        slot.lookup = seq->lookup.get();
        slot.lookup_acceptance = &suffixes_[seq->series->label].lookup_acceptance[greedy];
      }
      if (options_.k < 0 && options_.suffix_tokens > 0) {
        SuffixState& st = suffixes_[seq->series->label];
        if (!st.index) {
          SuffixIndex::Options so;
          so.max_tokens = options_.suffix_tokens;
          st.index = std::make_unique<SuffixIndex>(so);
        }
        seq->suffix = std::make_unique<SuffixProposer>(target_->config().vocab_size,
                                                       p.generate.sampling.greedy(),
                                                       st.index.get());
        slot.suffix = seq->suffix.get();
        slot.suffix_acceptance = &st.acceptance[greedy];
      }
      seq->draft_version = draft_version_;
      // The prompt is prefilled in chunks by the steps to come (TakePrefillChunks).
      seq->decoder = std::make_unique<SpeculativeDecoder>(target_, seq->proposer.get(), p.prompt,
                                                          p.generate, /*defer_prefill=*/true,
                                                          target_pool_);
      slot.decoder = seq->decoder.get();
      slot.proposer = seq->proposer.get();
      seq->text = std::make_unique<TextStream>(tokenizer_, p.prompt.back(), p.stop);
      if (sample_logger_ && p.log) {
        // The record carries the domain's label (at most max_domains names and "other"), so
        // what the trainer keeps per domain is bounded whatever domains clients send.
        seq->trace = sample_logger_->Begin(seq->series->label, p.request_id, seq->draft_version,
                                           p.generate.sampling, p.prompt);
        // The logger's share of a step is part of what its rows cost.
        Sequence* s = seq.get();
        slot.on_commit = [this, s](const DecodeSlot& done, const at::Tensor& rows) {
          const DraftBlock& block = done.decoder->draft();
          const int drafted = static_cast<int>(block.tokens.size());
          if (block.is_tree()) {
            // A tree is logged as its accepted path: the target's rows at the positions it
            // committed (the row before the tree, then each path node's).
            const std::vector<int>& path = done.decoder->last_tree_path();
            const int64_t c = rows.size(0) - drafted;  // catch-up rows, the pending token last
            std::vector<int64_t> index = {c - 1};
            std::vector<int> tokens;
            for (int node : path) {
              index.push_back(c + node);
              tokens.push_back(block.tokens[node]);
            }
            const at::Tensor picked = rows.index_select(
                0, at::from_blob(index.data(), {static_cast<int64_t>(index.size())}, at::kLong));
            sample_logger_->AddStep(s->trace, done.start_pos, tokens,
                                    static_cast<int>(path.size()), picked);
            return;
          }
          if (done.logged_top_k.ids.defined()) {  // taken on the logits' device
            sample_logger_->AddStepTopK(s->trace, done.start_pos, block.tokens,
                                        done.decoder->last_accepted(), done.logged_top_k);
            return;
          }
          sample_logger_->AddStep(s->trace, done.start_pos, block.tokens,
                                  done.decoder->last_accepted(),
                                  rows.narrow(0, rows.size(0) - (drafted + 1), drafted + 1));
        };
        slot.log_top_k = sample_logger_->top_k();
        slot.commit_needs_rows = p.logprobs >= 0;  // StepLogprobs reads them
      }
      if (p.logprobs >= 0) {
        // The emitted tokens' log-probs, after the logger's part: their cost is the rows' too.
        Sequence* s = seq.get();
        slot.on_commit = [s, log = std::move(slot.on_commit)](const DecodeSlot& done,
                                                              const at::Tensor& rows) {
          if (log) log(done, rows);
          const CompletionParams& params = s->channel->params();
          StepLogprobs(done, rows, params.generate.sampling, params.logprobs,
                       &s->logprob_scratch, &s->step_logprobs);
        };
      }
    } catch (const std::exception& e) {
      metrics_->ObserveSchedulerError();
      Fail(seq.get(), 500, std::string("prefill failed: ") + e.what());
      continue;
    }
    if (seq->decoder->finished()) {  // max_tokens == 0
      Finish(seq.get(), "length");
      continue;
    }
    active_.push_back(std::move(seq));
  }
}

bool Scheduler::SpeculationPays(const DecodeSlot& slot, int batch, int64_t context) const {
  if (slot.policy == nullptr) return slot.fixed_k > 0;
  // A domain decoding plainly (its policy's settled choice, probes aside) leaves the draft
  // behind: its catch-up is ChooseK's to weigh, should the domain speculate again.
  if (slot.policy->current() == 0) return false;
  const double plain = slot.policy->ExpectedRate(costs_, 0, batch, context);
  for (int k = 1; k <= slot.policy->options().k_max; ++k) {
    if (slot.policy->ExpectedRate(costs_, k, batch, context) > plain) return true;
  }
  return false;
}

// Chunked prefill, as vLLM's and SGLang's schedulers: each step carries prompt tokens of the
// prefilling sequences, oldest first, in the target forward of the decoding ones, as many as
// PrefillBudget allows (serve/prefill_budget.h). Where speculation pays at this batch (a
// fixed k, or the domain's policy speculating and expecting more tokens per second at some
// k > 0 than plainly), the draft is fed the same chunks in one batched draft forward, so that
// its first block does not catch up on the whole prompt; elsewhere the draft is left behind
// and its catch-up is the policy's to weigh (a 16-client batch on target-wide-46m decodes
// mostly plainly). Returns the chunks' target seconds by the table; the sequences whose
// chunks ride are in *chunked.
double Scheduler::TakePrefillChunks(const std::vector<Sequence*>& prefilling, int decoding,
                                    int decode_rows, double context, PrefillChunks* chunks,
                                    std::vector<Sequence*>* chunked) {
  // How many tokens fit in the step, given the first chunk's prefix.
  const int64_t budget =
      PrefillBudget(costs_, decode_rows, decoding, static_cast<int>(prefilling.size()), context,
                    prefilling.front()->decoder->prefilled());
  struct Planned {
    Sequence* seq;
    int64_t tokens;
  };
  std::vector<Planned> plan;
  std::vector<ForwardInput> draft_inputs;
  std::vector<Sequence*> drafted;
  int64_t total = 0;
  for (Sequence* seq : prefilling) {
    if (total >= budget) break;
    int64_t n = std::min(budget - total, seq->decoder->prefill_remaining());
    // The chunk's cache blocks, after the decoding sequences took theirs: as much of it as
    // the pool has room for.
    const int64_t past = seq->decoder->prefilled();
    n = std::min(n, seq->decoder->cache_capacity() - past +
                        target_pool_->available() * KVBlockPool::kBlockTokens);
    if (n <= 0 || !seq->decoder->ReserveCache(past + n)) continue;
    plan.push_back({seq, n});
    total += n;
    if (seq->slot.draft_proposer != nullptr &&
        seq->slot.draft_proposer->ReserveCache(past + n) &&
        SpeculationPays(seq->slot, decoding + static_cast<int>(prefilling.size()),
                        static_cast<int64_t>(seq->decoder->tokens().size()))) {
      ForwardInput in = seq->slot.draft_proposer->PrefillInput(
          seq->decoder->tokens(), static_cast<size_t>(seq->decoder->prefilled() + n));
      if (!in.tokens.empty()) {
        draft_inputs.push_back(std::move(in));
        drafted.push_back(seq);
      }
    }
  }
  if (!draft_inputs.empty()) {
    try {
      draft_.model->Forward(draft_inputs);
    } catch (const std::exception& e) {  // the batch's forward touched them all
      for (Sequence* seq : drafted) {
        metrics_->ObserveSchedulerError();
        Fail(seq, 500, std::string("prefill failed: draft forward failed: ") + e.what());
      }
    }
  }
  double seconds = 0;
  int rows = decode_rows;
  for (const Planned& p : plan) {
    if (p.seq->done) continue;
    seconds += PrefillChunkSeconds(costs_, rows, p.tokens, p.seq->decoder->prefilled());
    rows += static_cast<int>(p.tokens);
    const int64_t begin = p.seq->decoder->prefilled();
    ForwardInput in = p.seq->decoder->PrefillInput(p.tokens);
    if (p.seq->trace != nullptr) {
      // The target's row at each prompt position the chunk computes, for the replay buffer:
      // row i predicts tokens[begin + i + 1]; the prompt's last position is the first
      // decoding step's, and a resumed sequence's generated tokens were logged as steps.
      const int64_t end = std::min<int64_t>(begin + static_cast<int64_t>(in.tokens.size()),
                                            p.seq->decoder->prompt_len() - 1);
      p.seq->chunk_first = std::max(begin + 1, p.seq->prompt_logged_to);
      for (int64_t pos = p.seq->chunk_first; pos <= end; ++pos) {
        in.logit_rows.push_back(pos - begin - 1);
      }
      p.seq->prompt_logged_to = std::max(p.seq->prompt_logged_to, end + 1);
    }
    chunks->inputs.push_back(std::move(in));
    chunked->push_back(p.seq);
    // A feature draft reads the target's features of every prompt position.
    if (p.seq->slot.feature_proposer != nullptr) {
      chunks->feature_layers = p.seq->slot.feature_proposer->feature_layers();
    }
  }
  return seconds;
}

void Scheduler::Step() {
  // Decoding itself is DecodeStep (common/engine/decode_step.h), as for `specloop generate`;
  // here: each sequence's slot, prompt chunks for the prefilling ones, then what the server
  // does with the outcomes.
  std::vector<Sequence*> stepping, prefilling;
  std::vector<DecodeSlot*> slots;
  for (auto& up : active_) {
    Sequence* seq = up.get();
    if (seq->channel->cancelled()) {
      Finish(seq, "cancelled");
      continue;
    }
    if (seq->decoder->prefill_remaining() > 0) {
      prefilling.push_back(seq);
      continue;
    }
    stepping.push_back(seq);
    slots.push_back(&seq->slot);
  }
  if (slots.empty() && prefilling.empty()) return;
  ReserveForStep();
  // Preempted sequences leave the step.
  auto gone = [](Sequence* s) { return s->done || s->preempted; };
  stepping.erase(std::remove_if(stepping.begin(), stepping.end(), gone), stepping.end());
  prefilling.erase(std::remove_if(prefilling.begin(), prefilling.end(), gone), prefilling.end());
  slots.clear();
  for (Sequence* seq : stepping) slots.push_back(&seq->slot);
  if (slots.empty() && prefilling.empty()) return;
  double context = 0;  // the batch's mean, for the plain step it is compared with
  for (const Sequence* seq : stepping) context += seq->decoder->tokens().size();
  if (!stepping.empty()) context /= stepping.size();
  const Clock::time_point t0 = Clock::now();
  PrefillChunks chunks;
  std::vector<Sequence*> chunked;
  double chunk_seconds = 0;
  if (!prefilling.empty()) {
    // The decoding rows to come: the last step's, while the batch is the same size.
    const int decode_rows = stepping.empty() ? 0
                            : last_decode_.sequences == static_cast<int>(stepping.size())
                                ? last_decode_.rows
                                : static_cast<int>(stepping.size());
    chunk_seconds = TakePrefillChunks(prefilling, static_cast<int>(stepping.size()), decode_rows,
                                      context, &chunks, &chunked);
  }
  DecodeStepTimes times;
  DecodeStep(*target_, &costs_, slots, &times, &chunks);
  const double step_seconds = SecondsSince(t0);
  if (!chunks.error.empty()) {
    for (Sequence* seq : chunked) {
      metrics_->ObserveSchedulerError();
      Fail(seq, 500, "prefill failed: " + chunks.error);
    }
  } else {
    for (size_t i = 0; i < chunked.size(); ++i) {
      if (chunks.hidden[i].defined()) {
        const int64_t n = chunks.hidden[i].size(0);
        chunked[i]->decoder->PrefillFeatures(chunked[i]->decoder->prefilled() - n,
                                             chunks.hidden[i]);
      }
    }
    for (size_t i = 0; i < chunked.size(); ++i) {
      Sequence* seq = chunked[i];
      if (seq->trace == nullptr || seq->chunk_first >= seq->prompt_logged_to) continue;
      sample_logger_->AddPromptRows(seq->trace, static_cast<uint32_t>(seq->chunk_first),
                                    chunks.logits[i]);
      seq->chunk_first = seq->prompt_logged_to;
    }
  }
  if (times.sequences + times.chunks > 0) {
    metrics_->ObserveTargetForward(times.forward_seconds, times.sequences + times.chunks);
  }
  if (slots.empty()) return;
  last_decode_ = times;
  // What a plain step of this batch would have taken: one row per sequence, and the same
  // prompt chunks riding.
  const double plain_step_seconds =
      costs_.TargetSeconds(static_cast<int>(stepping.size()), context) + chunk_seconds;

  for (Sequence* seq : stepping) {
    const DecodeSlot* slot = &seq->slot;
    if (!slot->error.empty()) {
      metrics_->ObserveSchedulerError();
      Fail(seq, 500, slot->error);
      continue;
    }
    try {
      const int drafted = static_cast<int>(seq->decoder->draft().tokens.size());
      const int accepted = seq->decoder->last_accepted();
      const SpeculativeDecoder::OptimalAcceptance& optimal = seq->decoder->last_optimal();
      seq->spec_decode.Observe(drafted, accepted);
      const bool tree = slot->kind == BlockKind::kTree;
      const bool lookup = slot->kind == BlockKind::kLookup;
      if (tree || IsModelFree(slot->kind)) {
        using Block = ServingMetrics::Block;
        const Block block = tree ? Block::kTree : lookup ? Block::kLookup : Block::kSuffix;
        metrics_->ObserveBlockStep(seq->series, block, drafted, accepted,
                                   static_cast<int>(slot->emitted.size()));
        SpeculativeUsage::Suffix& usage = tree     ? seq->tree_usage
                                          : lookup ? seq->lookup_usage
                                                   : seq->suffix_usage;
        usage.steps++;
        usage.drafted += drafted;
        usage.accepted += accepted;
        usage.tested += seq->decoder->last_tested();
      } else {
        metrics_->ObserveStep(seq->series, slot->k, drafted, accepted,
                              static_cast<int>(slot->emitted.size()), optimal.expected,
                              optimal.positions);
      }
      metrics_->ObserveDecodeTime(seq->series, step_seconds,
                                  static_cast<int>(slot->emitted.size()), plain_step_seconds);
      if (swap_hook_ && drafted > 0 && !IsModelFree(slot->kind) && !tree) {
        swap_hook_->ObserveAcceptance(draft_version_, seq->series->label, drafted, accepted);
      }
      if (drafted > 0 && slot->draft_seconds > 0) {
        metrics_->ObserveDraftForward(slot->draft_seconds);
      }
      if (!slot->emitted.empty() && !seq->got_first_token) {
        seq->got_first_token = true;
        seq->ttft_seconds = SecondsSince(seq->channel->created());
      }
      // The step's output: the emitted tokens up to the first extra stop id, pushed one by one
      // where stop strings may end the text, so that it ends at the token completing the first
      // one to appear (whatever k grouped the tokens into steps).
      const CompletionParams& p = seq->channel->params();
      std::vector<int> out = slot->emitted;
      const bool stop_id = CutAtStopId(p.stop_token_ids, &out);
      seq->cut_tokens += static_cast<int64_t>(slot->emitted.size() - out.size());
      std::string delta;
      size_t kept = out.size();
      if (p.stop.empty()) {
        delta = seq->text->Push(out);
      } else {
        for (size_t i = 0; i < out.size() && !seq->text->stopped(); ++i) {
          delta += seq->text->Push({out[i]});
          kept = i + 1;
        }
      }
      RequestEvent e;
      e.text = std::move(delta);
      if (p.logprobs >= 0 && seq->step_logprobs.size() == slot->emitted.size()) {
        e.logprobs.assign(seq->step_logprobs.begin(), seq->step_logprobs.begin() + kept);
      }
      seq->step_logprobs.clear();
      if (!e.text.empty() || !e.logprobs.empty()) seq->channel->Post(std::move(e));
      if (seq->text->stopped() || seq->decoder->finished() || stop_id) {
        Finish(seq, seq->text->stopped() || seq->decoder->hit_eos() || stop_id ? "stop"
                                                                                : "length");
      }
    } catch (const std::exception& e) {
      metrics_->ObserveSchedulerError();
      Fail(seq, 500, std::string("verification failed: ") + e.what());
    }
  }
}

void Scheduler::ReserveForStep() {
  for (size_t i = 0; i < active_.size(); ++i) {
    Sequence* seq = active_[i].get();
    if (seq->done || seq->preempted || seq->decoder->prefill_remaining() > 0) continue;
    const int64_t positions = StepPositions(static_cast<int64_t>(seq->decoder->tokens().size()));
    while (!(seq->decoder->ReserveCache(positions) &&
             (seq->slot.draft_proposer == nullptr ||
              seq->slot.draft_proposer->ReserveCache(positions)))) {
      // The newest other sequence goes, else this one (admission left room for one alone).
      Sequence* victim = seq;
      for (size_t j = active_.size(); j-- > i + 1;) {
        if (!active_[j]->done && !active_[j]->preempted) {
          victim = active_[j].get();
          break;
        }
      }
      Preempt(victim);
      if (victim == seq) break;
    }
  }
  // Preempted sequences wait, oldest first, ahead of new requests.
  for (auto& up : active_) {
    if (up->preempted && !up->done) preempted_.push_back(std::move(up));
  }
  active_.erase(std::remove(active_.begin(), active_.end(), nullptr), active_.end());
}

void Scheduler::Preempt(Sequence* seq) {
  seq->preempted = true;
  seq->decoder->DropCache();
  if (seq->slot.draft_proposer != nullptr) {
    seq->slot.draft_proposer->DropCache(seq->decoder->tokens());
  }
  metrics_->ObservePreemption();
}

void Scheduler::Fail(Sequence* seq, int http_status, const std::string& message) {
  seq->done = true;
  RequestEvent e;
  e.type = RequestEvent::Type::kError;
  e.http_status = http_status;
  e.error = message;
  seq->channel->Post(std::move(e));
  metrics_->ObserveRequest(seq->series, "error", SecondsSince(seq->channel->created()),
                           seq->ttft_seconds, static_cast<int>(seq->channel->params().prompt.size()));
  if (seq->trace && seq->decoder) sample_logger_->Finish(seq->trace, seq->decoder->tokens());
  seq->trace.reset();
}

void Scheduler::Finish(Sequence* seq, const std::string& reason) {
  seq->done = true;
  const CompletionParams& p = seq->channel->params();
  // The request's prompt and output join its domain's suffix index for later requests, and
  // their cache blocks the prefix cache.
  if (seq->suffix && seq->decoder) suffixes_[seq->series->label].index->Add(seq->decoder->tokens());
  if (seq->decoder) {
    seq->decoder->DropCache();
    if (seq->slot.draft_proposer) seq->slot.draft_proposer->DropCache(seq->decoder->tokens());
  }
  if (seq->text && reason != "cancelled") {
    std::string tail = seq->text->Finish();
    if (!tail.empty()) {
      RequestEvent e;
      e.text = std::move(tail);
      seq->channel->Post(std::move(e));
    }
  }
  RequestEvent done;
  done.type = RequestEvent::Type::kDone;
  done.finish_reason = reason;
  done.prompt_tokens = static_cast<int>(p.prompt.size());
  if (seq->decoder) {
    const SpeculativeStats& st = seq->decoder->stats();
    done.completion_tokens =
        static_cast<int>(seq->decoder->tokens().size() - p.prompt.size() - seq->cut_tokens);
    done.speculative.steps = st.steps;
    done.speculative.drafts = st.drafts;
    done.speculative.drafted = st.drafted;
    done.speculative.accepted = st.accepted;
    done.speculative.tested = st.tested;
  }
  done.speculative.draft_version = seq->draft_version;
  done.speculative.suffix = seq->suffix_usage;
  done.speculative.lookup = seq->lookup_usage;
  done.speculative.tree = seq->tree_usage;
  done.spec_decode = std::move(seq->spec_decode);
  seq->channel->Post(std::move(done));
  metrics_->ObserveRequest(seq->series, reason, SecondsSince(seq->channel->created()),
                           seq->ttft_seconds, static_cast<int>(p.prompt.size()));
  if (seq->trace && seq->decoder) sample_logger_->Finish(seq->trace, seq->decoder->tokens());
  seq->trace.reset();
}

}  // namespace specloop
