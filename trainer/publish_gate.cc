#include "trainer/publish_gate.h"

#include <cstdio>

namespace specloop {
namespace trainer {

GateDecision DecideGate(const GateOptions& o, const AlphaEstimate& live,
                        const AlphaEstimate& candidate) {
  GateDecision d;
  char buf[256];
  const double gain = candidate.overall.logged - live.overall.logged;
  std::snprintf(buf, sizeof(buf), "overall alpha %.4f -> %.4f (%+.4f, need %+.4f) on %lld positions",
                live.overall.logged, candidate.overall.logged, gain, o.min_gain,
                static_cast<long long>(candidate.overall.positions));
  d.detail = buf;
  if (candidate.overall.positions < o.min_positions) {
    d.reason = "no_data";
    return d;
  }
  for (const auto& [domain, c] : candidate.domains) {
    auto it = live.domains.find(domain);
    if (it == live.domains.end() || c.positions < o.min_domain_positions) continue;
    const double drop = it->second.logged - c.logged;
    if (drop > o.max_domain_regression) {
      std::snprintf(buf, sizeof(buf), "; domain %s falls %.4f -> %.4f (tolerance %.4f)",
                    domain.c_str(), it->second.logged, c.logged, o.max_domain_regression);
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
