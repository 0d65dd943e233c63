#include "serve/serving_metrics.h"

#include <algorithm>

#include "buffer/replay_logger.h"
#include "common/observe/process_metrics.h"
#include "serve/sample_logger.h"

namespace specloop {

namespace {
// Raises counter `c` to `value` (counters only go up; a source counter never goes down).
void SyncCounter(metrics::Counter& c, double value) { c.Increment(value - c.Value()); }
}  // namespace

ServingMetrics::ServingMetrics(const ServingMetricsOptions& options)
    : options_(options), drift_(options.drift, options.max_domains + 1) {}

Status ServingMetrics::Create(const ServingMetricsOptions& options,
                              std::unique_ptr<ServingMetrics>* out) {
  if (std::string e = options.drift.Validate(); !e.empty()) return Status::InvalidArgument(e);
  std::unique_ptr<ServingMetrics> m(new ServingMetrics(options));
  Status s = m->registry_.SetConstantLabels(options.constant_labels);
  if (s.ok()) s = m->Register();
  if (!s.ok()) return s;
  *out = std::move(m);
  return Status::OK();
}

Status ServingMetrics::Register() {
  const size_t d = options_.max_domains + 1;  // the kept domains and "other"
  const size_t kpos = static_cast<size_t>(std::max(1, options_.k_max));
  const auto secs = metrics::ExponentialBuckets(0.005, 2, 14);  // 5 ms .. 41 s
  Status s;
  auto counter = [&](const char* name, const char* help, std::vector<std::string> labels,
                     size_t cap, metrics::Family<metrics::Counter>** f) {
    if (s.ok()) s = registry_.AddCounter({name, help, std::move(labels), cap}, f);
  };
  auto gauge = [&](const char* name, const char* help, std::vector<std::string> labels,
                   size_t cap, metrics::Family<metrics::Gauge>** f) {
    if (s.ok()) s = registry_.AddGauge({name, help, std::move(labels), cap}, f);
  };
  auto histogram = [&](const char* name, const char* help, std::vector<std::string> labels,
                       size_t cap, const std::vector<double>& bounds,
                       metrics::Family<metrics::Histogram>** f) {
    if (s.ok()) s = registry_.AddHistogram({name, help, std::move(labels), cap}, bounds, f);
  };
  counter("specloop_requests_total", "Completion requests finished, by domain and reason.",
          {"domain", "finish_reason"}, d * 4, &requests_);
  counter("specloop_http_errors_total", "HTTP requests answered with an error status.",
          {"code"}, 16, &http_errors_);
  counter("specloop_prompt_tokens_total", "Prompt tokens of finished requests.", {"domain"}, d,
          &prompt_tokens_);
  counter("specloop_generated_tokens_total", "Tokens generated.", {"domain"}, d, &generated_);
  counter("specloop_spec_steps_total", "Target verification steps.", {"domain"}, d, &steps_);
  counter("specloop_drafts_total", "Verification steps that verified a draft (k > 0 proposed).",
          {"domain"}, d, &drafts_);
  counter("specloop_draft_tokens_total", "Draft tokens proposed.", {"domain"}, d, &drafted_);
  counter("specloop_suffix_steps_total",
          "Steps that verified a suffix-proposer block (earlier requests' continuations).",
          {"domain"}, d, &suffix_steps_);
  counter("specloop_suffix_draft_tokens_total", "Tokens proposed by the suffix proposer.",
          {"domain"}, d, &suffix_drafted_);
  counter("specloop_suffix_accepted_tokens_total", "Suffix-proposer tokens accepted.",
          {"domain"}, d, &suffix_accepted_);
  counter("specloop_lookup_steps_total",
          "Steps that verified a prompt-lookup block (the request's own earlier tokens).",
          {"domain"}, d, &lookup_steps_);
  counter("specloop_lookup_draft_tokens_total", "Tokens proposed by prompt lookup.", {"domain"},
          d, &lookup_drafted_);
  counter("specloop_lookup_accepted_tokens_total", "Prompt-lookup tokens accepted.", {"domain"},
          d, &lookup_accepted_);
  counter("specloop_tree_steps_total", "Steps that verified a token tree of the draft's.",
          {"domain"}, d, &tree_steps_);
  counter("specloop_tree_draft_tokens_total", "Token-tree nodes proposed.", {"domain"}, d,
          &tree_drafted_);
  counter("specloop_tree_accepted_tokens_total", "Token-tree nodes accepted (the path taken).",
          {"domain"}, d, &tree_accepted_);
  counter("specloop_accepted_tokens_total", "Draft tokens accepted.", {"domain"}, d, &accepted_);
  counter("specloop_decode_seconds_total",
          "Decode steps' seconds, summed over the sequences in them (each counts the whole step).",
          {"domain"}, d, &decode_seconds_);
  counter("specloop_plain_equivalent_seconds_total",
          "Seconds plain decoding would have taken for the same tokens (the step cost table's "
          "plain step of each batch); over specloop_decode_seconds_total: speed over plain.",
          {"domain"}, d, &plain_seconds_);
  counter("specloop_accepted_tokens_by_position_total",
          "Steps whose draft token at this position (0-based) was accepted.",
          {"domain", "position"}, d * kpos, &accepted_at_);
  counter("specloop_acceptance_drift_events_total",
          "Acceptance changes detected (CUSUM), by direction.", {"domain", "direction"}, d * 2,
          &drift_events_);
  counter("specloop_draft_swaps_total", "Draft models installed by hot-swap.", {}, 1, &swaps_);
  counter("specloop_draft_swap_failures_total", "Draft hot-swaps refused, by reason.",
          {"reason"}, 16, &swap_failures_);
  counter("specloop_draft_rollbacks_total", "Draft versions rolled back.", {}, 1, &rollbacks_);
  counter("specloop_buffer_records_written_total", "Replay records written to the buffer.", {},
          1, &records_written_);
  counter("specloop_buffer_records_dropped_total",
          "Replay records (or steps, reason step_backlog) dropped, by reason.", {"reason"}, 8,
          &records_dropped_);
  counter("specloop_scheduler_errors_total", "Sequences failed by an engine error.", {}, 1,
          &scheduler_errors_);
  counter("specloop_preemptions_total",
          "Sequences preempted for KV cache blocks (recomputed when resumed).", {}, 1,
          &preemptions_);
  counter("specloop_prefix_cache_queries_total",
          "Prompt tokens looked up in the target's prefix cache.", {}, 1, &prefix_queries_);
  counter("specloop_prefix_cache_hits_total",
          "Prompt tokens found in the target's prefix cache (not computed).", {}, 1,
          &prefix_hits_);
  histogram("specloop_request_duration_seconds", "Request duration, arrival to last token.",
            {"domain"}, d, secs, &duration_);
  histogram("specloop_time_to_first_token_seconds", "Arrival to first generated token.",
            {"domain"}, d, secs, &ttft_);
  histogram("specloop_tokens_per_step", "Tokens emitted per verification step.", {"domain"}, d,
            metrics::LinearBuckets(1, 1, static_cast<int>(kpos) + 1), &tokens_per_step_);
  histogram("specloop_forward_duration_seconds", "Model forward durations.", {"model"}, 2,
            metrics::ExponentialBuckets(1e-5, 2, 20), &forward_);
  histogram("specloop_batch_size",
            "Sequences per target forward (decoding ones and prompt chunks).", {}, 1,
            metrics::ExponentialBuckets(1, 2, 9), &batch_size_);
  gauge("specloop_acceptance_rate",
        "Per-token draft acceptance rate (independent of k) over a short and a long window.",
        {"domain", "window"}, d * 2, &alpha_);
  gauge("specloop_optimal_acceptance_rate",
        "Acceptance rate the optimal verifier would reach on the drafts proposed (long window).",
        {"domain"}, d, &optimal_alpha_);
  gauge("specloop_mean_acceptance_length",
        "Tokens per speculative step, 1 + accepted (long window).", {"domain"}, d,
        &acceptance_length_);
  gauge("specloop_acceptance_drift", "Short-window minus long-window acceptance rate.",
        {"domain"}, d, &drift_gauge_);
  gauge("specloop_speculation_length", "Speculation length (k) last chosen.", {"domain"}, d,
        &spec_length_);
  gauge("specloop_draft_version", "Version of the draft model serving now (0 = as loaded).", {},
        1, &draft_version_);
  gauge("specloop_draft_info",
        "1 for the kind of draft serving now: model (a draft model), eagle3 (a feature draft "
        "over the target's hidden states) or none (plain decoding and suffix blocks).",
        {"kind"}, 3, &draft_info_);
  gauge("specloop_buffer_bytes", "Replay buffer size: live SST files and memtables.", {}, 1,
        &buffer_bytes_);
  gauge("specloop_buffer_memory_bytes",
        "Replay buffer memory: memtables, table readers (index/filter blocks), block cache.",
        {"kind"}, 3, &buffer_memory_);
  gauge("specloop_active_sequences", "Sequences in the running batch.", {}, 1, &active_);
  gauge("specloop_waiting_requests", "Requests queued for the batch.", {}, 1, &waiting_);
  gauge("specloop_kv_cache_usage_ratio",
        "Share of the target's KV cache blocks held by sequences (cached free ones excluded).",
        {}, 1, &kv_usage_);
  gauge("specloop_kv_cache_capacity_tokens", "Positions the target's KV cache pool holds.", {},
        1, &kv_capacity_);
  gauge("specloop_cuda_graphs", "CUDA graphs the model serving now has captured (CUDA only).",
        {"model"}, 2, &cuda_graphs_);
  gauge("specloop_cuda_graph_capture_failures",
        "CUDA graph captures that failed for the model serving now; after one it decodes "
        "without graphs (CUDA only).",
        {"model"}, 2, &cuda_graph_failures_);
  if (s.ok()) s = AddProcessMetrics(&registry_);
  return s;
}

std::string ServingMetrics::DomainLabel(const std::string& domain) {
  std::lock_guard<std::mutex> lock(mu_);
  if (std::find(known_domains_.begin(), known_domains_.end(), domain) != known_domains_.end()) {
    return domain;
  }
  if (known_domains_.size() < options_.max_domains && domain != "other") {
    known_domains_.push_back(domain);
    return domain;
  }
  return "other";
}

ServingMetrics::DomainSeries* ServingMetrics::ForDomain(const std::string& label) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = series_[label];
  if (!slot) {
    auto d = std::make_unique<DomainSeries>();
    const metrics::Labels l = {{"domain", label}};
    d->label = label;
    d->prompt_tokens = &prompt_tokens_->Add(l);
    d->generated_tokens = &generated_->Add(l);
    d->steps = &steps_->Add(l);
    d->drafts = &drafts_->Add(l);
    d->suffix_steps = &suffix_steps_->Add(l);
    d->suffix_draft_tokens = &suffix_drafted_->Add(l);
    d->suffix_accepted_tokens = &suffix_accepted_->Add(l);
    d->lookup_steps = &lookup_steps_->Add(l);
    d->lookup_draft_tokens = &lookup_drafted_->Add(l);
    d->lookup_accepted_tokens = &lookup_accepted_->Add(l);
    d->tree_steps = &tree_steps_->Add(l);
    d->tree_draft_tokens = &tree_drafted_->Add(l);
    d->tree_accepted_tokens = &tree_accepted_->Add(l);
    d->draft_tokens = &drafted_->Add(l);
    d->accepted_tokens = &accepted_->Add(l);
    for (int i = 0; i < std::max(1, options_.k_max); ++i) {
      d->accepted_at.push_back(
          &accepted_at_->Add({{"domain", label}, {"position", std::to_string(i)}}));
    }
    d->tokens_per_step = &tokens_per_step_->Add(l);
    d->duration = &duration_->Add(l);
    d->ttft = &ttft_->Add(l);
    d->speculation_length = &spec_length_->Add(l);
    d->decode_seconds = &decode_seconds_->Add(l);
    d->plain_seconds = &plain_seconds_->Add(l);
    slot = std::move(d);
  }
  return slot.get();
}

