#include "tests/spec/stat_util.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

namespace specloop {
namespace spec_test {
namespace {

// Regularized lower incomplete gamma P(a, x) by its power series (good for x < a + 1).
double GammaPSeries(double a, double x) {
  double term = 1.0 / a, sum = term;
  for (int n = 1; n < 10000; ++n) {
    term *= x / (a + n);
    sum += term;
    if (std::fabs(term) < std::fabs(sum) * 1e-16) break;
  }
  return sum * std::exp(-x + a * std::log(x) - std::lgamma(a));
}

// Regularized upper incomplete gamma Q(a, x) by its continued fraction, evaluated with the
// modified Lentz method (good for x >= a + 1).
double GammaQFraction(double a, double x) {
  const double tiny = 1e-300;
  double b = x + 1.0 - a, c = 1.0 / tiny, d = 1.0 / b, h = d;
  for (int i = 1; i < 10000; ++i) {
    const double an = -i * (i - a);
    b += 2.0;
    d = an * d + b;
    if (std::fabs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1.0 / d;
    const double delta = d * c;
    h *= delta;
    if (std::fabs(delta - 1.0) < 1e-16) break;
  }
  return h * std::exp(-x + a * std::log(x) - std::lgamma(a));
}

}  // namespace

double ChiSquareSurvival(double x, int df) {
  if (df <= 0) return 1.0;
  if (!(x > 0.0)) return 1.0;
  const double a = 0.5 * df, y = 0.5 * x;
  if (y < a + 1.0) return std::max(0.0, 1.0 - GammaPSeries(a, y));
  return GammaQFraction(a, y);
}

std::string GofResult::ToString() const {
  std::ostringstream os;
  os << "G=" << statistic << " df=" << df << " p=" << p_value
     << (impossible ? " (observed a zero-probability cell)" : "");
  return os.str();
}

GofResult GTest(const std::vector<int64_t>& observed, const std::vector<double>& probs,
                double min_expected) {
  GofResult r;
  const double total_p = std::accumulate(probs.begin(), probs.end(), 0.0);
  const int64_t n = std::accumulate(observed.begin(), observed.end(), int64_t{0});
  struct Cell {
    double expected;
    int64_t observed;
  };
  std::vector<Cell> cells;
  for (size_t i = 0; i < probs.size(); ++i) {
    const double pi = probs[i] / total_p;
    if (pi <= 0.0) {
      if (observed[i] > 0) r.impossible = true;
      continue;
    }
    cells.push_back({pi * n, observed[i]});
  }
  if (r.impossible) {
    r.p_value = 0.0;
    return r;
  }
  std::sort(cells.begin(), cells.end(),
            [](const Cell& a, const Cell& b) { return a.expected < b.expected; });
  // Pool the small cells, smallest first, into pools of expected count >= min_expected; a
  // leftover pool that falls short joins the next cell (or the last pool).
  std::vector<Cell> pooled;
  Cell pool{0.0, 0};
  size_t i = 0;
  for (; i < cells.size() && cells[i].expected < min_expected; ++i) {
    pool.expected += cells[i].expected;
    pool.observed += cells[i].observed;
    if (pool.expected >= min_expected) {
      pooled.push_back(pool);
      pool = Cell{0.0, 0};
    }
  }
  for (; i < cells.size(); ++i) pooled.push_back(cells[i]);
  if (pool.expected > 0.0) {
    if (pooled.empty()) {
      pooled.push_back(pool);
    } else {
      // Into the first cell: a full pool, or else the smallest large cell.
      Cell& into = pooled.front();
      into.expected += pool.expected;
      into.observed += pool.observed;
    }
  }
  r.df = static_cast<int>(pooled.size()) - 1;
  if (r.df < 1) return r;
  double g = 0.0;
  for (const Cell& c : pooled) {
    if (c.observed > 0) g += c.observed * std::log(c.observed / c.expected);
  }
  r.statistic = 2.0 * g;
  r.p_value = ChiSquareSurvival(r.statistic, r.df);
  return r;
}

}  // namespace spec_test
}  // namespace specloop
