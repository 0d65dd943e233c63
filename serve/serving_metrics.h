// ServingMetrics: the serving process's Prometheus families (DESIGN.md section 8) and the
// per-domain acceptance drift behind them. The scheduler records; GET /metrics renders.
//
// Domain labels are capped: the first `max_domains` distinct domains keep their name, every
// later one is folded into "other" (DomainLabel()), so each domain-labelled family holds at
// most max_domains + 1 domains. The scheduler keys its per-domain state by the same label and
// logs it as the records' domain.
//
// Thread safety: all methods may be called from any thread. The per-domain series are looked
// up once per request (ForDomain, one mutex) and then updated lock-free.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/observe/acceptance_drift.h"
#include "common/observe/metrics.h"

namespace specloop {

class ReplayLogger;
class SampleLogger;

struct ServingMetricsOptions {
  // Distinct domain labels kept before folding into "other". Default: 16.
  size_t max_domains = 16;
  // Largest speculation length (accepted-per-position series). Default: 8.
  int k_max = 8;
  // Acceptance windows and drift detector. Default: DriftOptions().
  DriftOptions drift;
  // Labels on every series (metrics::Registry::SetConstantLabels), e.g. {{"worker", "2"}} on
  // one worker of many. Default: none.
  metrics::Labels constant_labels;
};

class ServingMetrics {
 public:
  static Status Create(const ServingMetricsOptions& options, std::unique_ptr<ServingMetrics>* out);

  // The label for `domain`: itself while fewer than max_domains are known, else "other".
  std::string DomainLabel(const std::string& domain);

  // One domain's series (stable pointers into the registry).
  struct DomainSeries {
    std::string label;
    metrics::Counter* prompt_tokens;
    metrics::Counter* generated_tokens;
    metrics::Counter* steps;
    metrics::Counter* drafts;  // steps that proposed at least one token
    metrics::Counter* suffix_steps;
    metrics::Counter* suffix_draft_tokens;
    metrics::Counter* suffix_accepted_tokens;
    metrics::Counter* lookup_steps;  // prompt lookup's blocks, likewise
    metrics::Counter* lookup_draft_tokens;
    metrics::Counter* lookup_accepted_tokens;
    metrics::Counter* tree_steps;  // the draft's token trees, likewise
    metrics::Counter* tree_draft_tokens;
    metrics::Counter* tree_accepted_tokens;
    metrics::Counter* draft_tokens;
    metrics::Counter* accepted_tokens;
    std::vector<metrics::Counter*> accepted_at;  // [position]
    metrics::Histogram* tokens_per_step;
    metrics::Histogram* duration;
    metrics::Histogram* ttft;
    metrics::Gauge* speculation_length;
    metrics::Counter* decode_seconds;  // see ObserveDecodeTime
    metrics::Counter* plain_seconds;
  };
  // The series of an already folded label (DomainLabel()).
  DomainSeries* ForDomain(const std::string& label);

