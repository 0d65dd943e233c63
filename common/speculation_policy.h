// SpeculationPolicy: picks the speculation length k in [0, k_max] that maximizes expected tokens
// per unit of time (DESIGN.md section 4):
//
//   tokens(k) = tau(alpha, k) = (1 - alpha^(k+1)) / (1 - alpha)      (k = 0: one token)
//   time(k)   = k * draft_seconds + target_seconds(k + 1)
//
// from measured quantities: alpha (per-token acceptance over a recent window), the draft's
// seconds per drafted token, and the target's seconds per forward of n positions after L
// cached tokens, kept per n as a + s * L (seeded by a calibration run at two context lengths,
// which fixes the slope s; every observed forward refines a; unmeasured n interpolated). A
// length that goes unobserved would otherwise keep the cost of the context it was measured
// at (target-6m, one position: 1.05 ms after 16 cached tokens, 1.27 ms after 256; nine:
// 3.65 / 4.46 ms). In one spec_bench A/B the slope was 1.011x of flat costs (median of 10
// cells, within the noise); most of a stale plain cost (2.0 ms modelled, 1.42-1.58 ms real
// on docs) came from how plain forwards were timed (CalibrationOptions::plain_run).
// k = 0 (plain decoding) is chosen where nothing beats it; while at 0, a probe now and then
// choice still speculates so that acceptance keeps being measured (it may recover, e.g. after
// a new draft). A sequence whose draft has fallen behind (its prompt, tokens decoded plainly,
// a swapped draft: Proposer::CatchUpTokens) first pays the draft's catch-up; it switches to
// speculation only where the time saved over the tokens it has left repays that (and, coming
// from plain decoding, the cold plain steps that end speculation: count_switch_cost), with
// rates taken a standard error against speculation (repay_confidence):
//
//   catch_up_seconds + remaining / rate(k) < remaining / rate(0)
//
// A shared machine slows every forward alike, and the load changes while a length goes
// unobserved (the sizes of forwards that k = 0 never runs, the draft, a length's realized
// rate). So costs are kept in load-free units: a load factor follows the ratio of plain
// decoding's target forwards (one position) to their modelled cost, every observation is
// divided by it when recorded and every estimate multiplied by it when read. Ratios between
// lengths, which the choice depends on, then compare measurements taken under different
// loads fairly.
//
// Pure logic; the caller times forwards and reports them. One policy per domain (or per
// request). Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdint>
#include <functional>
#include <vector>