void ServingMetrics::ObserveStep(DomainSeries* d, int k, int drafted, int accepted,
                                 int emitted, double optimal, int optimal_positions) {
  d->steps->Increment();
  if (drafted > 0) d->drafts->Increment();
  d->draft_tokens->Increment(drafted);
  d->accepted_tokens->Increment(accepted);
  d->generated_tokens->Increment(emitted);
  for (int i = 0; i < accepted && i < static_cast<int>(d->accepted_at.size()); ++i) {
    d->accepted_at[i]->Increment();
  }
  d->tokens_per_step->Observe(emitted);
  d->speculation_length->Set(k);
  if (drafted > 0) {
    const DriftDirection e =
        drift_.Observe(d->label, drafted, accepted, optimal, optimal_positions);
    if (e != DriftDirection::kNone) {
      drift_events_->Add({{"domain", d->label}, {"direction", DriftDirectionName(e)}})
          .Increment();
    }
  }
}

void ServingMetrics::ObserveBlockStep(DomainSeries* d, Block block, int drafted, int accepted,
                                      int emitted) {
  d->steps->Increment();
  d->generated_tokens->Increment(emitted);
  d->tokens_per_step->Observe(emitted);
  switch (block) {
    case Block::kSuffix:
      d->suffix_steps->Increment();
      d->suffix_draft_tokens->Increment(drafted);
      d->suffix_accepted_tokens->Increment(accepted);
      break;
    case Block::kLookup:
      d->lookup_steps->Increment();
      d->lookup_draft_tokens->Increment(drafted);
      d->lookup_accepted_tokens->Increment(accepted);
      break;
    case Block::kTree:
      d->tree_steps->Increment();
      d->tree_draft_tokens->Increment(drafted);
      d->tree_accepted_tokens->Increment(accepted);
      break;
  }
}

