#include "common/spec/acceptance_estimator.h"

#include <algorithm>
#include <cmath>

namespace specloop {
namespace spec {

AcceptanceEstimator::AcceptanceEstimator(double prior_alpha, double prior_weight,
                                         double half_life)
    : prior_alpha_(std::clamp(prior_alpha, 0.0, 1.0)),
      decay_(std::pow(0.5, 1.0 / std::max(1e-9, half_life))),
      successes_(prior_alpha_ * std::max(0.0, prior_weight)),
      failures_((1.0 - prior_alpha_) * std::max(0.0, prior_weight)) {}

void AcceptanceEstimator::Observe(int drafted, int accepted) {
  if (drafted <= 0) return;
  accepted = std::clamp(accepted, 0, drafted);
  successes_ = successes_ * decay_ + accepted;
  failures_ = failures_ * decay_ + (accepted < drafted ? 1.0 : 0.0);
}

double AcceptanceEstimator::alpha() const {
  const double total = successes_ + failures_;
  return total > 0 ? successes_ / total : prior_alpha_;
}

}  // namespace spec
}  // namespace specloop
