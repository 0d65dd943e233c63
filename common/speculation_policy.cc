#include "common/speculation_policy.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "common/spec/acceptance.h"

namespace specloop {

SpeculationPolicy::SpeculationPolicy(const SpeculationPolicyOptions& options)
    : options_(options),
      decay_(std::pow(0.5, 1.0 / std::max(1.0, options.half_life_steps))),
      shape_decay_(std::pow(decay_, 1.0 / 32)),
      successes_(options.prior_alpha * options.prior_weight),
      failures_((1.0 - options.prior_alpha) * options.prior_weight),
      target_cost_(options.k_max + 2, 0.0),
      target_slope_(options.k_max + 2, 0.0),
      target_known_(options.k_max + 2, false),
      real_seconds_(options.k_max + 1, 0.0),
      real_n_(options.k_max + 1, 0.0),
      real_w2_(options.k_max + 1, 0.0),
      real_steps_(options.k_max + 1, 0),
      real_last_(options.k_max + 1, 0),
      realized_plain_run_(options.cold_plain_steps),
      target_plain_run_(options.cold_plain_steps),
      probe_wait_(std::max(1, options.probe_interval)) {}

namespace {
// Counts a step into `run` (plain steps since the last speculative one); true when the step
// is a cold plain step, whose cost is not plain decoding's (cold_plain_steps).
bool ColdPlainStep(bool plain, int cold_plain_steps, int64_t* run) {
  if (!plain) {
    *run = 0;
    return false;
  }
  return (*run)++ < cold_plain_steps;
}
}  // namespace

void SpeculationPolicy::ObserveStep(int drafted, int accepted) {
  if (drafted <= 0) return;
  successes_ = successes_ * decay_ + accepted;
  failures_ = failures_ * decay_ + (accepted < drafted ? 1.0 : 0.0);
}

void SpeculationPolicy::ObserveTarget(int positions, double seconds, int64_t context) {
  if (positions < 1 || positions >= static_cast<int>(target_cost_.size()) || !(seconds > 0)) {
    return;
  }
  if (ColdPlainStep(positions == 1, options_.cold_plain_steps, &target_plain_run_)) return;
  const double L = static_cast<double>(std::max<int64_t>(0, context));
  double& c = target_cost_[positions];
  double& slope = target_slope_[positions];
  // The cost at context 0 that this observation implies (never below 0: a slope that
  // overstates the context's share then errs towards costlier forwards at short contexts).
  auto intercept = [&] { return std::max(0.0, seconds / load_ - slope * L); };
  if (!target_known_[positions]) {  // its first measurement replaces interpolation
    slope = TargetSlope(positions);
    c = intercept();
    target_known_[positions] = true;
    return;
  }
  // Plain decoding's forwards move the load by their ratio to the model, geometrically, and
  // then their own cost by what is left of it, 32 times more slowly (the two cannot be told
  // apart: the load takes nearly all of it). Longer forwards move only their own cost: were
  // they to move the load, an error in their modelled cost would pass into it while that
  // length is chosen, and from it into every other length's rate, in that length's favour.
  double kept = decay_;
  if (positions == 1) {
    const double modelled = c + slope * L;
    if (modelled > 0) load_ *= std::pow(seconds / (load_ * modelled), 1.0 - decay_);
    kept = shape_decay_;
  }
  c = c * kept + intercept() * (1.0 - kept);
}

void SpeculationPolicy::ObserveDraft(int tokens, double seconds) {
  if (tokens <= 0) return;
  draft_s_ = draft_s_ * decay_ + seconds / load_;
  draft_n_ = draft_n_ * decay_ + tokens;
}

void SpeculationPolicy::ObserveCatchUp(int64_t tokens, double seconds) {
  if (tokens <= 0 || !(seconds > 0)) return;
  catch_up_s_ = catch_up_s_ * decay_ + seconds / load_;
  catch_up_n_ = catch_up_n_ * decay_ + static_cast<double>(tokens);
}

double SpeculationPolicy::SwitchSeconds() const {
  return switch_n_ > 0 ? load_ * switch_s_ / switch_n_ : 0.0;
}

double SpeculationPolicy::CatchUpSeconds(int64_t tokens) const {
  if (tokens <= 0 || catch_up_n_ <= 0) return 0.0;
  return std::max(draft_seconds_per_token(), load_ * catch_up_s_ / catch_up_n_ * tokens);
}

void SpeculationPolicy::ObserveRealized(int k, double seconds) {
  if (k < 0 || k > options_.k_max || seconds <= 0) return;
  ++steps_;
  if (ColdPlainStep(k == 0, options_.cold_plain_steps, &realized_plain_run_)) {
    if (real_n_[0] > 0) {  // its excess over a warm plain step; the run's, once complete
      cold_excess_ += seconds / load_ - real_seconds_[0] / real_n_[0];
      if (realized_plain_run_ == options_.cold_plain_steps) {
        switch_s_ = switch_s_ * decay_ + std::max(0.0, cold_excess_);
        switch_n_ = switch_n_ * decay_ + 1.0;
      }
    }
    return;
  }
  if (k > 0) cold_excess_ = 0;
  // Weight kept: per step at any length (or per step at this length: the A/B option).
  const double kept =
      options_.forget_per_any_step ? std::pow(decay_, static_cast<double>(steps_ - real_last_[k]))
                                   : decay_;
  if (real_n_[k] > 0 && real_seconds_[k] > 0) {  // its deviation from its length's mean
    const double mean = real_seconds_[k] / real_n_[k];
    const double d = (seconds / load_ - mean) / mean;
    spread_s_ = spread_s_ * decay_ + d * d;
    spread_n_ = spread_n_ * decay_ + 1.0;
  }
  real_n_[k] = real_n_[k] * kept + 1.0;
  real_w2_[k] = real_w2_[k] * kept * kept + 1.0;
  real_seconds_[k] = real_seconds_[k] * kept + seconds / load_;
  real_steps_[k]++;
  real_last_[k] = steps_;
}

double SpeculationPolicy::RealizedRate(int k) const {
  if (k < 0 || k > options_.k_max || real_steps_[k] < options_.min_realized_steps) return -1.0;
  return spec::ExpectedTokensPerStep(alpha(), k) * real_n_[k] / (real_seconds_[k] * load_);
}

double SpeculationPolicy::RealizedRateError(int k) const {
  if (k < 0 || k > options_.k_max || real_w2_[k] <= 0 || spread_n_ <= 0) return 0.0;
  const double n_eff = real_n_[k] * real_n_[k] / real_w2_[k];
  return std::sqrt(spread_s_ / spread_n_ / n_eff);
}

void SpeculationPolicy::SeedTarget(int positions, double seconds, int64_t context,
                                   double seconds_per_context_token) {
  if (positions < 1 || positions >= static_cast<int>(target_cost_.size())) return;
  const double slope = std::max(0.0, seconds_per_context_token) / load_;
  target_slope_[positions] = slope;
  target_cost_[positions] =
      std::max(0.0, seconds / load_ - slope * static_cast<double>(std::max<int64_t>(0, context)));
  target_known_[positions] = true;
}

void SpeculationPolicy::SeedDraft(double seconds_per_token) {
  draft_s_ = seconds_per_token / load_;
  draft_n_ = 1;
}

double SpeculationPolicy::alpha() const {
  const double total = successes_ + failures_;
  return total > 0 ? successes_ / total : options_.prior_alpha;
}

double SpeculationPolicy::draft_seconds_per_token() const {
  return draft_n_ > 0 ? load_ * draft_s_ / draft_n_ : 0.0;
}

double SpeculationPolicy::target_seconds(int positions, int64_t context) const {
  return load_ * TargetCost(positions, context);
}

namespace {
// f(n) for a block size n from the known sizes: its own, else linear between the nearest known
// sizes around it, else the nearest one; `none` when no size is known.
double InterpolateKnown(const std::vector<bool>& known, int n, double none,
                        const std::function<double(int)>& f) {
  const int n_max = static_cast<int>(known.size()) - 1;
  n = std::clamp(n, 1, n_max);
  if (known[n]) return f(n);
  int lo = n - 1, hi = n + 1;
  while (lo >= 1 && !known[lo]) --lo;
  while (hi <= n_max && !known[hi]) ++hi;
  if (lo < 1 && hi > n_max) return none;
  if (lo < 1) return f(hi);
  if (hi > n_max) return f(lo);
  const double t = double(n - lo) / (hi - lo);
  return f(lo) * (1 - t) + f(hi) * t;
}
}  // namespace

double SpeculationPolicy::TargetCost(int positions, int64_t context) const {
  const double L = static_cast<double>(std::max<int64_t>(0, context));
  return InterpolateKnown(target_known_, positions, 0.0,
                          [&](int n) { return target_cost_[n] + target_slope_[n] * L; });
}

double SpeculationPolicy::TargetSlope(int positions) const {
  return InterpolateKnown(target_known_, positions, 0.0,
                          [&](int n) { return target_slope_[n]; });
}

double SpeculationPolicy::ExpectedRate(int k, int64_t context) const {
  const double time = k * draft_seconds_per_token() + target_seconds(k + 1, context);
  return time > 0 ? spec::ExpectedTokensPerStep(alpha(), k) / time : 0.0;
}

int SpeculationPolicy::ChooseK(int64_t catch_up_tokens, int64_t remaining, int64_t context) {
  if (target_seconds(1, context) <= 0 || draft_n_ <= 0) return std::max(1, options_.k_max / 2);
  return ChooseBest([&](int k) { return ExpectedRate(k, context); }, 1, catch_up_tokens,
                    remaining);
}

int SpeculationPolicy::ChooseBest(const std::function<double(int)>& model, int probe_scale,
                                  int64_t catch_up_tokens, int64_t remaining) {
  // A length's rate from its realized cost where trusted, else the model's. The model misses
  // overheads (bookkeeping, caches, two models taking turns) that realized costs show; a
  // length without one of its own is charged the share measured at the last speculative
  // length realized (at k = 0 before any), or realized costs would be set against an
  // overhead-free model.
  std::vector<double> realized(options_.k_max + 1), modelled(options_.k_max + 1);
  int measured = -1;
  for (int k = 0; k <= options_.k_max; ++k) {
    realized[k] = RealizedRate(k);
    modelled[k] = model(k);
    if (realized[k] > 0 && (measured <= 0 || real_last_[k] > real_last_[measured])) measured = k;
  }
  const double efficiency =
      measured >= 0 && modelled[measured] > 0 ? realized[measured] / modelled[measured] : 1.0;
  auto rate = [&](int k) {
    return realized[k] >= 0 ? realized[k] : k == 0 ? modelled[0] : modelled[k] * efficiency;
  };
  int best = 0, best_spec = 1;
  const double plain_rate = rate(0);
  double best_rate = plain_rate, best_spec_rate = 0;
  for (int k = 1; k <= options_.k_max; ++k) {
    const double r = rate(k);
    if (r > best_rate) {
      best = k;
      best_rate = r;
    }
    if (r > best_spec_rate) {
      best_spec = k;
      best_spec_rate = r;
    }
  }
  // Speculating now first pays the catch-up and, coming from plain decoding, the cold plain
  // steps when it ends; the rest of the sequence must repay them, at rates taken
  // repay_confidence standard errors against speculation.
  double owed = 0;
  if (best > 0 && remaining > 0 && plain_rate > 0) {
    owed = CatchUpSeconds(catch_up_tokens);
    if (options_.count_switch_cost && !speculating_) owed += SwitchSeconds();
  }
  if (owed > 0) {
    const double n = static_cast<double>(remaining), z = options_.repay_confidence;
    auto error = [&](int k) { return realized[k] >= 0 ? z * RealizedRateError(k) : 0.0; };
    const double spec_low = best_rate * (1.0 - error(best));
    const double plain_high = plain_rate * (1.0 + error(0));
    if (spec_low <= plain_high || owed >= n / plain_high - n / spec_low) best = 0;
  }
  speculating_ = best > 0;
  if (best > 0) {
    zero_streak_ = 0;
    probe_wait_ = std::max(1, options_.probe_interval);
    if (plain_probe_left_ > 0) {
      --plain_probe_left_;
      return 0;
    }
    if (++spec_streak_ < int64_t{std::max(1, options_.plain_probe_interval)} * probe_scale) {
      return best;
    }
    // Plain steps now and then keep k = 0's rate current.
    spec_streak_ = 0;
    plain_probe_left_ = std::max(1, options_.plain_probe_steps) - 1;
    return 0;
  }
  spec_streak_ = 0;
  plain_probe_left_ = 0;
  if (++zero_streak_ < int64_t{probe_wait_} * probe_scale) return 0;
  zero_streak_ = 0;
  probe_wait_ = std::min(2 * probe_wait_, std::max(1, options_.max_probe_interval));
  return best_spec;
}

double SpeculationPolicy::ExpectedRateInBatch(int k, const BatchCostModel& cost,
                                              int batch_size) const {
  const double time =
      k * draft_seconds_per_token() + cost.SecondsPerSequence(std::max(1, batch_size), k + 1);
  return time > 0 ? spec::ExpectedTokensPerStep(alpha(), k) / time : 0.0;
}

int SpeculationPolicy::ChooseKInBatch(const BatchCostModel& cost, int batch_size,
                                      int64_t catch_up_tokens, int64_t remaining) {
  if (cost.empty() || draft_n_ <= 0) return ChooseK(catch_up_tokens, remaining);
  batch_size = std::max(1, batch_size);
  // A probe delays the whole batch: probe batch_size times less often.
  return ChooseBest([&](int k) { return ExpectedRateInBatch(k, cost, batch_size); }, batch_size,
                    catch_up_tokens, remaining);
}

BatchCostModel::BatchCostModel(double half_life)
    : decay_(std::pow(0.5, 1.0 / std::max(1.0, half_life))) {
  for (int r = 1; r <= 16; ++r) grid_.push_back(r);
  while (grid_.back() < 4096) grid_.push_back(static_cast<int>(grid_.back() * 1.5));
  seconds_.assign(grid_.size(), 0.0);
}

bool BatchCostModel::empty() const {
  return std::all_of(seconds_.begin(), seconds_.end(), [](double s) { return s <= 0; });
}

size_t BatchCostModel::Nearest(int rows) const {
  auto it = std::lower_bound(grid_.begin(), grid_.end(), rows);
  if (it == grid_.end()) return grid_.size() - 1;
  const size_t hi = it - grid_.begin();
  if (hi == 0 || *it == rows) return hi;
  // Nearest by ratio: rows vs the geometric midpoint.
  return double(rows) * rows < double(grid_[hi]) * grid_[hi - 1] ? hi - 1 : hi;
}

void BatchCostModel::Seed(int rows, double seconds) {
  if (rows < 1 || !(seconds > 0)) return;
  const size_t i = Nearest(rows);
  seconds_[i] = seconds * grid_[i] / rows;  // calibration runs use grid sizes: exact there
}

void BatchCostModel::Observe(int rows, double seconds) {
  if (rows < 1 || !(seconds > 0)) return;
  const size_t i = Nearest(rows);
  const double here = Seconds(rows), there = Seconds(grid_[i]);
  const double scaled =
      here > 0 && there > 0 ? seconds * there / here : seconds * grid_[i] / rows;
  double& c = seconds_[i];
  c = c > 0 ? c * decay_ + scaled * (1.0 - decay_) : scaled;
}

double BatchCostModel::Seconds(int rows) const {
  if (rows < 1) rows = 1;
  // The measured points around `rows`.
  int lo = -1, hi = -1;
  for (size_t i = 0; i < grid_.size(); ++i) {
    if (seconds_[i] <= 0) continue;
    if (grid_[i] <= rows) lo = i;
    if (grid_[i] >= rows) {
      hi = i;
      break;
    }
  }
  if (lo < 0 && hi < 0) return 0.0;
  if (lo >= 0 && hi >= 0) {
    if (lo == hi) return seconds_[lo];
    const double t = double(rows - grid_[lo]) / (grid_[hi] - grid_[lo]);
    return seconds_[lo] * (1 - t) + seconds_[hi] * t;
  }
  if (hi >= 0) return seconds_[hi];  // below the smallest measured: flat
  return seconds_[lo] * rows / grid_[lo];  // beyond the largest: proportional to rows
}

double BatchCostModel::SecondsPerSequence(int batch_size, int positions) const {
  batch_size = std::max(1, batch_size);
  return Seconds(batch_size * std::max(1, positions)) / batch_size;
}

}  // namespace specloop