void ServingMetrics::ObserveDecodeTime(DomainSeries* d, double seconds, int emitted,
                                       double plain_step_seconds) {
  if (!(seconds > 0) || !(plain_step_seconds > 0)) return;  // no estimate of a plain step yet
  d->decode_seconds->Increment(seconds);
  d->plain_seconds->Increment(emitted * plain_step_seconds);
}

std::map<std::string, ServingMetrics::DomainTotals> ServingMetrics::Totals() {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, DomainTotals> out;
  for (const auto& [label, d] : series_) {
    DomainTotals& t = out[label];
    t.generated = d->generated_tokens->Value();
    t.drafts = d->drafts->Value();
    t.accepted = d->accepted_tokens->Value();
    t.decode_seconds = d->decode_seconds->Value();
    t.plain_seconds = d->plain_seconds->Value();
  }
  return out;
}

void ServingMetrics::ObserveRequest(DomainSeries* d, const std::string& finish_reason,
                                    double seconds, double ttft_seconds, int prompt_tokens) {
  requests_->Add({{"domain", d->label}, {"finish_reason", finish_reason}}).Increment();
  d->duration->Observe(seconds);
  if (ttft_seconds >= 0) d->ttft->Observe(ttft_seconds);
  d->prompt_tokens->Increment(prompt_tokens);
}

