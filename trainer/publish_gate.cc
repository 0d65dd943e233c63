#include "trainer/publish_gate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

namespace specloop {
namespace trainer {

namespace {

// Standard error of the mean of candidate - live over the domain's paired positions; 0 when
// the two estimates carry no paired values. With record boundaries (AlphaEstimate::
// record_ends, the same in both) it is the cluster-robust one, records as the clusters:
//   SE^2 = R / (R - 1) * sum over records r of (sum over r's positions of (d - mean))^2 / N^2
// for R records and N positions. Positions of one record share a prompt and a context, so
// their differences move together: on five records of 64 positions the per-position formula
// took a prompt's quirk for a domain's fall. One record alone: infinite (no judgement).
double PairedStandardError(const AlphaEstimate& live, const AlphaEstimate& candidate,
                           const std::string& domain) {
  auto l = live.logged_values.find(domain);
  auto c = candidate.logged_values.find(domain);
  if (l == live.logged_values.end() || c == candidate.logged_values.end() ||
      l->second.size() != c->second.size() || l->second.size() < 2) {
    return 0;
  }
  const size_t n = l->second.size();
  std::vector<double> d(n);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    d[i] = c->second[i] - l->second[i];
    sum += d[i];
  }
  const double mean = sum / n;
  // Records: the boundaries both estimates agree on, else one position each.
  std::vector<size_t> ends;
  auto le = live.record_ends.find(domain);
  auto ce = candidate.record_ends.find(domain);
  if (le != live.record_ends.end() && ce != candidate.record_ends.end() &&
      le->second == ce->second && !le->second.empty() && le->second.back() == n) {
    ends = le->second;
  } else {
    for (size_t i = 1; i <= n; ++i) ends.push_back(i);
  }
  const size_t records = ends.size();
  if (records < 2) return INFINITY;
  double sum_sq = 0;
  size_t begin = 0;
  for (size_t end : ends) {
    double s = 0;
    for (size_t i = begin; i < end; ++i) s += d[i] - mean;
    sum_sq += s * s;
    begin = end;
  }
  const double var = static_cast<double>(records) / (records - 1) * sum_sq / (double(n) * n);
  return std::sqrt(var);
}

// The traffic-weighted mean of the domains' logged alphas, over the domains with positions;
// false when traffic weighs none of them.
bool TrafficWeighted(const AlphaEstimate& e, const std::map<std::string, double>& traffic,
                     double* alpha) {
  double sum = 0, weight = 0;
  for (const auto& [domain, a] : e.domains) {
    auto w = traffic.find(domain);
    if (w == traffic.end() || !(w->second > 0) || a.positions == 0) continue;
    sum += w->second * a.logged;
    weight += w->second;
  }
  if (!(weight > 0)) return false;
  *alpha = sum / weight;
  return true;
}

}  // namespace

GateDecision DecideGate(const GateOptions& o, const AlphaEstimate& live,
                        const AlphaEstimate& candidate,
                        const std::map<std::string, double>& traffic,
                        const AlphaEstimate* best) {
  GateDecision d;
  char buf[256];
  double before = 0, after = 0;
  const bool weighted =
      TrafficWeighted(live, traffic, &before) && TrafficWeighted(candidate, traffic, &after);
  if (!weighted) {
    before = live.overall.logged;
    after = candidate.overall.logged;
  }
  const double gain = after - before;
  std::snprintf(buf, sizeof(buf),
                "overall alpha %.4f -> %.4f (%+.4f, need %+.4f; %s) on %lld positions", before,
                after, gain, o.min_gain, weighted ? "traffic-weighted" : "per position",
                static_cast<long long>(candidate.overall.positions));
  d.detail = buf;
  if (candidate.overall.positions < o.min_positions) {
    d.reason = "no_data";
    return d;
  }
  const double tolerance = std::max(o.max_domain_regression, o.max_regression_per_gain * gain);
  for (const auto& [domain, c] : candidate.domains) {
    auto it = live.domains.find(domain);
    if (it == live.domains.end() || c.positions < o.min_domain_positions) continue;
    const double drop = it->second.logged - c.logged;
    const double noise = o.regression_z * PairedStandardError(live, candidate, domain);
    if (drop > tolerance && drop > noise) {
      std::snprintf(buf, sizeof(buf),
                    "; domain %s falls %.4f -> %.4f (tolerance %.4f, %.1f standard errors %.4f)",
                    domain.c_str(), it->second.logged, c.logged, tolerance, o.regression_z,
                    noise);
      d.detail += buf;
      d.reason = "domain_regression";
      return d;
    }
  }
  if (best != nullptr && o.max_fall_below_best >= 0) {
    for (const auto& [domain, c] : candidate.domains) {
      auto it = best->domains.find(domain);
      if (it == best->domains.end() || c.positions < o.min_domain_positions) continue;
      const double fall = it->second.logged - c.logged;
      const double noise = o.regression_z * PairedStandardError(*best, candidate, domain);
      if (fall > o.max_fall_below_best && fall > noise) {
        std::snprintf(buf, sizeof(buf),
                      "; domain %s %.4f, its best %.4f (allowance %.4f, %.1f standard errors "
                      "%.4f)",
                      domain.c_str(), c.logged, it->second.logged, o.max_fall_below_best,
                      o.regression_z, noise);
        d.detail += buf;
        d.below_best.push_back(domain);
      }
    }
    if (!d.below_best.empty()) {
      d.reason = "below_best";
      return d;
    }
  }
  if (gain < o.min_gain) {
    d.reason = "no_gain";
    return d;
  }
  d.publish = true;
  d.reason = "ok";
  return d;
}

double ExpectedSpeedup(double alpha, int k, double draft_cost, double verify_cost) {
  alpha = std::clamp(alpha, 0.0, 1.0);
  const double tokens =
      alpha >= 1.0 ? k + 1.0 : (1.0 - std::pow(alpha, k + 1)) / (1.0 - alpha);
  return tokens / (1.0 + k * (draft_cost + verify_cost));
}

GateDecision DecideFirstDraft(const GateOptions& o, const AlphaEstimate& candidate,
                              const std::map<std::string, double>& traffic) {
  GateDecision d;
  double alpha = 0;
  const bool weighted = TrafficWeighted(candidate, traffic, &alpha);
  if (!weighted) alpha = candidate.overall.logged;
  const double draft_cost = o.draft_cost < 0 ? kHeadDraftCost : o.draft_cost;
  double best = 0;
  int best_k = 0;
  for (int k = 1; k <= std::max(1, o.max_k); ++k) {
    const double s = ExpectedSpeedup(alpha, k, draft_cost, o.verify_cost);
    if (s > best) {
      best = s;
      best_k = k;
    }
  }
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "first draft: overall alpha %.4f (%s) on %lld positions promises %.3fx plain "
                "decoding at k = %d (need %.3fx; draft cost %.3f, verify cost %.3f)",
                alpha, weighted ? "traffic-weighted" : "per position",
                static_cast<long long>(candidate.overall.positions), best, best_k,
                o.min_speedup, draft_cost, o.verify_cost);
  d.detail = buf;
  if (candidate.overall.positions < o.min_positions) {
    d.reason = "no_data";
  } else if (best < o.min_speedup) {
    d.reason = "slower_than_plain";
  } else {
    d.publish = true;
    d.reason = "ok";
  }
  return d;
}

}  // namespace trainer
}  // namespace specloop