namespace specloop {

struct SpeculationPolicyOptions {
  // Largest k considered. Default: 8.
  int k_max = 8;
  // Half-life, in observed speculative steps, of the alpha and cost estimates. Default: 32.
  double half_life_steps = 32.0;
  // Alpha assumed before any observation. Default: 0.6.
  double prior_alpha = 0.6;
  // Weight, in draft tokens, of that prior. Default: 8.
  double prior_weight = 8.0;
  // Steps at a length before its realized rate is trusted over the model. Default: 8.
  int min_realized_steps = 8;
  // While k = 0 wins, speculate anyway after this many choices; each probe that does not
  // change the verdict doubles the wait, up to max_probe_interval (a probe with a poor draft
  // costs draft forwards and a longer verification). Default: 16.
  int probe_interval = 16;
  // Longest wait between those probes. A probe first catches the draft up on everything
  // decoded plainly since the last (a whole prompt at a request's start: 3-9 ms, 3-7 plain
  // steps in spec_bench), so where speculation never pays the probes' share of the time is
  // about that over this wait. Default: 1024.
  int max_probe_interval = 1024;
  // While some k > 0 wins, every plain_probe_interval-th choice starts a plain probe (see
  // plain_probe_steps), so that plain decoding's realized cost stays measured beside the
  // chosen length's. Its modelled cost alone can be far off (calibrated at another context
  // length and machine state; spec_bench, docs / draft-prose-1m: 2.0 ms modelled, 1.42-1.58
  // ms real). Probes cost: in an A/B run (spec_bench --b-plain-probe-interval, one-step
  // probes), probing every 16 choices was 0.977x (median of 10 draft / domain cells; 8 of 10
  // below 1) of every 256. Default: 256.
  int plain_probe_interval = 256;
  // Such a plain probe runs this many plain steps in a row, so that some of them are warm
  // (see cold_plain_steps). Default: 8.
  int plain_probe_steps = 8;
  // Plain steps right after a speculative step are not plain decoding: the draft's forwards
  // have evicted the target's weights from the CPU's caches. In spec_bench (draft-mix-1m /
  // legal) the one-position forward took 1749 / 1736 / 1579 / 1479 / 1412 us as the 1st to
  // 5th plain step after a speculative one, 1252 us later in a run. Recorded, they made plain
  // decoding look up to 1.4x dearer than it is to a policy that was speculating. So the
  // first cold_plain_steps plain steps after a speculative step leave plain decoding's costs
  // (its realized rate, the one-position forward, the load) as they were. Default: 4.
  int cold_plain_steps = 4;
  // A length's realized cost forgets with steps taken at any length, not only at it: the
  // first steps at a length after a long stretch at others outweigh what was measured before.
  // Forgetting only with its own steps, the length left behind kept the value it had when it
  // lost, often a low one (its rate dipped below the other's), until many probes had
  // replaced it (spec_bench, draft-prose-1m / prose: speculating at k_mean 1.40, 0.855x of
  // plain, with cold plain steps already left out). Three A/B runs are in the README.
  // Default: true.
  bool forget_per_any_step = true;
  // A switch from plain decoding to speculation costs more than the draft's catch-up: when
  // speculation ends, the cold plain steps (see cold_plain_steps) run slower than warm ones.
  // The policy measures that excess (cold plain steps' seconds over warm plain decoding's)
  // and, coming from plain decoding, speculates only where the time saved over the tokens the
  // sequence has left repays the catch-up and that excess. Near a tie, estimates that cross
  // with noise otherwise switch back and forth, paying both each time (spec_bench, docs /
  // draft-prose-1m: switches at estimated gains of 0.1-5% over plain, a few speculative
  // steps each). Default: true.
  bool count_switch_cost = true;
  // Where speculating now owes something (a catch-up, a switch's cost), the gain that must
  // repay it is taken at this many standard errors against speculation: the chosen length's
  // realized rate that many below its estimate, plain decoding's that many above. A step's
  // time varies (a shared machine), and the rates are means over few recent steps (plain
  // decoding's, while speculating, over the few warm steps of a plain probe), so a gain that
  // repays a catch-up is often noise; a choice among noisy rates picks those that erred
  // upwards. Traced on spec_bench (draft-mix-1m / prose): a realized k = 1 step 1.7% ahead of
  // plain, estimated 4-14% ahead where it paid a prompt's catch-up (~3 ms, 4% of a 64-token
  // request). A standard error is the relative spread of recent steps (any length, around
  // their length's mean) over the square root of the length's effective number of steps; the
  // spread of acceptance is left out. 0: point estimates. Default: 1.
  double repay_confidence = 1.0;
};

class SpeculationPolicy {
 public:
  explicit SpeculationPolicy(const SpeculationPolicyOptions& options = {});

