// Acceptance drift: per domain, the draft's acceptance rate alpha over a short and a long
// window, their difference (drift), and a change detector that reports when alpha moved.
// Pure math, no metrics: serve/ exports the readings as gauges and the events as counters.
//
// Observation unit: one speculative step that drafted `drafted` tokens and had the first
// `accepted` of them accepted, as spec::AcceptanceEstimator counts it (the policy's and the
// rollback's estimator, the same class): `accepted` successes and, when accepted < drafted,
// one failure; positions after the first rejection were never tested. Both windows are
// AcceptanceEstimators, so they estimate the per-token acceptance rate, which does not depend
// on k: 0.8 per token reads 0.8 at k = 1 and at k = 4 (accepted / drafted would read 0.8 and
// 0.59), and a change of k alone moves neither the windows nor the detector.
//
// Windows: successes and failures decayed by half every half-life steps, counted in steps,
// not wall time, so a domain that sees no traffic keeps its estimates instead of decaying
// toward nothing. They start from no prior (the first step is the estimate): after steps with
// s_i successes and t_i tested tokens, with r = 2^(-1/h),
//   alpha_n = sum_i r^(n-i) s_i / sum_i r^(n-i) t_i.
//
// Beside alpha, over the long window: the mean acceptance length (1 + accepted per step,
// vLLM's definition; it grows with k, unlike alpha), and alpha*, the optimal verifier's
// acceptance for the drafts actually proposed (ObserveOptimal), which a verifier can only
// approach: for chains it equals alpha in expectation.
//
// Detector: a two-sided CUSUM over the tested tokens, each a Bernoulli trial of the per-token
// rate, measured against the long window (taken before the step updates it). A step adds
//   d = s - long_alpha * t
//   up   = max(0, up + d - slack * t),     down = max(0, down - d - slack * t)
// An "up" ("down") event is raised when up (down) exceeds `threshold`. Every event then
// resets both sums and re-baselines both windows at the rate of the tested tokens since the
// firing sum last left zero (the CUSUM estimate of the new level), so one step change gives
// one event and drift() returns to about 0. Nothing is detected until `warmup_tokens` tested
// tokens have been observed.
//
// False alarms: each tested token is 0 or 1, so its variance is at most 1/4 whatever alpha is
// (equality at 0.5). Siegmund's approximation of the in-control run length of a one-sided
// CUSUM, with a = slack / sd and b = threshold / sd + 1.166, is (e^(2ab) - 2ab - 1) / (2 a^2):
// for the defaults (slack 0.15, threshold 10) and sd 0.5 that is about 1.8e6 tested tokens per
// side, so 10k stationary tokens raise an event with probability about 1%; at alpha = 0.8
// (sd 0.4), about 1e-4. A shift of 0.5 drifts the sum by 0.35 per tested token and is
// reported after about 30 of them (under 100 in simulation over many seeds). Steps of
// several tokens apply the clamp at 0 once per step, which changes these figures little.
//
// Threading: AcceptanceDrift is not thread-safe (one owner, e.g. the scheduler thread);
// DomainDrift is. Observe() of an existing domain allocates nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/spec/acceptance_estimator.h"

namespace specloop {

struct DriftOptions {
  // Half-life of the short window, in verification steps. Default: 25.
  double short_half_life = 25;
  // Half-life of the long window, in steps; >= short_half_life. Default: 500.
  double long_half_life = 500;
  // CUSUM slack, in alpha units: deviations smaller than this accumulate nothing. About half
  // the smallest shift worth reporting. Default: 0.15.
  double slack = 0.15;
  // CUSUM threshold, in alpha units times tested tokens. Default: 10.
  double threshold = 10;
  // Tested tokens observed before detection starts (the long window must settle). Default:
  // 100.
  double warmup_tokens = 100;

  // Empty when valid, else what is wrong ("threshold must be > 0").
  std::string Validate() const;
};

enum class DriftDirection { kNone, kUp, kDown };

// "none", "up" or "down" (a label value for a drift-events counter).
const char* DriftDirectionName(DriftDirection d);

struct DriftEvent {
  DriftDirection direction = DriftDirection::kNone;
  // 1-based index of the step that raised the event.
  uint64_t observation = 0;
  // Long-window alpha just before the event (the old level).
  double before = 0.0;
  // Estimated new level (what both windows were re-baselined to).
  double after = 0.0;
};

class AcceptanceDrift {
 public:
  // REQUIRES: options.Validate() is empty (aborts otherwise).
  explicit AcceptanceDrift(const DriftOptions& options = DriftOptions());

