// deploy/: the Grafana dashboard, the alert rules and the systemd units refer only to things
// that exist (metric names the code exports, flags the binary accepts), and the dashboard has
// the panels issue 7 asks for. promtool checks the Prometheus files themselves
// (tests/observe/CMakeLists.txt).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace {

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Deploy(const std::string& name) { return Read(SPECLOOP_SOURCE_DIR "/deploy/" + name); }

std::set<std::string> Matches(const std::string& text, const std::string& re, int group) {
  std::set<std::string> out;
  const std::regex r(re);
  for (auto it = std::sregex_iterator(text.begin(), text.end(), r); it != std::sregex_iterator();
       ++it) {
    out.insert((*it)[group].str());
  }
  return out;
}

// Metric families the code registers (quoted names in the metric definitions).
std::set<std::string> ExportedFamilies() {
  const std::string src = Read(SPECLOOP_SOURCE_DIR "/serve/serving_metrics.cc") +
                          Read(SPECLOOP_SOURCE_DIR "/trainer/trainer_metrics.cc") +
                          Read(SPECLOOP_SOURCE_DIR "/common/observe/process_metrics.cc") +
                          Read(SPECLOOP_SOURCE_DIR "/fleet/front_proxy.cc") +
                          Read(SPECLOOP_SOURCE_DIR "/fleet/stream_metrics.cc");
  return Matches(src, "\"((specloop|process)_[a-z0-9_]+)\"", 1);
}

// Every specloop_* name in `text` is an exported family, or a histogram's _bucket/_sum/_count.
void ExpectKnownMetrics(const std::string& text, const std::string& what) {
  const std::set<std::string> families = ExportedFamilies();
  ASSERT_GT(families.size(), 20u);
  const std::set<std::string> used = Matches(text, "((specloop|process)_[a-z0-9_]+)", 1);
  EXPECT_GT(used.size(), 5u) << what;
  for (const std::string& name : used) {
    std::string base = name;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string s = suffix;
      if (!families.count(base) && base.size() > s.size() &&
          base.compare(base.size() - s.size(), s.size(), s) == 0) {
        base = base.substr(0, base.size() - s.size());
      }
    }
    EXPECT_TRUE(families.count(base)) << what << " uses " << name << ", which nothing exports";
  }
}

TEST(DeployTest, DashboardHasTheAskedPanelsOnRealMetrics) {
  nlohmann::json dash;
  ASSERT_NO_THROW(dash = nlohmann::json::parse(Deploy("grafana-dashboard.json")));
  std::string exprs, titles;
  for (const auto& p : dash.at("panels")) {
    titles += p.at("title").get<std::string>() + "\n";
    ASSERT_FALSE(p.at("targets").empty()) << p.at("title");
    for (const auto& t : p.at("targets")) {
      const std::string e = t.at("expr").get<std::string>();
      EXPECT_FALSE(e.empty());
      exprs += e + "\n";
    }
  }
  for (const auto& a : dash.at("annotations").at("list")) exprs += a.at("expr").get<std::string>();
  ExpectKnownMetrics(exprs, "grafana-dashboard.json");
  for (const char* want : {"alpha", "alpha*", "mean acceptance length", "tokens/s",
                           "Tokens per target step", "Speculation length",
                           "Draft version", "Trainer loss", "estimated alpha"}) {
    EXPECT_NE(titles.find(want), std::string::npos) << "no panel titled *" << want << "*";
  }
  // Draft version changes are marked on the time axis.
  EXPECT_NE(dash.dump().find("changes(specloop_draft_version"), std::string::npos);
}

TEST(DeployTest, AlertRulesCoverTheIssueAndUseRealMetrics) {
  const std::string rules = Deploy("alerts.yml");
  ExpectKnownMetrics(rules, "alerts.yml");
  for (const char* alert : {"SpecloopAcceptanceDropping", "SpecloopAcceptanceDriftDown",
                            "SpecloopDraftSwapFailures", "SpecloopBufferDrops",
                            "SpecloopTrainerStalled", "SpecloopProxyFailing",
                            "SpecloopStreamIngestLagging", "SpecloopShipperLagging",
                            "SpecloopStreamDropping"}) {
    EXPECT_NE(rules.find("alert: " + std::string(alert)), std::string::npos) << alert;
    // ... and each one has a promtool unit test.
    EXPECT_NE(Deploy("alerts_test.yml").find("alertname: " + std::string(alert)),
              std::string::npos)
        << alert;
  }
}

// The flags in a unit's ExecStart are flags `specloop SUBCOMMAND --help` lists.
void ExpectUnitFlagsExist(const std::string& unit, const std::string& subcommand) {
  const std::string text = Deploy("systemd/" + unit);
  ASSERT_NE(text.find("[Service]"), std::string::npos) << unit;
  ASSERT_NE(text.find("ExecStart=/usr/local/bin/specloop " + subcommand + " "), std::string::npos)
      << unit;
  const size_t start = text.find("ExecStart=");
  size_t end = start;
  while ((end = text.find('\n', end + 1)) != std::string::npos && text[end - 1] == '\\') {
  }
  const std::set<std::string> flags =
      Matches(text.substr(start, end - start), "(--[a-z][a-z0-9-]+)", 1);
  ASSERT_GT(flags.size(), 3u) << unit;
  std::string help;
  FILE* f = popen((std::string(SPECLOOP_BINARY) + " " + subcommand + " --help").c_str(), "r");
  ASSERT_NE(f, nullptr);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) help.append(buf, n);
  pclose(f);
  for (const std::string& flag : flags) {
    const bool listed =
        help.find(flag + " ") != std::string::npos || help.find(flag + ",") != std::string::npos;
    EXPECT_TRUE(listed) << unit << ": " << flag << " is not a flag of specloop " << subcommand;
  }
  // Every ${VAR} the unit uses is set in the example configuration.
  const std::string env = Deploy("specloop.env.example");
  for (const std::string& var : Matches(text, "\\$\\{?(SPECLOOP_[A-Z_]+)", 1)) {
    EXPECT_NE(env.find("\n" + var + "="), std::string::npos) << unit << ": " << var;
  }
}

TEST(DeployTest, SystemdUnitsUseRealFlagsAndConfiguredVariables) {
  ExpectUnitFlagsExist("specloop-serve.service", "serve");
  ExpectUnitFlagsExist("specloop-train.service", "train");
  ExpectUnitFlagsExist("specloop-up.service", "up");
}

}  // namespace