  // One verification step: `drafted` tokens proposed, the first `accepted` of them accepted.
  // Acceptance is estimated as a geometric success rate: `accepted` successes and, when
  // accepted < drafted, one failure (positions after the first rejection were never tested).
  void ObserveStep(int drafted, int accepted);
  // Seconds the target took for one forward of `positions` new tokens of one sequence after
  // `context` cached tokens. Moves that size's cost and, for one position once it has a cost,
  // the load factor.
  void ObserveTarget(int positions, double seconds, int64_t context = 0);
  // Seconds the proposer took to draft `tokens` tokens (skip free proposers).
  void ObserveDraft(int tokens, double seconds);
  // Seconds the draft took to catch up on `tokens` context tokens in one forward.
  void ObserveCatchUp(int64_t tokens, double seconds);
  // A whole step taken at length k took `seconds` (drafting, this sequence's share of the
  // target forward, verification). Once k has `min_realized_steps` steps, its realized cost
  // per step replaces the model's: the model misses overheads (bookkeeping, two models
  // taking turns on the CPU's caches), the realized cost does not, so a length that loses in
  // practice stops being chosen. Tokens per step still come from alpha: a length's own tokens
  // would depend on how easy the text was while it was chosen (a policy picks long blocks
  // where acceptance runs high). Lengths still without a realized cost get their modelled
  // cost scaled by the realized over modelled cost of the last speculative length measured
  // (k = 0's before any). Cold plain steps (cold_plain_steps) are not recorded.
  void ObserveRealized(int k, double seconds);
  // Expected tokens per second at length k from its realized cost per step; negative while
  // it has too few steps.
  double RealizedRate(int k) const;
  // The relative standard error of RealizedRate(k) (see repay_confidence); 0 before any
  // spread was measured.
  double RealizedRateError(int k) const;

  // The k with the highest expected tokens per second; 0 when speculation does not pay (but
  // see probe_interval), counting the draft's catch-up on `catch_up_tokens` tokens (and,
  // coming from plain decoding, the switch's cost: count_switch_cost) against the time saved
  // over the `remaining` tokens the sequence may still emit (remaining <= 0: unknown, neither
  // is counted), with target costs at `context` cached tokens.
  // Before any target or draft cost is known: k_max / 2.
  int ChooseK(int64_t catch_up_tokens = 0, int64_t remaining = 0, int64_t context = 0);

  double alpha() const;
  // The load factor: recent one-position target forwards' seconds over their load-free cost
  // (1 at start).
  double load() const { return load_; }
  double draft_seconds_per_token() const;
  // Measured excess, in seconds, of the cold plain steps after speculation over warm plain
  // steps (see count_switch_cost); 0 before any was measured.
  double SwitchSeconds() const;
  // Expected seconds of the draft's catch-up on `tokens` tokens: the observed seconds per
  // caught-up token times `tokens`, and at least one draft forward; 0 before any catch-up or
  // draft cost is known.
  double CatchUpSeconds(int64_t tokens) const;
  // Target seconds for a forward of `positions` new tokens after `context` cached tokens:
  // measured, else interpolated between the nearest measured sizes (extrapolated flat); 0
  // when nothing is measured.
  double target_seconds(int positions, int64_t context = 0) const;
  // Expected tokens per second at speculation length k under the current estimates.
  double ExpectedRate(int k, int64_t context = 0) const;

  // Batched serving (see BatchCostModel below): the k with the highest expected tokens per
  // second for one sequence of a batch of `batch_size` sequences, the target's cost per
  // sequence read from `cost` as its share of a forward over batch_size * (k + 1) rows.
  // Large batches make verification cheap per row and drafting (one sequence at a time)
  // relatively dear, so this turns speculation down and then off. While k = 0 wins, it probes
  // as ChooseK() does, with waits batch_size times longer (each probe delays the whole batch).
  // Falls back to ChooseK() while `cost` has no measurement. Catch-up as in ChooseK().
  int ChooseKInBatch(const class BatchCostModel& cost, int batch_size,
                     int64_t catch_up_tokens = 0, int64_t remaining = 0);
  // Expected tokens per second of one sequence at length k in a batch of `batch_size`.
  double ExpectedRateInBatch(int k, const class BatchCostModel& cost, int batch_size) const;

  // Sets a cost estimate directly (a calibration run), replacing what was observed: a forward
  // of `positions` after `context` cached tokens took `seconds`, and each cached token more
  // or less adds or saves `seconds_per_context_token` (>= 0; 0: the cost does not follow
  // the context).
  void SeedTarget(int positions, double seconds, int64_t context = 0,
                  double seconds_per_context_token = 0);
  void SeedDraft(double seconds_per_token);

