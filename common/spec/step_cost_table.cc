#include "common/spec/step_cost_table.h"

#include <algorithm>
#include <cmath>

namespace specloop {

StepCostTable::Curve::Curve(double decay)
    : decay_(decay),
      cap_age_(decay > 0 && decay < 1
                   ? std::llround(kCapHalfLives * std::log(0.5) / std::log(decay))
                   : 0) {
  for (int s = 1; s <= 16; ++s) grid_.push_back(s);
  while (grid_.back() < 4096) grid_.push_back(grid_.back() * 3 / 2);
  sum_.assign(grid_.size(), 0.0);
  weight_.assign(grid_.size(), 0.0);
  last_.assign(grid_.size(), 0);
}

bool StepCostTable::Curve::empty() const {
  return std::all_of(weight_.begin(), weight_.end(), [](double w) { return w <= 0; });
}

int64_t StepCostTable::Curve::Age(int size) const {
  return clock_ - last_[Nearest(std::max(size, 1))];
}

size_t StepCostTable::Curve::Nearest(int size) const {
  auto it = std::lower_bound(grid_.begin(), grid_.end(), size);
  if (it == grid_.end()) return grid_.size() - 1;
  const size_t hi = it - grid_.begin();
  if (hi == 0 || *it == size) return hi;
  // Nearest by ratio: the size against the geometric midpoint.
  return double(size) * size < double(grid_[hi]) * grid_[hi - 1] ? hi - 1 : hi;
}

void StepCostTable::Curve::Observe(int size, double seconds) {
  if (size < 1 || !(seconds >= 0) || !std::isfinite(seconds)) return;
  const size_t i = Nearest(size);
  // Off-grid sizes count at the grid point, scaled by the curve's own ratio between the two
  // (proportionally to size before there is one).
  const double here = Seconds(size), there = Seconds(grid_[i]);
  const double scaled = here > 0 && there > 0 ? seconds * there / here
                                              : seconds * grid_[i] / size;
  // Weights age with observations of any size, so that a size seldom taken is as fresh as
  // its last few observations, not its many old ones.
  const double kept = std::pow(decay_, static_cast<double>(++clock_ - last_[i]));
  last_[i] = clock_;
  sum_[i] = sum_[i] * kept + scaled;
  weight_[i] = weight_[i] * kept + 1.0;
}

double StepCostTable::Curve::Seconds(int size) const {
  size = std::max(size, 1);
  int lo = -1, hi = -1;  // the measured grid points around `size`
  for (size_t i = 0; i < grid_.size(); ++i) {
    if (weight_[i] <= 0) continue;
    if (grid_[i] <= size) lo = static_cast<int>(i);
    if (grid_[i] >= size) {
      hi = static_cast<int>(i);
      break;
    }
  }
  auto at = [&](int i) { return sum_[i] / weight_[i]; };
  if (lo < 0 && hi < 0) return 0.0;
  if (hi < 0) return at(lo) * size / grid_[lo];  // beyond the largest measured: proportional
  // At most what a larger size measured lately costs: fewer rows do no more work. A size's
  // observations can be slow for a reason of their own (a batch shrinks to 15 rows just as a
  // request ends, when the server's other threads wake to answer it and send the next one)
  // and would otherwise price that size above larger ones. Only a size observed within
  // kCapHalfLives half-lives caps: an old time (a calibration's, on an idle machine) is not
  // what the others cost now.
  double cap = at(hi);
  for (size_t i = hi + 1; i < grid_.size(); ++i) {
    if (weight_[i] > 0 && clock_ - last_[i] <= cap_age_) cap = std::min(cap, at(i));
  }
  if (lo < 0 || lo == hi) return cap;  // below the smallest measured: flat
  const double t = double(size - grid_[lo]) / (grid_[hi] - grid_[lo]);
  return std::min(cap, at(lo) * (1 - t) + at(hi) * t);
}

StepCostTable::StepCostTable(double half_life)
    : decay_(std::pow(0.5, 1.0 / std::max(1.0, half_life))), target_(decay_), draft_(decay_) {}

void StepCostTable::ObserveTarget(int rows, double attended, double seconds, bool after_draft) {
  if (after_draft) {
    plain_run_ = 0;
  } else if (plain_run_ < kColdPlainForwards) {
    ++plain_run_;
    if (rows == 1) return;  // cold: see the header comment
  }
  // What the context's attention adds is taken out; the rest is the rows' cost.
  target_.Observe(rows, std::max(0.0, seconds - slope_ * std::max(0.0, attended)));
}

void StepCostTable::ObserveDraft(int sequences, double seconds) {
  draft_.Observe(sequences, seconds);
}

void StepCostTable::ObserveCatchUp(int64_t tokens, double seconds) {
  if (tokens <= 0 || !(seconds > 0)) return;
  catch_up_s_ = catch_up_s_ * decay_ + seconds;
  catch_up_n_ = catch_up_n_ * decay_ + static_cast<double>(tokens);
}

void StepCostTable::set_context_slope(double seconds_per_row_token) {
  slope_ = std::max(0.0, seconds_per_row_token);
}

double StepCostTable::TargetSeconds(int rows, double context) const {
  if (target_.empty()) return 0.0;
  return target_.Seconds(rows) + slope_ * std::max(rows, 1) * std::max(0.0, context);
}

double StepCostTable::DraftSeconds(int sequences) const { return draft_.Seconds(sequences); }

double StepCostTable::StepSeconds(const Step& step) const {
  if (target_.empty() || step.rows <= 0) return 0.0;
  const int all = step.rows + std::max(0, step.chunk_rows);
  const double drafts =
      step.draft_forwards > 0 ? step.draft_forwards * DraftSeconds(std::max(1, step.drafting)) : 0;
  return drafts + std::max(0.0, step.other_draft_seconds) +
         target_.Seconds(all) * step.rows / all + slope_ * std::max(0.0, step.attended);
}

bool StepCostTable::PlainRefreshDue(int batch, int chunk_rows, int64_t every) const {
  if (batch < 2 || every <= 0 || target_.empty()) return false;
  return TargetAge(batch + std::max(0, chunk_rows)) > every &&
         (refreshed_at_ < 0 || target_.clock() - refreshed_at_ > every);
}

double StepCostTable::CatchUpSeconds(int64_t tokens) const {
  if (tokens <= 0 || catch_up_n_ <= 0) return 0.0;
  return std::max(DraftSeconds(1), catch_up_s_ / catch_up_n_ * static_cast<double>(tokens));
}

}  // namespace specloop
