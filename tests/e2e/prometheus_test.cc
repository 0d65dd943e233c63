// A real Prometheus (Debian package) on loopback, loaded with deploy/prometheus.yml (ports
// rewritten) and deploy/alerts.yml, scrapes `specloop up`; after traffic in two domains the
// acceptance rate per domain is read back through Prometheus's HTTP query API and matches
// what the server exports.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>

#include "tests/e2e/e2e_util.h"

namespace specloop {
namespace e2e {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void ReplaceAll(std::string* s, const std::string& from, const std::string& to) {
  for (size_t at = 0; (at = s->find(from, at)) != std::string::npos; at += to.size()) {
    s->replace(at, from.size(), to);
  }
}

// Instant query; returns the result vector ([] on any failure).
nlohmann::json Query(int port, const std::string& promql) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(10);
  auto res = cli.Get("/api/v1/query", httplib::Params{{"query", promql}}, httplib::Headers{});
  if (!res || res->status != 200) return nlohmann::json::array();
  const nlohmann::json j = nlohmann::json::parse(res->body, nullptr, false);
  if (j.is_discarded() || j.value("status", "") != "success") return nlohmann::json::array();
  return j["data"]["result"];
}

// Polls `promql` until it returns exactly one series with value `want`, for up to `seconds`
// (each target's first scrape lands somewhere within the first scrape interval).
bool WaitForSeries(int port, const std::string& promql, const std::string& want, double seconds) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < deadline) {
    const nlohmann::json r = Query(port, promql);
    if (r.size() == 1 && r[0]["value"][1] == want) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  return false;
}

// domain -> value of specloop_acceptance_rate{window="long"} in the server's own exposition.
std::map<std::string, double> ServerAlpha(int port) {
  std::string body;
  std::map<std::string, double> out;
  if (HttpGet(port, "/metrics", &body) != 200) return out;
  const std::regex r("specloop_acceptance_rate\\{domain=\"([a-z]+)\",window=\"long\"\\} (\\S+)");
  for (auto it = std::sregex_iterator(body.begin(), body.end(), r); it != std::sregex_iterator();
       ++it) {
    out[(*it)[1].str()] = std::stod((*it)[2].str());
  }
  return out;
}

TEST(PrometheusTest, ScrapesSpecloopUpAndAnswersAlphaPerDomain) {
  TempDir tmp("specloop-prom");
  const UpPorts ports;
  // A fixed speculation length: this test reads acceptance back through Prometheus, so drafts
  // must be proposed; adaptive k may rightly turn speculation off on a loaded machine.
  std::vector<std::string> cmd = UpCommand(tmp.Sub("data"), ports);
  cmd.push_back("--serve-arg=--k=4");
  Child up(cmd);
  ASSERT_FALSE(up.WaitForLine("train is ready", 90).empty()) << up.Output();
  ASSERT_TRUE(WaitHealthy(ports.serve, "/health", 30));

  // deploy/prometheus.yml with this run's ports, a 2 s scrape interval, absolute rule paths.
  std::string config = ReadFile(SPECLOOP_SOURCE_DIR "/deploy/prometheus.yml");
  ASSERT_NE(config.find("127.0.0.1:8000"), std::string::npos);
  ASSERT_NE(config.find("127.0.0.1:9091"), std::string::npos);
  ReplaceAll(&config, "127.0.0.1:8000", "127.0.0.1:" + std::to_string(ports.serve));
  ReplaceAll(&config, "127.0.0.1:9091", "127.0.0.1:" + std::to_string(ports.trainer_metrics));
  ReplaceAll(&config, "interval: 5s", "interval: 2s");  // the scrape timeout too: 2 cores
  ReplaceAll(&config, "- alerts.yml", "- " SPECLOOP_SOURCE_DIR "/deploy/alerts.yml");
  std::ofstream(tmp.Sub("prometheus.yml")) << config;
  const int prom_port = FreePort();
  Child prom({"prometheus", "--config.file=" + tmp.Sub("prometheus.yml"),
              "--storage.tsdb.path=" + tmp.Sub("tsdb"),
              "--web.listen-address=127.0.0.1:" + std::to_string(prom_port)},
             /*echo=*/false);
  ASSERT_TRUE(WaitHealthy(prom_port, "/-/ready", 60)) << prom.Output();

  // Traffic in two domains.
  for (const std::string domain : {"prose", "python"}) {
    for (const std::string& p : PromptsJson(domain, 3)) {
      const std::string req = "{\"prompt\":" + p + ",\"max_tokens\":24,\"domain\":\"" + domain +
                              "\"}";
      std::string body;
      ASSERT_EQ(HttpPost(ports.serve, "/v1/completions", req, &body), 200) << body;
    }
  }
  const std::map<std::string, double> server = ServerAlpha(ports.serve);
  ASSERT_TRUE(server.count("prose") && server.count("python")) << "server exports no alpha";

  // Read alpha per domain back through Prometheus once a scrape after the traffic landed.
  std::map<std::string, double> scraped;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < deadline) {
    scraped.clear();
    for (const auto& s : Query(prom_port, "specloop_acceptance_rate{window=\"long\"}")) {
      scraped[s["metric"].value("domain", "")] = std::stod(s["value"][1].get<std::string>());
    }
    if (scraped.count("prose") && scraped.count("python") &&
        std::abs(scraped["prose"] - server.at("prose")) < 1e-9 &&
        std::abs(scraped["python"] - server.at("python")) < 1e-9) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  ASSERT_TRUE(scraped.count("prose") && scraped.count("python"))
      << "targets: " << Query(prom_port, "up").dump() << "\n"
      << "last scrape errors: " << Query(prom_port, "scrape_duration_seconds").dump();
  EXPECT_NEAR(scraped["prose"], server.at("prose"), 1e-9);
  EXPECT_NEAR(scraped["python"], server.at("python"), 1e-9);
  for (const auto& [domain, alpha] : scraped) {
    EXPECT_GE(alpha, 0.0) << domain;
    EXPECT_LE(alpha, 1.0) << domain;
  }
  EXPECT_GT(scraped["prose"], 0.0) << "the draft was accepted sometimes on prose";

  // Both jobs are up, the trainer's metrics arrive, and the alert rules are loaded.
  for (const char* job : {"specloop-serve", "specloop-train"}) {
    const std::string q = std::string("up{job=\"") + job + "\"}";
    EXPECT_TRUE(WaitForSeries(prom_port, q, "1", 30)) << q << "\n" << Query(prom_port, q).dump();
  }
  EXPECT_TRUE(WaitForSeries(prom_port, "specloop_train_draft_version", "0", 30));
  std::string rules;
  ASSERT_EQ(HttpGet(prom_port, "/api/v1/rules", &rules), 200);
  EXPECT_NE(rules.find("SpecloopTrainerStalled"), std::string::npos);
  EXPECT_NE(rules.find("SpecloopAcceptanceDropping"), std::string::npos);

  prom.Signal(SIGTERM);
  EXPECT_NE(prom.Wait(30), -1);
  up.Signal(SIGTERM);
  const int st = up.Wait(60);
  ASSERT_NE(st, -1) << up.Output();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << up.Output();
}

}  // namespace
}  // namespace e2e
}  // namespace specloop