 private:
  SpeculationPolicyOptions options_;
  double decay_;  // per-observation weight kept: 0.5^(1 / half_life)
  double shape_decay_;  // the same for the one-position cost beside the load: 32x the half-life
  double load_ = 1.0;  // see the class comment; every seconds below is divided by it
  // Acceptance: decayed counts of successes and failures.
  double successes_, failures_;
  // Target cost per block size n = 1..k_max + 1 (index n), load-free: target_cost_[n] +
  // target_slope_[n] * context.
  std::vector<double> target_cost_, target_slope_;
  std::vector<bool> target_known_;  // [n]: measured or seeded
  double TargetCost(int positions, int64_t context) const;  // load-free, interpolated
  double TargetSlope(int positions) const;                  // interpolated likewise
  // Draft cost: decayed sums of seconds and tokens; likewise for catch-ups.
  double draft_s_ = 0, draft_n_ = 0;
  double catch_up_s_ = 0, catch_up_n_ = 0;
  // Realized cost per k: decayed sums of seconds and of steps, and steps seen.
  std::vector<double> real_seconds_, real_n_;
  std::vector<double> real_w2_;        // decayed sum of the squared weights (effective steps)
  double spread_s_ = 0, spread_n_ = 0;  // decayed sums of steps' squared relative deviations
  std::vector<int64_t> real_steps_;
  std::vector<int64_t> real_last_;  // steps_ at k's last realized step
  int64_t steps_ = 0;               // realized steps observed, at any length, cold ones too
  int64_t spec_streak_ = 0;         // choices of k > 0 since the last plain probe
  int plain_probe_left_ = 0;        // plain steps still to run in the current plain probe
  // Plain steps observed since the last speculative one (ObserveRealized and ObserveTarget
  // count apart, each its own calls); below cold_plain_steps a plain step is cold.
  int64_t realized_plain_run_, target_plain_run_;
  double cold_excess_ = 0;               // the current run of cold plain steps' excess so far
  double switch_s_ = 0, switch_n_ = 0;   // decayed sums of whole runs' excess, and of runs
  bool speculating_ = false;             // the last choice, probes aside, was some k > 0
  // The k maximizing the rate over [0, k_max] (realized where trusted, else `model` charged
  // the measured overhead; a k > 0 must also repay the catch-up over `remaining` tokens),
  // with probes either way (waits scaled by probe_scale).
  int ChooseBest(const std::function<double(int)>& model, int probe_scale,
                 int64_t catch_up_tokens, int64_t remaining);

  int64_t zero_streak_ = 0;  // choices of k = 0 since the last probe or k > 0
  int probe_wait_;       // choices of k = 0 before the next probe
};

// BatchCostModel: seconds of one batched target forward as a function of the total rows (new
// positions summed over the batch's sequences), on a fixed grid of row counts (1..16, then
// steps of about 1.5x up to 4096), interpolated linearly between measured points and
// extrapolated proportionally to rows beyond the largest. Each observation updates the grid
// point nearest to its row count (after scaling the seconds by the model's own ratio between
// the two sizes), as an exponentially weighted average. Per-sequence count effects (attention
// over each sequence's own cache) are folded into the rows. Not thread-safe (the scheduler
// owns it).
class BatchCostModel {
 public:
  // `half_life` in observations per grid point. Default: 32.
  explicit BatchCostModel(double half_life = 32.0);

  void Observe(int rows, double seconds);
  // Sets the grid point nearest `rows` (a calibration run), replacing what was observed.
  void Seed(int rows, double seconds);
  // Seconds for a forward of `rows` rows; 0 when nothing is measured.
  double Seconds(int rows) const;
  // A sequence's share of a forward in which each of `batch_size` sequences brings
  // `positions` rows: Seconds(batch_size * positions) / batch_size.
  double SecondsPerSequence(int batch_size, int positions) const;
  bool empty() const;

 private:
  size_t Nearest(int rows) const;
  double decay_;
  std::vector<int> grid_;        // row counts, increasing
  std::vector<double> seconds_;  // [grid index]; 0 = not measured
};


}  // namespace specloop