void ServingMetrics::ObserveHttpError(int status) {
  http_errors_->Add({{"code", std::to_string(status)}}).Increment();
}

void ServingMetrics::ObserveTargetForward(double seconds, int batch_size) {
  forward_->Add({{"model", "target"}}).Observe(seconds);
  batch_size_->Add({}).Observe(batch_size);
}

void ServingMetrics::ObserveDraftForward(double seconds) {
  forward_->Add({{"model", "draft"}}).Observe(seconds);
}

void ServingMetrics::ObserveSchedulerError() { scheduler_errors_->Add({}).Increment(); }

void ServingMetrics::ObservePreemption() { preemptions_->Add({}).Increment(); }

void ServingMetrics::SetKvCache(int64_t used_blocks, int64_t blocks, int64_t block_tokens) {
  kv_usage_->Add({}).Set(blocks > 0 ? static_cast<double>(used_blocks) / blocks : 0.0);
  kv_capacity_->Add({}).Set(static_cast<double>(blocks * block_tokens));
}

void ServingMetrics::SetCudaGraphs(const std::string& model, int64_t captured,
                                   int64_t capture_failures) {
  cuda_graphs_->Add({{"model", model}}).Set(static_cast<double>(captured));
  cuda_graph_failures_->Add({{"model", model}}).Set(static_cast<double>(capture_failures));
}

