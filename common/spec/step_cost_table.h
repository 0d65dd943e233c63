// StepCostTable: what one decoding step costs on this machine, measured as it decodes, for the
// speculation policy to price each speculation length (docs/speculation-policy.md):
//
//   target(R, L) = W(R) + slope * R * L   one target forward over R rows in all (a sequence's
//                                         pending token plus its drafts, summed over the batch),
//                                         its rows' verification included, L the cached tokens
//                                         each row attends to;
//   draft(b)                              one batched draft forward drafting one position for
//                                         each of b sequences;
//   catch_up(n)                           the draft's forward over n tokens it has not seen.
//
// W and draft are decayed means on a grid of sizes (1..16 exactly, then steps of about 1.5x),
// interpolated linearly between measured sizes, flat below the smallest and proportional beyond
// the largest, and no size above a larger one observed in the last two half-lives (fewer rows
// do no more work; a size's own times can be slow for a reason of their own). An
// observation's weight halves every `half_life` observations of any size: a size seldom taken
// is as fresh as its last few observations. `slope` (attention's seconds per row and cached
// token) comes from a calibration at two contexts and is not refined: it is arithmetic, and a
// step's noise would swamp it.
//
// A whole decoding step is priced by StepSeconds: its batched draft forwards, and its rows'
// share of the target forward over every row in it, prompt chunks included. A row is priced
// at the step's total rows, not at one sequence's: at 16 sequences, or beside a long chunk,
// the forward is bound by arithmetic and each row costs its share, where one sequence's few
// rows alone ride along with the weights' reads almost free.
//
// A one-row forward that follows a draft forward within kColdPlainForwards target forwards is
// not recorded: the draft has evicted part of the target's weights from the CPU's caches, so it
// is not what plain decoding costs.
//
// Pure logic; not thread-safe (one owner: a generation, or the scheduler's thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace specloop {

class StepCostTable {
 public:
  static constexpr int kColdPlainForwards = 4;

  // `half_life`: observations (of any size) after which an observation's weight halves.
  explicit StepCostTable(double half_life = 32.0);

  // A target forward over `rows` rows whose rows attended to `attended` cached tokens in all
  // (sum over rows) took `seconds`, verification included. `after_draft`: a draft forward ran
  // since the previous target forward.
  void ObserveTarget(int rows, double attended, double seconds, bool after_draft);
  // A batched draft forward drafting one position for each of `sequences` took `seconds`.
  void ObserveDraft(int sequences, double seconds);
  // The draft caught up on `tokens` tokens in `seconds`.
  void ObserveCatchUp(int64_t tokens, double seconds);
  // Attention's seconds per row and cached token (>= 0), from a calibration.
  void set_context_slope(double seconds_per_row_token);
  double context_slope() const { return slope_; }

  // Seconds of a target forward over `rows` rows, each after `context` cached tokens; 0 while
  // no target forward is known.
  double TargetSeconds(int rows, double context) const;
  // Seconds of one batched draft forward for `sequences` sequences; 0 while none is known.
  double DraftSeconds(int sequences) const;

  // One decoding step's plan, for StepSeconds.
  struct Step {
    int rows = 0;            // the decoding sequences' target rows (pending tokens and blocks)
    double attended = 0;     // cached tokens those rows attend to, summed over the rows
    int chunk_rows = 0;      // prompt-chunk rows riding in the same target forward
    int draft_forwards = 0;  // batched draft forwards (the longest batched chain)
    int drafting = 0;        // sequences in those forwards
    double other_draft_seconds = 0;  // drafting outside them (token trees' level forwards)
  };
  // Seconds of the step's decoding: its batched draft forwards (draft_forwards *
  // DraftSeconds(drafting)), other_draft_seconds, and the decoding rows' share of the target
  // forward over rows + chunk_rows rows (the forward's seconds times rows / all rows: the
  // chunks move the rows' place on the curve, their own share is prefill's), plus attention
  // over `attended`. 0 while no target forward is known or the step has no rows.
  double StepSeconds(const Step& step) const;
  // Seconds of a catch-up on `tokens` tokens: the measured seconds per token, and at least one
  // draft forward; 0 for no tokens or while none was measured.
  double CatchUpSeconds(int64_t tokens) const;
  // Whether a target forward is known (a proposer with no draft model costs nothing to draft).
  bool ready() const { return !target_.empty(); }
  // Target forwards observed since one of about `rows` rows (one counting at the same grid
  // size) was last observed: how stale TargetSeconds(rows, .) is. A size never observed is
  // as old as every observation.
  int64_t TargetAge(int rows) const { return target_.Age(rows); }
  // Target forwards observed so far (the clock TargetAge counts in).
  int64_t TargetObservations() const { return target_.clock(); }
  // The plain refresh (SpeculationPolicyOptions::plain_refresh_steps): whether the step of a
  // batch of `batch` >= 2 sequences and `chunk_rows` prompt-chunk rows should decode plainly
  // throughout, so that it measures what plain decoding costs: true when its plain forward
  // (batch + chunk_rows rows) has gone unmeasured for more than `every` target forwards and no
  // refresh was taken in the last `every` (one whose forward did not count is not retried at
  // once). Speculating never measures the plain step, so without it a stale plain cost, say a
  // start-up outlier, would hold a batch in speculation. false for one sequence (its one-row
  // plain step amid speculation runs cold and is not recorded: kColdPlainForwards), for
  // every <= 0 and before any target forward is known.
  bool PlainRefreshDue(int batch, int chunk_rows, int64_t every) const;
  // The caller takes the refresh: its step decodes plainly.
  void MarkPlainRefresh() { refreshed_at_ = target_.clock(); }

  // Seconds as a decayed mean over a grid of sizes (see the header comment).
  class Curve {
   public:
    explicit Curve(double decay);
    void Observe(int size, double seconds);
    double Seconds(int size) const;  // 0 while nothing is measured
    bool empty() const;
    int64_t Age(int size) const;  // observations of any size since this size's grid point's last
    int64_t clock() const { return clock_; }  // observations of any size

   private:
    size_t Nearest(int size) const;
    static constexpr double kCapHalfLives = 2;  // see Seconds()
    double decay_;
    int64_t cap_age_;             // observations within which a larger size caps a smaller
    std::vector<int> grid_;       // sizes, increasing
    std::vector<double> sum_, weight_;  // [grid index]: decayed sums of seconds, of observations
    std::vector<int64_t> last_;         // [grid index]: clock_ at its last observation
    int64_t clock_ = 0;                 // observations of any size
  };

 private:
  double decay_;  // per observation: 0.5^(1 / half_life)
  Curve target_, draft_;
  double slope_ = 0;
  double catch_up_s_ = 0, catch_up_n_ = 0;  // decayed sums of seconds, of tokens
  int plain_run_ = kColdPlainForwards;  // target forwards since the last draft forward
  int64_t refreshed_at_ = -1;           // TargetObservations() at the last plain refresh
};

}  // namespace specloop