  // Adds one verification step: `drafted` tokens proposed, the first `accepted` of them
  // accepted. Returns the event this step raised, kNone almost always. Steps with drafted <= 0
  // or accepted outside [0, drafted] are ignored (kNone). Allocation-free, constant time.
  DriftDirection Observe(int drafted, int accepted);

  // alpha* of a step's tested positions: `expected` acceptances of the optimal verifier summed
  // over `positions` of them (common/spec/optimal_acceptance.h). Ignored when positions <= 0.
  void ObserveOptimal(double expected, int positions);

  // Per-token acceptance over the short and long windows; 0 before the first step.
  double short_alpha() const;
  double long_alpha() const;
  // 1 + accepted per step over the long window; 0 before the first step.
  double mean_acceptance_length() const { return length_norm_ > 0 ? length_sum_ / length_norm_ : 0; }
  // alpha* over the long window; negative before the first ObserveOptimal().
  double optimal_alpha() const { return optimal_.weight() > 0 ? optimal_.alpha() : -1.0; }
  // short_alpha() - long_alpha(): negative when acceptance is falling.
  double drift() const { return short_alpha() - long_alpha(); }

  // The two CUSUM sums (for tests and debugging).
  double cusum_up() const { return up_; }
  double cusum_down() const { return down_; }

  // Steps observed, and the tested tokens in them (undecayed).
  uint64_t observations() const { return observations_; }
  double tested_tokens() const { return tested_tokens_; }
  uint64_t up_events() const { return up_events_; }
  uint64_t down_events() const { return down_events_; }
  // The most recent event; direction kNone if there was none.
  const DriftEvent& last_event() const { return last_event_; }

 private:
  const DriftOptions options_;
  spec::AcceptanceEstimator short_, long_, optimal_;
  double length_decay_, length_sum_ = 0.0, length_norm_ = 0.0;
  double up_ = 0.0, down_ = 0.0;
  // Successes and tested tokens since each CUSUM sum last left zero.
  double up_s_ = 0.0, up_t_ = 0.0, down_s_ = 0.0, down_t_ = 0.0;
  uint64_t observations_ = 0;
  double tested_tokens_ = 0.0;
  uint64_t up_events_ = 0, down_events_ = 0;
  DriftEvent last_event_;
};

// One AcceptanceDrift per domain, with a bounded number of domains: once `max_domains`
// distinct domains exist, any other domain is folded into `overflow_domain` (as the metrics
// families fold label values). Thread-safe: every call takes one mutex.
class DomainDrift {
 public:
  // REQUIRES: options valid, max_domains >= 1.
  explicit DomainDrift(const DriftOptions& options = DriftOptions(), size_t max_domains = 64,
                       std::string overflow_domain = "other");

  // Observes one step of `domain` (AcceptanceDrift::Observe, then ObserveOptimal with
  // `optimal` over `optimal_positions`, under one lock) and returns the event raised, if any.
  // Stores the domain actually used (`domain` or the overflow domain) in *resolved when given
  // (this may allocate; without it, an existing domain allocates nothing).
  DriftDirection Observe(const std::string& domain, int drafted, int accepted,
                         double optimal = 0.0, int optimal_positions = 0,
                         std::string* resolved = nullptr);

  struct Reading {
    std::string domain;
    double short_alpha = 0.0;
    double long_alpha = 0.0;
    double drift = 0.0;
    double mean_acceptance_length = 0.0;
    double optimal_alpha = -1.0;  // negative: never observed
    uint64_t observations = 0;
    uint64_t up_events = 0;
    uint64_t down_events = 0;
    DriftEvent last_event;
  };
  // One reading per domain, sorted by domain.
  std::vector<Reading> Snapshot() const;
  // Number of domains (the overflow domain included once used).
  size_t size() const;

 private:
  // The domain's detector, created on first use; `domain` folded into the overflow domain
  // once max_domains exist. REQUIRES: mu_ held.
  AcceptanceDrift& Find(const std::string& domain, std::string* resolved);

  const DriftOptions options_;
  const size_t max_domains_;
  const std::string overflow_domain_;
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<AcceptanceDrift>, std::less<>> domains_;  // GUARDED_BY(mu_)
};

}  // namespace specloop
