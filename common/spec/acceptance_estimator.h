// AcceptanceEstimator: the per-token acceptance rate alpha of chain speculation, estimated from
// verification steps (DESIGN.md section 4). One implementation for every reader of alpha: the
// speculation policy (one estimator per domain and draft version), the rollback of a new draft
// version, and the exported acceptance windows and drift detector.
//
// A step that drafted k tokens and accepted the first a of them saw a successes and, when
// a < k, one failure; positions after the first rejection were never tested, so they count
// neither way. alpha = successes / (successes + failures) is then the maximum-likelihood rate of
// a geometric law, and it does not depend on k: at 0.8 per token it reads 0.8 whether steps
// draft 1 token or 8 (accepted / drafted would read 0.8 and 0.59).
//
// Both counts decay by half every `half_life` steps so that the estimate follows change (a new
// draft, a shift of traffic), and start from a prior worth `prior_weight` tested tokens.
// Pure logic; not thread-safe.
#pragma once

namespace specloop {
namespace spec {

class AcceptanceEstimator {
 public:
  // REQUIRES: 0 <= prior_alpha <= 1, prior_weight >= 0, half_life > 0.
  AcceptanceEstimator(double prior_alpha, double prior_weight, double half_life);

  // One verification step: `drafted` tokens proposed, the first `accepted` of them accepted.
  // Steps that drafted nothing are ignored.
  void Observe(int drafted, int accepted);
  // One step of `tested` positions worth `successes` acceptances, which may be an expectation
  // (alpha* of common/spec/optimal_acceptance.h). Observe(d, a) is ObserveExpected(a, a + (a <
  // d)). Steps with tested <= 0 are ignored; successes is clamped to [0, tested].
  void ObserveExpected(double successes, double tested);
  // The current estimate (the prior before any step, and while both counts are 0).
  double alpha() const;
  // Decayed tested tokens behind alpha(), the prior's included.
  double weight() const { return successes_ + failures_; }
  // Sets the estimate to `alpha` (clamped to [0, 1]), keeping its weight: a change detector
  // re-baselines on the level it found (common/observe/acceptance_drift.h).
  void Rebase(double alpha);

 private:
  double prior_alpha_;
  double decay_;  // per step: 0.5^(1 / half_life)
  double successes_, failures_;
};

}  // namespace spec
}  // namespace specloop
