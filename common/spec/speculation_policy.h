// SpeculationPolicy: picks the speculation length k in [0, k_max] for one domain and draft
// version, maximizing expected generated tokens per second. The rule, its constants and the
// reasons for them: docs/speculation-policy.md. In short, for a batch of b sequences each
// after L cached tokens:
//
//   rate(k) = tau(alpha, k) / (k * draft(b) + target(b * (k + 1), L))      (k = 0: plain)
//   tau(alpha, k) = (1 - alpha^(k+1)) / (1 - alpha)
//
// where prompt chunks of C rows ride in the step's forward, target() is the decoding rows'
// share of the forward over all b * (k + 1) + C rows (StepCostTable::StepSeconds): the chunks
// move the step up the curve, where at many rows each verified position costs its arithmetic.
//
// alpha is this policy's per-token acceptance estimate (spec::AcceptanceEstimator); draft()
// and target() come from the caller's StepCostTable, measured as it decodes. The choice moves
// away from the current k only for a rate `hysteresis` higher; a sequence whose draft is behind
// (its prompt, tokens decoded plainly) speculates only where the time saved over the tokens it
// has left repays the draft's catch-up. Every `explore_interval`-th choice while speculating
// takes a neighbouring length instead, so that the lengths compared against stay measured
// under the machine's current load (the plain step's own cost is kept measured by the batch's
// plain refresh: `plain_refresh_steps`); while plain decoding wins, a probe speculates once the
// plain decoding time since the last probe is `1 / probe_share` times the probe's expected
// cost, so that acceptance keeps being measured at a bounded price.
//
// Pure logic; the caller feeds it verification outcomes. Not thread-safe.
#pragma once

#include <cstdint>

#include "common/spec/acceptance_estimator.h"
#include "common/spec/step_cost_table.h"

namespace specloop {

struct SpeculationPolicyOptions {
  // Largest k considered. Default: 8.
  int k_max = 8;
  // Steps after which an acceptance observation's weight halves. Default: 32.
  double half_life_steps = 32.0;
  // Alpha before any observation, and its weight in tested tokens. Default: 0.6, 8.
  double prior_alpha = 0.6;
  double prior_weight = 8.0;
  // A new k must promise this much more than the current one. Default: 0.03.
  double hysteresis = 0.03;
  // While speculating, every explore_interval-th choice takes a neighbour of the best k.
  // Default: 16.
  int explore_interval = 16;
  // While plain decoding wins, probes take at most this share of the time. Default: 0.01.
  double probe_share = 0.01;
  // In a batch of two or more sequences, a step whose plain alternative (the forward over the
  // batch's one row each and the prompt chunks) was last measured more than this many target
  // forwards ago decodes plainly throughout, no block of any kind, so that the cost
  // speculation is weighed against is measured under the machine's current load
  // (StepCostTable::PlainRefreshDue; DecodeStep takes it for the whole batch). Default: 64;
  // <= 0: never.
  int plain_refresh_steps = 64;
};

class SpeculationPolicy {
 public:
  explicit SpeculationPolicy(const SpeculationPolicyOptions& options = {});

  // One verification step of a sequence: `drafted` proposed, the first `accepted` accepted.
  void ObserveStep(int drafted, int accepted) { acceptance_.Observe(drafted, accepted); }

  // The k for one sequence's next step, in a batch of `batch` sequences, after `context`
  // cached tokens; the draft is `catch_up_tokens` behind and the sequence may still emit
  // `remaining` tokens (<= 0: unknown; no catch-up is then weighed). Before `costs` is
  // ready: max(1, k_max / 2).
  // `chunk_rows`: prompt-chunk rows riding in the step's forward.
  int ChooseK(const StepCostTable& costs, int batch = 1, int64_t context = 0,
              int64_t catch_up_tokens = 0, int64_t remaining = 0, int chunk_rows = 0);

  // Expected tokens per second of one sequence at length k (see the header comment).
  double ExpectedRate(const StepCostTable& costs, int k, int batch = 1, int64_t context = 0,
                      int chunk_rows = 0) const;
  double alpha() const { return acceptance_.alpha(); }
  // The length the policy settled on (hysteresis state; -1 before the first choice).
  int current() const { return current_; }
  const SpeculationPolicyOptions& options() const { return options_; }

 private:
  SpeculationPolicyOptions options_;
  spec::AcceptanceEstimator acceptance_;
  int current_ = -1;
  int64_t spec_choices_ = 0;   // choices while speculating, for exploration
  double plain_seconds_ = 0;   // plain decoding's time since the last probe (this policy's share)
};

}  // namespace specloop
