// Acceptance drift: per domain, the draft's acceptance rate alpha over a short and a long
// window, their difference (drift), and a change detector that reports when alpha moved.
// Pure math, no metrics: serve/ exports the readings as gauges and the events as counters.
//
// Observation unit: one speculative step. With `drafted` draft tokens of which `accepted` were
// accepted, call Observe(accepted / drafted, drafted). The windows then average per draft
// token (sum accepted / sum drafted, the acceptance rate of DESIGN section 8 and vLLM), and
// the half-lives are counted in draft tokens.
//
// Windows: exponentially weighted averages whose half-lives are measured in observation
// weight, not wall time, so a domain that sees no traffic keeps its estimates instead of
// decaying toward nothing. An observation of weight w multiplies the old weight by
// 2^(-w / half_life). Both averages are bias-corrected (they start from the first
// observation, not from 0): after unit-weight observations x_1..x_n, with r = 2^(-1/h),
//   alpha_n = sum_i r^(n-i) x_i / sum_i r^(n-i).
//
// Detector: a two-sided CUSUM of each observation's deviation from the long average (taken
// before the observation updates it), scaled by the observation's weight relative to the
// long-window mean weight so that a stationary token-weighted stream has zero-mean
// increments:
//   d = (w / mean_w) * (x - long_alpha)
//   up   = max(0, up + d - slack),     down = max(0, down - d - slack)
// An "up" ("down") event is raised when up (down) exceeds `threshold`. Every event then
// resets both sums and re-baselines both averages at the mean of the observations since the
// firing sum last left zero (the CUSUM estimate of the new level), so one step change gives
// one event and drift() returns to about 0. Nothing is detected until `warmup_weight` has
// been observed.
//
// False alarms: x lies in [0, 1], so Var(x) <= 1/4 whatever alpha is (equality at 0.5 with
// single-token steps); with equal step lengths the increments have sd <= 0.5. Siegmund's
// approximation of the in-control run length of a one-sided CUSUM, with a = slack / sd and
// b = threshold / sd + 1.166, is (e^(2ab) - 2ab - 1) / (2 a^2): for the defaults (slack 0.15,
// threshold 10) and sd 0.5 that is about 1.8e6 observations per side, so 10k stationary
// observations raise an event with probability about 1%; at alpha = 0.8 (sd 0.4), about
// 1e-4. A shift of 0.5 drifts the sum by 0.35 per observation and is reported after about
// 30 observations (under 100 in simulation over many seeds).
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

namespace specloop {

struct DriftOptions {
  // Half-life of the short window, in observation weight (draft tokens). Default: 50.
  double short_half_life = 50;
  // Half-life of the long window, in observation weight; >= short_half_life. Default: 1000.
  double long_half_life = 1000;
  // CUSUM slack, in alpha units: deviations smaller than this accumulate nothing. About half
  // the smallest shift worth reporting. Default: 0.15.
  double slack = 0.15;
  // CUSUM threshold, in alpha units times observations. Default: 10.
  double threshold = 10;
  // Weight observed before detection starts (the long average must settle). Default: 100.
  double warmup_weight = 100;

  // Empty when valid, else what is wrong ("threshold must be > 0").
  std::string Validate() const;
};

enum class DriftDirection { kNone, kUp, kDown };

// "none", "up" or "down" (a label value for a drift-events counter).
const char* DriftDirectionName(DriftDirection d);

struct DriftEvent {
  DriftDirection direction = DriftDirection::kNone;
  // 1-based index of the observation that raised the event.
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

  // Adds one observation: `x` in [0, 1] (accepted / drafted of one step) with weight `weight`
  // (> 0; drafted). Returns the event this observation raised, kNone almost always.
  // Observations with x outside [0, 1], NaN, or weight <= 0 are ignored (kNone).
  // Allocation-free, constant time.
  DriftDirection Observe(double x, double weight);

  // Averages over the short and long windows; 0 before the first observation.
  double short_alpha() const;
  double long_alpha() const;
  // short_alpha() - long_alpha(): negative when acceptance is falling.
  double drift() const { return short_alpha() - long_alpha(); }

  // The two CUSUM sums (for tests and debugging).
  double cusum_up() const { return up_; }
  double cusum_down() const { return down_; }

  uint64_t observations() const { return observations_; }
  double total_weight() const { return total_weight_; }
  uint64_t up_events() const { return up_events_; }
  uint64_t down_events() const { return down_events_; }
  // The most recent event; direction kNone if there was none.
  const DriftEvent& last_event() const { return last_event_; }

 private:
  // Bias-corrected EWMA: value = sum / norm.
  struct Ewma {
    double sum = 0.0;
    double norm = 0.0;
    // `decay` = 2^(-w / half_life); `gain` = 1 - decay, computed without cancellation.
    void Add(double decay, double gain, double x) {
      sum = decay * sum + gain * x;
      norm = decay * norm + gain;
    }
    double value() const { return norm > 0.0 ? sum / norm : 0.0; }
    void Rebase(double v) { sum = v * norm; }
  };

  const DriftOptions options_;
  Ewma short_, long_, weight_;  // weight_: long-window mean observation weight
  double up_ = 0.0, down_ = 0.0;
  // Weighted sums of x since each CUSUM sum last left zero.
  double up_x_ = 0.0, up_w_ = 0.0, down_x_ = 0.0, down_w_ = 0.0;
  uint64_t observations_ = 0;
  double total_weight_ = 0.0;
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

  // Observes (x, weight) for `domain` and returns the event raised, if any. Stores the domain
  // actually used (`domain` or the overflow domain) in *resolved when given (this may
  // allocate; without it, an existing domain allocates nothing).
  DriftDirection Observe(const std::string& domain, double x, double weight,
                         std::string* resolved = nullptr);

  struct Reading {
    std::string domain;
    double short_alpha = 0.0;
    double long_alpha = 0.0;
    double drift = 0.0;
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
  const DriftOptions options_;
  const size_t max_domains_;
  const std::string overflow_domain_;
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<AcceptanceDrift>, std::less<>> domains_;  // GUARDED_BY(mu_)
};

}  // namespace specloop
