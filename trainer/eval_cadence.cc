#include "trainer/eval_cadence.h"

#include <algorithm>
#include <cmath>
#include <set>

namespace specloop {
namespace trainer {

namespace {

std::map<std::string, double> Normalized(const std::map<std::string, double>& traffic) {
  double total = 0;
  for (const auto& [d, n] : traffic) total += std::max(0.0, n);
  std::map<std::string, double> mix;
  if (total <= 0) return mix;
  for (const auto& [d, n] : traffic) mix[d] = std::max(0.0, n) / total;
  return mix;
}

// Total variation distance between two mixes (a domain missing from one weighs 0 there).
double Distance(const std::map<std::string, double>& a, const std::map<std::string, double>& b) {
  std::set<std::string> domains;
  for (const auto& [d, x] : a) domains.insert(d);
  for (const auto& [d, x] : b) domains.insert(d);
  double sum = 0;
  for (const std::string& d : domains) {
    auto ia = a.find(d), ib = b.find(d);
    sum += std::abs((ia == a.end() ? 0.0 : ia->second) - (ib == b.end() ? 0.0 : ib->second));
  }
  return sum / 2;
}

}  // namespace

EvalCadence::EvalCadence(const EvalCadenceOptions& options)
    : options_(options), interval_(std::max<int64_t>(1, options.min_steps)) {}

bool EvalCadence::AfterStep(double seconds, const std::map<std::string, double>& traffic) {
  ++steps_since_;
  train_seconds_since_ += std::max(0.0, seconds);
  const std::map<std::string, double> mix = Normalized(traffic);
  if (mix_at_eval_.empty()) {
    mix_at_eval_ = mix;
  } else if (Distance(mix, mix_at_eval_) >= options_.shift) {
    interval_ = std::max<int64_t>(1, options_.min_steps);
  }
  if (steps_since_ < interval_) return false;
  const double share = std::clamp(options_.max_share, 1e-3, 1.0);
  return train_seconds_since_ >= last_eval_seconds_ * (1 - share) / share;
}

void EvalCadence::Evaluated(double seconds, Outcome outcome) {
  steps_since_ = 0;
  train_seconds_since_ = 0;
  last_eval_seconds_ = std::max(0.0, seconds);
  const int64_t lo = std::max<int64_t>(1, options_.min_steps);
  if (outcome == Outcome::kPublished) interval_ = lo;
  if (outcome == Outcome::kRefused) {
    interval_ = std::clamp(interval_ * 2, lo, std::max(lo, options_.max_steps));
  }
  mix_at_eval_.clear();  // a shift is measured from the next step's mix
}

}  // namespace trainer
}  // namespace specloop