  // One verification step of a sequence: `k` asked, `drafted` proposed, `accepted` of them
  // accepted, `emitted` tokens out; alpha* of the step (SpeculativeDecoder::last_optimal()):
  // `optimal` expected acceptances over `optimal_positions` tested positions. Feeds the
  // acceptance windows and the drift detector when drafted > 0.
  void ObserveStep(DomainSeries* d, int k, int drafted, int accepted, int emitted,
                   double optimal = 0.0, int optimal_positions = 0);
  // Where a step's block came from, when not from the draft model's chain.
  enum class Block { kSuffix, kLookup, kTree };
  // A step whose block came from the suffix proposer, prompt lookup, or was a token tree of
  // the draft's (`drafted`: its nodes; `accepted`: those on the path taken): counted as a step
  // with its tokens, and in that block's families (specloop_suffix_*, _lookup_*, _tree_*), not
  // in the chains' acceptance per position (a tree's is higher by construction) nor its drift.
  void ObserveBlockStep(DomainSeries* d, Block block, int drafted, int accepted, int emitted);
  // One sequence's share of a decode step: the step took `seconds` and emitted `emitted`
  // tokens for it, where a plain step of the same batch would take `plain_step_seconds`
  // (the step cost table's estimate). Per domain, specloop_decode_seconds_total sums the
  // steps' seconds and specloop_plain_equivalent_seconds_total the plain steps the same
  // tokens would have needed, so their ratio is the speed over plain decoding per stream.
  void ObserveDecodeTime(DomainSeries* d, double seconds, int emitted, double plain_step_seconds);
  // A request ended: finish_reason "stop", "length", "cancelled" or "error".
  void ObserveRequest(DomainSeries* d, const std::string& finish_reason, double seconds,
                      double ttft_seconds, int prompt_tokens);
  // An HTTP request answered with an error status (4xx/5xx) before or instead of decoding.
  void ObserveHttpError(int status);
  void ObserveTargetForward(double seconds, int batch_size);
  void ObserveDraftForward(double seconds);
  void ObserveSchedulerError();
  void SetQueue(int active, int waiting);
  // The paged KV cache: blocks held by sequences out of the pool's, each of `block_tokens`
  // positions; the prefix cache's running totals (tokens looked up, found); preemptions.
  void SetKvCache(int64_t used_blocks, int64_t blocks, int64_t block_tokens);
  void SetPrefixCache(int64_t query_tokens, int64_t hit_tokens);
  void ObservePreemption();
  // CUDA graphs of a model serving now ("target" or "draft"; LlamaModel::static_stats()):
  // those captured, and the captures that failed (after one, the model decodes without).
  void SetCudaGraphs(const std::string& model, int64_t captured, int64_t capture_failures);

  // Hot-swap (DESIGN.md section 7): the version serving now, swaps, failures, rollbacks.
  void SetDraftVersion(uint64_t version);
  uint64_t draft_version();
  // The kind serving now (Draft::kind(): "model", "eagle3" or "none").
  void SetDraftKind(const std::string& kind);
  std::string draft_kind();
  void ObserveSwap();
  void ObserveSwapFailure(const std::string& reason);
  void ObserveRollback();

  // The registry in text exposition format 0.0.4, after refreshing the alpha/drift gauges and
  // the buffer counters and sizes from `logger` / `sample_logger` (either may be null).
  std::string Render(const ReplayLogger* logger, const SampleLogger* sample_logger);

  // Running totals of one domain's counters, for the status page.
  struct DomainTotals {
    double generated = 0;
    double drafts = 0, accepted = 0;  // the draft model's (suffix blocks apart)
    double decode_seconds = 0, plain_seconds = 0;
  };
  std::map<std::string, DomainTotals> Totals();

  const DomainDrift& drift() const { return drift_; }
  metrics::Registry& registry() { return registry_; }

 private:
  explicit ServingMetrics(const ServingMetricsOptions& options);
  Status Register();

  const ServingMetricsOptions options_;
  metrics::Registry registry_;
  DomainDrift drift_;

  metrics::Family<metrics::Counter>*requests_, *http_errors_, *prompt_tokens_, *generated_,
      *steps_, *drafts_, *suffix_steps_, *suffix_drafted_, *suffix_accepted_, *lookup_steps_,
      *lookup_drafted_, *lookup_accepted_, *tree_steps_, *tree_drafted_, *tree_accepted_,
      *drafted_, *accepted_, *accepted_at_, *drift_events_,
      *swaps_, *swap_failures_, *rollbacks_,
      *records_written_, *records_dropped_, *scheduler_errors_, *decode_seconds_,
      *plain_seconds_, *preemptions_, *prefix_queries_, *prefix_hits_;
  metrics::Family<metrics::Histogram>*duration_, *ttft_, *tokens_per_step_, *forward_,
      *batch_size_;
  metrics::Family<metrics::Gauge>*alpha_, *optimal_alpha_, *acceptance_length_, *drift_gauge_,
      *spec_length_, *draft_version_, *draft_info_,
      *active_, *waiting_, *buffer_bytes_, *buffer_memory_, *kv_usage_, *kv_capacity_,
      *cuda_graphs_, *cuda_graph_failures_;

  std::mutex mu_;
  std::vector<std::string> known_domains_;                         // GUARDED_BY(mu_)
  std::map<std::string, std::unique_ptr<DomainSeries>> series_;   // GUARDED_BY(mu_)
  std::string draft_kind_ = "none";                                 // GUARDED_BY(mu_)
  std::mutex render_mu_;  // serializes Render()'s counter syncing
};

}  // namespace specloop
