// The domain a logged record carries: the serving label (ServingMetrics::DomainLabel), so that
// whatever domains clients send, what the trainer keeps per domain (its replay weights, floors,
// reserve and held-out set) is bounded by --max-domains + 1 names per worker.
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/serve/buffer_records.h"
#include "tests/serve/serving_stack.h"
#include "tests/serve/test_util.h"

namespace specloop {
namespace {

TEST(RecordDomain, IsTheServingLabelFoldedBeyondMaxDomains) {
  serve_test::TempDir dir;
  const std::string buffer = dir.Sub("buffer");
  const std::vector<std::string> sent = {"prose", "python", "c", "legal", "docs", "prose"};
  {
    serve_test::StackOptions o;
    o.target_dir = serve_test::TargetDir();
    o.max_domains = 2;
    o.buffer_dir = buffer;
    serve_test::ServingStack server(o);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    for (const std::string& domain : sent) {
      nlohmann::json out;
      ASSERT_EQ(server.Post("/v1/completions",
                            {{"prompt", "Once upon a time"}, {"max_tokens", 4}, {"domain", domain}},
                            &out),
                200)
          << out.dump();
    }
    server.Shutdown();
  }
  std::multiset<std::string> logged;
  for (const Record& r : serve_test::ReadRecords(buffer)) logged.insert(r.domain);
  // The first two domains keep their names; the three after them are logged as "other".
  EXPECT_EQ(logged, (std::multiset<std::string>{"prose", "prose", "python", "other", "other",
                                                "other"}));
}

}  // namespace
}  // namespace specloop
