#include "trainer/publish_gate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace specloop {
namespace trainer {

namespace {

// Standard error of the mean of candidate - live over the domain's paired positions; 0 when
// the two estimates carry no paired values.
double PairedStandardError(const AlphaEstimate& live, const AlphaEstimate& candidate,
                           const std::string& domain) {
  auto l = live.logged_values.find(domain);
  auto c = candidate.logged_values.find(domain);
  if (l == live.logged_values.end() || c == candidate.logged_values.end() ||
      l->second.size() != c->second.size() || l->second.size() < 2) {
    return 0;
  }
  const size_t n = l->second.size();
  double sum = 0, sum_sq = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = c->second[i] - l->second[i];
    sum += d;
    sum_sq += d * d;
  }
  const double mean = sum / n;
  const double var = std::max(0.0, (sum_sq - n * mean * mean) / (n - 1));
  return std::sqrt(var / n);
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
                        const std::map<std::string, double>& traffic) {
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
  if (gain < o.min_gain) {
    d.reason = "no_gain";
    return d;
  }
  d.publish = true;
  d.reason = "ok";
  return d;
}

}  // namespace trainer
}  // namespace specloop
