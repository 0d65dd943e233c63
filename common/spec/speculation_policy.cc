#include "common/spec/speculation_policy.h"

#include <algorithm>
#include <vector>

#include "common/spec/acceptance.h"

namespace specloop {

SpeculationPolicy::SpeculationPolicy(const SpeculationPolicyOptions& options)
    : options_(options),
      acceptance_(options.prior_alpha, options.prior_weight, options.half_life_steps) {}

double SpeculationPolicy::ExpectedRate(const StepCostTable& costs, int k, int batch,
                                       int64_t context, int chunk_rows) const {
  batch = std::max(1, batch);
  k = std::max(0, k);
  StepCostTable::Step step;
  step.rows = batch * (k + 1);
  step.attended = step.rows * static_cast<double>(std::max<int64_t>(0, context));
  step.chunk_rows = chunk_rows;
  step.draft_forwards = k;
  step.drafting = batch;
  const double seconds = costs.StepSeconds(step);
  return seconds > 0 ? spec::ExpectedTokensPerStep(alpha(), k) / seconds : 0.0;
}

int SpeculationPolicy::ChooseK(const StepCostTable& costs, int batch, int64_t context,
                               int64_t catch_up_tokens, int64_t remaining, int chunk_rows) {
  const int k_max = std::max(0, options_.k_max);
  if (k_max == 0) return 0;
  if (!costs.ready()) return std::max(1, k_max / 2);
  batch = std::max(1, batch);
  std::vector<double> rate(k_max + 1);
  int best = 0, best_spec = 1;
  for (int k = 0; k <= k_max; ++k) {
    rate[k] = ExpectedRate(costs, k, batch, context, chunk_rows);
    if (rate[k] > rate[best]) best = k;
    if (k > 0 && rate[k] > rate[best_spec]) best_spec = k;
  }
  // Hysteresis: estimates that cross within their noise do not move the choice.
  if (current_ >= 0 && current_ <= k_max && best != current_ &&
      rate[best] <= (1.0 + options_.hysteresis) * rate[current_]) {
    best = current_;
  }
  current_ = best;
  if (best == 0) {
    // Plain decoding. A probe keeps alpha measured. It costs the draft's catch-up, its drafts,
    // its extra rows in the batch's forward and about one plain step more in the cold steps
    // after it (target-6m: 1.2 steps); the last two together come to about the forward over
    // batch + k rows. Taken once plain decoding's time since the last probe (this sequence's
    // share of each batch step) is 1 / probe_share times that.
    const double L = static_cast<double>(context);
    const double probe = costs.CatchUpSeconds(catch_up_tokens) +
                         best_spec * costs.DraftSeconds(1) +
                         costs.TargetSeconds(batch + best_spec, L);
    plain_seconds_ += costs.TargetSeconds(batch, L) / batch;
    if (plain_seconds_ * options_.probe_share < probe) return 0;
    plain_seconds_ = 0;
    return best_spec;
  }
  plain_seconds_ = 0;
  // A draft that is behind first catches up: worth it only where the rest repays it.
  if (remaining > 0 && catch_up_tokens > 0 && rate[0] > 0) {
    const double n = static_cast<double>(remaining);
    if (costs.CatchUpSeconds(catch_up_tokens) >= n / rate[0] - n / rate[best]) return 0;
  }
  // Exploration: a neighbouring length, alternately above and below (never k = 0: a plain step
  // of one sequence amid speculation runs cold and is not recorded).
  const int interval = std::max(1, options_.explore_interval);
  if (++spec_choices_ % interval == 0) {
    int n = (spec_choices_ / interval) % 2 ? best + 1 : best - 1;
    if (n > k_max) n = best - 1;
    if (n < 1) n = best + 1;
    if (n >= 1 && n <= k_max) return n;
  }
  return best;
}

}  // namespace specloop
