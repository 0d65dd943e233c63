// The exported acceptance rate does not depend on k: `specloop serve` answers the same prompts
// at --k 1 and at --k 4, and specloop_acceptance_rate per domain reads the same within 0.05
// (accepted / drafted, the old gauge, read 0.66 against 0.54 on held-out legal prompts), with no
// drift event. Beside it, alpha* (specloop_optimal_acceptance_rate): under greedy decoding the
// optimal verifier accepts exactly what the chain verifier accepts, so the two gauges agree to
// rounding; specloop_mean_acceptance_length grows with k.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>

#include "tests/e2e/e2e_util.h"

namespace specloop {
namespace e2e {
namespace {

struct Reading {
  std::map<std::string, double> alpha, optimal, length;
  double drift_events = 0, drafted = 0, accepted = 0;
};

// domain -> value for every sample of `family{domain="...",...}` whose line contains `extra`.
std::map<std::string, double> ByDomain(const std::string& text, const std::string& family,
                                       const std::string& extra = "") {
  std::map<std::string, double> out;
  const std::regex r(family + "\\{domain=\"([a-z]+)\"([^}]*)\\} (\\S+)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), r); it != std::sregex_iterator();
       ++it) {
    if ((*it)[2].str().find(extra) == std::string::npos) continue;
    out[(*it)[1].str()] = std::stod((*it)[3].str());
  }
  return out;
}

// Serves the first `n` prompts of each domain, greedy, one request at a time, at a fixed k.
Reading ServeAt(int k, const std::vector<std::string>& domains, size_t n) {
  const int port = FreePort();
  Child serve({SPECLOOP_BINARY, "serve", "--target", TargetDir(), "--draft", DraftDir(),
               "--port", std::to_string(port), "--no-log", "--k", std::to_string(k)});
  Reading r;
  if (serve.WaitForLine("listening on", 60).empty()) {
    ADD_FAILURE() << serve.Output();
    return r;
  }
  for (const std::string& domain : domains) {
    for (const std::string& p : PromptsJson(domain, n)) {
      const std::string req = "{\"prompt\":" + p + ",\"max_tokens\":64,\"temperature\":0," +
                              "\"domain\":\"" + domain + "\"}";
      std::string body;
      EXPECT_EQ(HttpPost(port, "/v1/completions", req, &body), 200) << body;
    }
  }
  std::string text;
  EXPECT_EQ(HttpGet(port, "/metrics", &text), 200);
  r.alpha = ByDomain(text, "specloop_acceptance_rate", "window=\"long\"");
  r.optimal = ByDomain(text, "specloop_optimal_acceptance_rate");
  r.length = ByDomain(text, "specloop_mean_acceptance_length");
  r.drift_events = MetricValue(text, "specloop_acceptance_drift_events_total");
  r.drafted = MetricValue(text, "specloop_draft_tokens_total");
  r.accepted = MetricValue(text, "specloop_accepted_tokens_total");
  return r;
}

TEST(AcceptanceTest, TheExportedRateDoesNotDependOnK) {
  const std::vector<std::string> domains = {"legal", "python"};
  const Reading k1 = ServeAt(1, domains, 6);
  const Reading k4 = ServeAt(4, domains, 6);
  for (const std::string& d : domains) {
    ASSERT_TRUE(k1.alpha.count(d) && k4.alpha.count(d)) << d;
    std::cout << d << ": alpha k=1 " << k1.alpha.at(d) << ", k=4 " << k4.alpha.at(d)
              << "; mean acceptance length " << k1.length.at(d) << " / " << k4.length.at(d)
              << "\n";
    EXPECT_NEAR(k1.alpha.at(d), k4.alpha.at(d), 0.05) << d;
    // Greedy: alpha* is what the verifier accepted, position for position.
    ASSERT_TRUE(k1.optimal.count(d) && k4.optimal.count(d)) << d;
    EXPECT_NEAR(k1.optimal.at(d), k1.alpha.at(d), 1e-6) << d;
    EXPECT_NEAR(k4.optimal.at(d), k4.alpha.at(d), 1e-6) << d;
    EXPECT_GT(k4.length.at(d), k1.length.at(d)) << d;
    // At k = 1 a step tests one token, so 1 + accepted per step is 1 + alpha.
    EXPECT_NEAR(k1.length.at(d), 1 + k1.alpha.at(d), 1e-6) << d;
  }
  EXPECT_EQ(k1.drift_events, 0);
  EXPECT_EQ(k4.drift_events, 0);
  // Companion: accepted / drafted over the same traffic moves with k by more than the bound.
  const double old1 = k1.accepted / k1.drafted, old4 = k4.accepted / k4.drafted;
  std::cout << "accepted / drafted: k=1 " << old1 << ", k=4 " << old4 << "\n";
  EXPECT_GT(old1 - old4, 0.05);
}

}  // namespace
}  // namespace e2e
}  // namespace specloop
