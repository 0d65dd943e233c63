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
  ObserveExpected(accepted, accepted + (accepted < drafted ? 1.0 : 0.0));
}

void AcceptanceEstimator::ObserveExpected(double successes, double tested) {
  if (!(tested > 0)) return;
  successes = std::clamp(successes, 0.0, tested);
  successes_ = successes_ * decay_ + successes;
  failures_ = failures_ * decay_ + (tested - successes);
}

void AcceptanceEstimator::Rebase(double alpha) {
  const double total = successes_ + failures_;
  const double a = std::clamp(alpha, 0.0, 1.0);
  successes_ = a * total;
  failures_ = total - successes_;
}

double AcceptanceEstimator::alpha() const {
  const double total = successes_ + failures_;
  return total > 0 ? successes_ / total : prior_alpha_;
}

}  // namespace spec
}  // namespace specloop
