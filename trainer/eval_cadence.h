// EvalCadence: when the online trainer evaluates its candidate (and may publish it). Pure
// logic; no model, no clock of its own.
//
// An evaluation runs the live and candidate drafts over the held-out records: seconds that
// training does not get. A fixed interval is wrong both ways: 200 steps between evaluations
// kept a new user's `specloop up` from publishing anything in 170 steps of a new domain, and 25
// spends evaluations on a draft that has stopped improving. So the interval adapts:
//   - after a publish, or when the traffic's domain mix shifts (the total variation distance
//     between the mix now and at the last evaluation reaches `shift`), the next evaluation
//     comes after `min_steps`: that is when a draft still learning gains;
//   - each refusal doubles the interval, up to `max_steps`: a draft that stopped gaining is
//     checked less and less often (a refusal for want of held-out data changes nothing, nor
//     does one for a domain below its best, which the trainer is replaying more meanwhile);
//   - whatever the interval, evaluation takes at most `max_share` of the trainer's time: an
//     evaluation waits until training has run (1 - max_share) / max_share times as long as the
//     last evaluation took.
// Not thread-safe (the trainer's loop owns it).
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace specloop {
namespace trainer {

struct EvalCadenceOptions {
  // Steps between evaluations after a publish or a shift. Default: 25 (a draft learning a new
  // domain gains a gate's margin in 25 steps of 8 records: faster_over_time).
  int64_t min_steps = 25;
  // Most steps between evaluations, reached by doubling after refusals. Default: 200.
  int64_t max_steps = 200;
  // Most of the trainer's time evaluation may take. Default: 0.25.
  double max_share = 0.25;
  // Total variation distance of the domain mix since the last evaluation that counts as a
  // shift. Default: 0.3 (a new domain taking 30% of the traffic).
  double shift = 0.3;
};

class EvalCadence {
 public:
  explicit EvalCadence(const EvalCadenceOptions& options = EvalCadenceOptions());

  // One training step that took `seconds`; `traffic` is the recent domain mix (any positive
  // scale). Returns whether to evaluate now.
  bool AfterStep(double seconds, const std::map<std::string, double>& traffic);
  // kBelowBest: refused for domains below their best (publish_gate.h), which training now
  // replays more: not a draft that stopped gaining, so the interval stays.
  enum class Outcome { kPublished, kRefused, kNoData, kBelowBest };
  // The evaluation ran for `seconds` with this outcome.
  void Evaluated(double seconds, Outcome outcome);

  int64_t interval() const { return interval_; }

 private:
  const EvalCadenceOptions options_;
  int64_t interval_;
  int64_t steps_since_ = 0;
  double train_seconds_since_ = 0;
  double last_eval_seconds_ = 0;
  // The mix at the first step after the last evaluation (normalized); empty until then.
  std::map<std::string, double> mix_at_eval_;
};

}  // namespace trainer
}  // namespace specloop
