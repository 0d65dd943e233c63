#include "common/speculation_policy.h"

#include <algorithm>
#include <cmath>

namespace specloop {

double ExpectedTokensPerStep(double alpha, int k) {
  if (k <= 0) return 1.0;
  if (alpha >= 1.0) return k + 1.0;
  return (1.0 - std::pow(alpha, k + 1)) / (1.0 - alpha);
}

SpeculationPolicy::SpeculationPolicy(const SpeculationPolicyOptions& options)
    : options_(options),
      decay_(std::pow(0.5, 1.0 / std::max(1.0, options.half_life_steps))),
      successes_(options.prior_alpha * options.prior_weight),
      failures_((1.0 - options.prior_alpha) * options.prior_weight),
      target_cost_(options.k_max + 2, 0.0) {}

void SpeculationPolicy::ObserveStep(int drafted, int accepted) {
  if (drafted <= 0) return;
  successes_ = successes_ * decay_ + accepted;
  failures_ = failures_ * decay_ + (accepted < drafted ? 1.0 : 0.0);
}

void SpeculationPolicy::ObserveTarget(int positions, double seconds) {
  if (positions < 1 || positions >= static_cast<int>(target_cost_.size())) return;
  double& c = target_cost_[positions];
  c = c > 0 ? c * decay_ + seconds * (1.0 - decay_) : seconds;
}

void SpeculationPolicy::ObserveDraft(int tokens, double seconds) {
  if (tokens <= 0) return;
  draft_s_ = draft_s_ * decay_ + seconds;
  draft_n_ = draft_n_ * decay_ + tokens;
}

void SpeculationPolicy::SeedTarget(int positions, double seconds) {
  if (positions >= 1 && positions < static_cast<int>(target_cost_.size())) {
    target_cost_[positions] = seconds;
  }
}

void SpeculationPolicy::SeedDraft(double seconds_per_token) {
  draft_s_ = seconds_per_token;
  draft_n_ = 1;
}

double SpeculationPolicy::alpha() const {
  const double total = successes_ + failures_;
  return total > 0 ? successes_ / total : options_.prior_alpha;
}

double SpeculationPolicy::draft_seconds_per_token() const {
  return draft_n_ > 0 ? draft_s_ / draft_n_ : 0.0;
}

double SpeculationPolicy::target_seconds(int positions) const {
  const int n_max = static_cast<int>(target_cost_.size()) - 1;
  positions = std::clamp(positions, 1, n_max);
  if (target_cost_[positions] > 0) return target_cost_[positions];
  int lo = positions - 1, hi = positions + 1;
  while (lo >= 1 && target_cost_[lo] <= 0) --lo;
  while (hi <= n_max && target_cost_[hi] <= 0) ++hi;
  if (lo < 1 && hi > n_max) return 0.0;
  if (lo < 1) return target_cost_[hi];
  if (hi > n_max) return target_cost_[lo];
  const double t = double(positions - lo) / (hi - lo);
  return target_cost_[lo] * (1 - t) + target_cost_[hi] * t;
}

double SpeculationPolicy::ExpectedRate(int k) const {
  const double time = k * draft_seconds_per_token() + target_seconds(k + 1);
  return time > 0 ? ExpectedTokensPerStep(alpha(), k) / time : 0.0;
}

int SpeculationPolicy::ChooseK() {
  if (target_seconds(1) <= 0 || draft_n_ <= 0) return std::max(1, options_.k_max / 2);
  int best = 0, best_spec = 1;
  double best_rate = ExpectedRate(0), best_spec_rate = 0;
  for (int k = 1; k <= options_.k_max; ++k) {
    const double r = ExpectedRate(k);
    if (r > best_rate) {
      best = k;
      best_rate = r;
    }
    if (r > best_spec_rate) {
      best_spec = k;
      best_spec_rate = r;
    }
  }
  if (best > 0) {
    zero_streak_ = 0;
    return best;
  }
  return ++zero_streak_ % std::max(1, options_.probe_interval) == 0 ? best_spec : 0;
}

}  // namespace specloop