void ServingMetrics::SetPrefixCache(int64_t query_tokens, int64_t hit_tokens) {
  SyncCounter(prefix_queries_->Add({}), static_cast<double>(query_tokens));
  SyncCounter(prefix_hits_->Add({}), static_cast<double>(hit_tokens));
}

void ServingMetrics::SetQueue(int active, int waiting) {
  active_->Add({}).Set(active);
  waiting_->Add({}).Set(waiting);
}

void ServingMetrics::SetDraftVersion(uint64_t version) {
  draft_version_->Add({}).Set(static_cast<double>(version));
}
void ServingMetrics::SetDraftKind(const std::string& kind) {
  for (const char* k : {"model", "eagle3", "none"}) {
    draft_info_->Add({{"kind", k}}).Set(kind == k ? 1 : 0);
  }
  std::lock_guard<std::mutex> lock(mu_);
  draft_kind_ = kind;
}

std::string ServingMetrics::draft_kind() {
  std::lock_guard<std::mutex> lock(mu_);
  return draft_kind_;
}

uint64_t ServingMetrics::draft_version() {
  return static_cast<uint64_t>(draft_version_->Add({}).Value());
}
void ServingMetrics::ObserveSwap() { swaps_->Add({}).Increment(); }
void ServingMetrics::ObserveSwapFailure(const std::string& reason) {
  swap_failures_->Add({{"reason", reason}}).Increment();
}
void ServingMetrics::ObserveRollback() { rollbacks_->Add({}).Increment(); }

std::string ServingMetrics::Render(const ReplayLogger* logger,
                                   const SampleLogger* sample_logger) {
  std::lock_guard<std::mutex> lock(render_mu_);
  for (const DomainDrift::Reading& r : drift_.Snapshot()) {
    alpha_->Add({{"domain", r.domain}, {"window", "short"}}).Set(r.short_alpha);
    alpha_->Add({{"domain", r.domain}, {"window", "long"}}).Set(r.long_alpha);
    drift_gauge_->Add({{"domain", r.domain}}).Set(r.drift);
    acceptance_length_->Add({{"domain", r.domain}}).Set(r.mean_acceptance_length);
    if (r.optimal_alpha >= 0) optimal_alpha_->Add({{"domain", r.domain}}).Set(r.optimal_alpha);
  }
  if (logger) {
    const LoggerStats& st = logger->stats();
    SyncCounter(records_written_->Add({}), st.records_written.load());
    SyncCounter(records_dropped_->Add({{"reason", "queue_full"}}), st.records_dropped_full.load());
    SyncCounter(records_dropped_->Add({{"reason", "invalid"}}), st.records_dropped_invalid.load());
    SyncCounter(records_dropped_->Add({{"reason", "closed"}}), st.records_dropped_closed.load());
    SyncCounter(records_dropped_->Add({{"reason", "write_error"}}), st.records_failed.load());
    ReplayBuffer* buffer = logger->buffer();
    buffer_bytes_->Add({}).Set(static_cast<double>(buffer->ApproximateBytes()));
    const BufferMemory m = buffer->MemoryUsage();
    buffer_memory_->Add({{"kind", "memtables"}}).Set(static_cast<double>(m.memtables));
    buffer_memory_->Add({{"kind", "table_readers"}}).Set(static_cast<double>(m.table_readers));
    buffer_memory_->Add({{"kind", "block_cache"}}).Set(static_cast<double>(m.block_cache));
  }
  if (sample_logger) {
    SyncCounter(records_dropped_->Add({{"reason", "step_backlog"}}),
                sample_logger->steps_dropped());
  }
  return registry_.Serialize();
}

}  // namespace specloop
