// The publish gate: a candidate draft replaces the live one only if its estimated alpha on the
// same held-out positions is higher overall by a margin, and no domain with enough positions
// to judge falls by more than a tolerance and by more than its noise (DESIGN.md section 6).
// The estimates score each position under its request's sampling (alpha_estimate.h: greedy
// records by argmax agreement), so the gate compares what serving would accept.
// "Overall" weighs each domain by its share of recent traffic when that is known, as serving
// speed does. Pure; no model.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "trainer/alpha_estimate.h"

namespace specloop {
namespace trainer {

// Costs as fractions of a target decode step on target-wide-46m (CPU, float32, one thread;
// bench/engine_bench, "The feature-draft step"): a drafted token of an EAGLE-3 head grown from
// it (a 1-layer head as wide as its 6-layer target), of draft-mix-1m, and each verified token
// beyond the first. Real targets (32+ layers) make a head's share several times smaller: pass
// their own (`specloop train --first-draft-cost`).
inline constexpr double kHeadDraftCost = 0.26;
inline constexpr double kModelDraftCost = 0.01;
inline constexpr double kVerifyCost = 0.06;

struct GateOptions {
  // Least gain in overall logged alpha (absolute). Default: 0.002.
  double min_gain = 0.002;
  // Most a domain's logged alpha may fall (absolute). Learning a new domain costs a small
  // draft some agreement elsewhere; a tolerance below that cost refuses every candidate that
  // learns the new domain (bench/faster_over_time shows the trade). Default: 0.03.
  double max_domain_regression = 0.03;
  // ... or this fraction of the overall gain, when larger: a candidate may cost a domain with
  // little traffic as much as it gains where the traffic is; at the fixed tolerance alone a
  // new domain's gains wait behind small falls of the idle ones. Each version may cost an idle
  // domain this much, so over many versions the replay of old domains (the trainer's floors
  // per domain, DESIGN.md section 6), not the gate, is what keeps them. Default: 1.
  double max_regression_per_gain = 1.0;
  // A fall beyond the tolerance refuses the candidate only when it is also more than this
  // many standard errors of the paired differences (AlphaEstimate::logged_values, records as
  // independent draws: record_ends): on a small held-out set a fall of a few hundredths is
  // noise. Without paired values the tolerance alone decides. Default: 2 (one-sided, ~2.3%
  // of noise refused).
  double regression_z = 2.0;
  // Most a domain's logged alpha may lie below the best a served draft reached on the same
  // held-out records (DecideGate's `best`), whatever the gain elsewhere, beyond regression_z
  // standard errors as above: the tolerance against the live draft judges one version against
  // the last (falls within it add up over versions) and a new domain's gain widens it, so an
  // idle domain was lost a few hundredths at a time. Refused: reason "below_best", the domains
  // in GateDecision::below_best (the trainer then replays them more, and tries blends of the
  // live draft and the candidate: TrainerOptions::below_best_blends). < 0: no such rule.
  // Default: 0.02 (issue 47's bound on forgetting; trainer/README.md, "No forgetting").
  double max_fall_below_best = 0.02;
  // Domains evaluated on fewer positions are not judged on their own (too noisy), though they
  // count in the overall mean. Default: 50.
  int64_t min_domain_positions = 50;
  // Fewer held-out positions in all: no decision (reason "no_data"). Default: 100.
  int64_t min_positions = 100;

  // A FIRST draft, while none is served (DecideFirstDraft), is judged against plain decoding
  // by the speedup its overall alpha promises (ExpectedSpeedup) at the best block length
  // k = 1 .. max_k. Costs are fractions of one target decode step.
  // draft_cost: one drafted token's; < 0: by the draft's kind, kHeadDraftCost for an EAGLE-3
  // head, kModelDraftCost for a draft model (the trainer resolves it; DecideFirstDraft alone
  // takes kHeadDraftCost). Default: -1.
  double draft_cost = -1;
  // Each verified token beyond the first. Default: kVerifyCost.
  double verify_cost = kVerifyCost;
  int max_k = 8;  // Default: 8.
  // Least expected speedup over plain decoding (margin for the estimate's noise and the costs
  // the model leaves out). Default: 1.05.
  double min_speedup = 1.05;
};

struct GateDecision {
  bool publish = false;
  // "ok", or why not: "no_data", "no_gain", "domain_regression", "below_best" (DecideGate),
  // "slower_than_plain" (DecideFirstDraft). Also the metric label.
  std::string reason;
  // Reason "below_best": every domain the candidate holds below its best beyond the
  // allowance (max_fall_below_best, beyond its noise), in name order. Empty otherwise.
  std::vector<std::string> below_best;
  // One line for the log: the numbers behind the decision.
  std::string detail;
};

// REQUIRES: `live` and `candidate` were estimated on the same positions.
// `traffic`: each domain's recent traffic (any positive scale). When it covers a domain of the
// estimates, the overall alpha is the traffic-weighted mean of the domains' alphas (domains
// without traffic weigh nothing); else the mean over all positions. The held-out set keeps
// at most a fixed number of records per domain, gathered since the trainer opened, so its
// positions under-represent a domain traffic has just moved to: weighted by position, a
// candidate that learnt the new domain was refused as "no_gain" (faster_over_time).
// `best` (may be null: no such rule): per domain, the values on the same positions of the
// best draft served there so far (paired with `candidate`'s: same logged_values order and
// record_ends). A domain the candidate holds more than max_fall_below_best below it (and
// beyond regression_z standard errors) refuses it, reason "below_best", checked after
// "domain_regression" and before "no_gain".
GateDecision DecideGate(const GateOptions& options, const AlphaEstimate& live,
                        const AlphaEstimate& candidate,
                        const std::map<std::string, double>& traffic = {},
                        const AlphaEstimate* best = nullptr);

// Expected tokens per target step over the cost of the step, relative to plain decoding (one
// token per target step): with per-position acceptance alpha, a block of k drafts yields
// (1 - alpha^(k+1)) / (1 - alpha) tokens (k + 1 when alpha = 1) and costs
// 1 + k * (draft_cost + verify_cost) target steps.
double ExpectedSpeedup(double alpha, int k, double draft_cost, double verify_cost);

// A first draft against plain decoding (nothing served yet, so no live draft to beat):
// publish when the candidate's overall alpha (traffic-weighted as DecideGate's) promises
// ExpectedSpeedup >= min_speedup at the best k in 1..max_k; reasons "ok", "no_data" (fewer
// than min_positions positions), "slower_than_plain".
GateDecision DecideFirstDraft(const GateOptions& options, const AlphaEstimate& candidate,
                              const std::map<std::string, double>& traffic = {});

}  // namespace trainer
}  // namespace specloop
