// The domain-shift benchmark's short mode (bench/faster_over_time.cc), as the issue asks of the
// test suite: over the same trace (prose+docs, then python) the online arm (trainer running)
// ends the python phase with a higher acceptance than the static arm, no request fails in
// either arm, the output has the documented lines, and the plot is drawn. The trainer runs at
// its defaults, gate included (its replay floor per domain replays docs while python is learnt:
// trainer/README.md, "No forgetting").
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "tests/e2e/e2e_util.h"

namespace specloop {
namespace {

using nlohmann::json;

TEST(FasterOverTime, OnlineArmLearnsTheShiftedDomain) {
  e2e::TempDir out("specloop-fot");
  e2e::Child bench({SPECLOOP_FASTER_OVER_TIME, "--short", "--out", out.path()});
  const int status = bench.Wait(840);
  ASSERT_NE(status, -1) << "the short mode ran past 14 minutes";
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << bench.Output();

  std::ifstream in(out.Sub("faster_over_time.jsonl"));
  std::map<std::string, double> summary;  // "name/arm-or-domain" -> value
  std::set<std::string> window_arms;
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line);
    if (j.contains("arm")) {
      for (const char* key : {"window", "domain", "requests", "alpha", "tokens_per_step",
                              "tokens_per_second", "draft_version"}) {
        EXPECT_TRUE(j.contains(key)) << key << " missing in " << line;
      }
      window_arms.insert(j["arm"].get<std::string>());
      continue;
    }
    const json& p = j["params"];
    const std::string key = j["name"].get<std::string>() + "/" +
                            (p.contains("domain") ? p["domain"].get<std::string>()
                                                  : p.value("arm", std::string()));
    summary[key] = j["value"].is_null() ? NAN : j["value"].get<double>();
  }
  EXPECT_EQ(window_arms, (std::set<std::string>{"static", "online"}));
  EXPECT_EQ(summary["faster_over_time.failed_requests/static"], 0);
  EXPECT_EQ(summary["faster_over_time.failed_requests/online"], 0);
  EXPECT_GE(summary["faster_over_time.versions_published/online"], 1);
  const double online = summary["faster_over_time.phase_end_alpha_online/python"];
  const double fixed = summary["faster_over_time.phase_end_alpha_static/python"];
  EXPECT_GT(online, fixed) << bench.Output();
  EXPECT_GT(std::filesystem::file_size(out.Sub("faster_over_time.png")), 10000u)
      << "gnuplot (gnuplot-nox) drew no plot";
}

}  // namespace
}  // namespace specloop
