// Per-request speculative-decoding metrics as vLLM reports them (vLLM PR 48915, "Per-request
// acceptance stats in OpenAI API responses": --per-request-spec-decode-metrics, the engine's
// RequestSpecDecodeMetrics, the OpenAI server's `metrics.speculative_decoding` object), so that
// tools written for vLLM (AIPerf) read specloop's responses. `specloop serve
// --per-request-spec-metrics none|summary|detailed` (vLLM's spelling is an alias) sets the
// level; off by default, as in vLLM. The response then carries, beside "usage":
//
//   "metrics": {"speculative_decoding": {
//       "mean_acceptance_length": 1 + accepted / steps (1.0 with no step),
//       "draft_acceptance_rate":  accepted / drafted (0.0 with nothing drafted),
//       "acceptance_histogram":   [j]: steps that accepted exactly j draft tokens (dense,
//                                 num_spec_tokens + 1 entries),
//       "num_spec_steps":         verification steps that had a draft (the histogram's sum),
//       "num_accepted_draft_tokens", "num_draft_tokens",
//       "num_spec_tokens":        the most draft tokens a step's chain may hold: --k, or
//                                 --k-max under --k auto
//       detailed only: "per_step_accepted", "per_step_drafted": one entry per step, in order}}
//
// A step counts where its block had at least one draft token (steps of plain decoding do not;
// vLLM's num_drafts likewise), whatever its kind: the draft model's chain, an EAGLE-3 head's,
// a suffix or prompt-lookup block, a token tree (drafted: its nodes, which may exceed
// num_spec_tokens; accepted: its path, which does not). In a stream the object rides in the
// chunk that carries "usage" (specloop's last chunk before [DONE]).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace specloop {

enum class SpecMetricsLevel { kNone, kSummary, kDetailed };

// "none", "summary" or "detailed" -> *level; false (and *level untouched) for anything else.
inline bool ParseSpecMetricsLevel(const std::string& s, SpecMetricsLevel* level) {
  if (s == "none") {
    *level = SpecMetricsLevel::kNone;
  } else if (s == "summary") {
    *level = SpecMetricsLevel::kSummary;
  } else if (s == "detailed") {
    *level = SpecMetricsLevel::kDetailed;
  } else {
    return false;
  }
  return true;
}

// One request's counts, filled by the scheduler step by step (Observe) when the level is not
// kNone; `level` kNone means "not collected" and the response carries no block.
struct RequestSpecDecodeMetrics {
  SpecMetricsLevel level = SpecMetricsLevel::kNone;
  int num_spec_tokens = 0;
  std::vector<int64_t> histogram;  // [j]: steps that accepted j; num_spec_tokens + 1 entries
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_draft_tokens = 0;
  std::vector<int> per_step_accepted, per_step_drafted;  // kDetailed only

  // Starts collecting at `level` for a server whose chains hold at most `spec_tokens`.
  void Begin(SpecMetricsLevel l, int spec_tokens) {
    level = l;
    num_spec_tokens = spec_tokens;
    histogram.assign(static_cast<size_t>(spec_tokens) + 1, 0);
  }
  // One verification step: `drafted` draft tokens (a tree's nodes), `accepted` of them taken.
  // A step with no draft token is not a speculative step and is ignored. An `accepted` beyond
  // num_spec_tokens (none of specloop's blocks makes one) widens the histogram rather than
  // being dropped.
  void Observe(int drafted, int accepted) {
    if (level == SpecMetricsLevel::kNone || drafted <= 0) return;
    if (static_cast<size_t>(accepted) >= histogram.size()) histogram.resize(accepted + 1, 0);
    histogram[accepted]++;
    num_draft_tokens += drafted;
    num_accepted_draft_tokens += accepted;
    if (level == SpecMetricsLevel::kDetailed) {
      per_step_accepted.push_back(accepted);
      per_step_drafted.push_back(drafted);
    }
  }
  int64_t num_spec_steps() const {
    int64_t n = 0;
    for (int64_t c : histogram) n += c;
    return n;
  }
  // vLLM's definitions, and its values for a request with no speculative step.
  double mean_acceptance_length() const {
    const int64_t steps = num_spec_steps();
    return steps ? 1.0 + double(num_accepted_draft_tokens) / steps : 1.0;
  }
  double draft_acceptance_rate() const {
    return num_draft_tokens ? double(num_accepted_draft_tokens) / num_draft_tokens : 0.0;
  }
};

}  // namespace specloop
