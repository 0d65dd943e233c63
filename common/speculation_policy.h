// SpeculationPolicy: picks the speculation length k in [0, k_max] that maximizes expected tokens
// per unit of time (DESIGN.md section 4):
//
//   tokens(k) = tau(alpha, k) = (1 - alpha^(k+1)) / (1 - alpha)      (k = 0: one token)
//   time(k)   = k * draft_seconds + target_seconds(k + 1)
//
// from measured quantities: alpha (per-token acceptance over a recent window), the draft's
// seconds per drafted token, and the target's seconds per forward of n positions, kept per n
// (seeded by a calibration run, refined by every observed forward; unmeasured n interpolated).
// k = 0 (plain decoding) is chosen where nothing beats it; while at 0, a probe now and then
// choice still speculates so that acceptance keeps being measured (it may recover, e.g. after
// a new draft). Pure logic; the caller times forwards and reports them. One policy per domain
// (or per request). Not thread-safe.
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
  // Default: 256.
  int max_probe_interval = 256;
};

class SpeculationPolicy {
 public:
  explicit SpeculationPolicy(const SpeculationPolicyOptions& options = {});

  // One verification step: `drafted` tokens proposed, the first `accepted` of them accepted.
  // Acceptance is estimated as a geometric success rate: `accepted` successes and, when
  // accepted < drafted, one failure (positions after the first rejection were never tested).
  void ObserveStep(int drafted, int accepted);
  // Seconds the target took for one forward of `positions` new tokens of one sequence.
  void ObserveTarget(int positions, double seconds);
  // Seconds the proposer took to draft `tokens` tokens (skip free proposers).
  void ObserveDraft(int tokens, double seconds);
  // A whole step taken at length k: `emitted` tokens in `seconds` (drafting, this sequence's
  // share of the target forward, verification). Once k has `min_realized_steps` recent
  // steps, its realized rate replaces the model's estimate: the model misses overheads (and
  // machine load), the realized rate does not, so a length that loses in practice stops
  // being chosen.
  void ObserveRealized(int k, int emitted, double seconds);
  // Realized tokens per second at length k; negative while it has too few steps.
  double RealizedRate(int k) const;

  // The k with the highest expected tokens per second; 0 when speculation does not pay (but
  // see probe_interval). Before any target or draft cost is known: k_max / 2.
  int ChooseK();

  double alpha() const;
  double draft_seconds_per_token() const;
  // Target seconds for a forward of `positions` new tokens: measured, else interpolated
  // between the nearest measured sizes (extrapolated flat); 0 when nothing is measured.
  double target_seconds(int positions) const;
  // Expected tokens per second at speculation length k under the current estimates.
  double ExpectedRate(int k) const;

  // Batched serving (see BatchCostModel below): the k with the highest expected tokens per
  // second for one sequence of a batch of `batch_size` sequences, the target's cost per
  // sequence read from `cost` as its share of a forward over batch_size * (k + 1) rows.
  // Large batches make verification cheap per row and drafting (one sequence at a time)
  // relatively dear, so this turns speculation down and then off. While k = 0 wins, it probes
  // as ChooseK() does, with waits batch_size times longer (each probe delays the whole batch).
  // Falls back to ChooseK() while `cost` has no measurement.
  int ChooseKInBatch(const class BatchCostModel& cost, int batch_size);
  // Expected tokens per second of one sequence at length k in a batch of `batch_size`.
  double ExpectedRateInBatch(int k, const class BatchCostModel& cost, int batch_size) const;

  // Sets a cost estimate directly (a calibration run), replacing what was observed.
  void SeedTarget(int positions, double seconds);
  void SeedDraft(double seconds_per_token);

 private:
  SpeculationPolicyOptions options_;
  double decay_;  // per-observation weight kept: 0.5^(1 / half_life)
  // Acceptance: decayed counts of successes and failures.
  double successes_, failures_;
  // Target cost per block size n = 1..k_max + 1 (index n); 0 = not measured.
  std::vector<double> target_cost_;
  // Draft cost: decayed sums of seconds and tokens.
  double draft_s_ = 0, draft_n_ = 0;
  // Realized rate per k: decayed sums of emitted tokens and seconds, and steps seen.
  std::vector<double> real_tokens_, real_seconds_;
  std::vector<int64_t> real_steps_;
  // RealizedRate(k) where trusted, else `model`.
  double Blend(int k, double model) const;
  // The k maximizing rate(k) over [0, k_max], with probes while 0 wins (waits scaled by
  // probe_scale).
  int ChooseBest(const std::function<double(int)>& rate, int probe_scale);

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
