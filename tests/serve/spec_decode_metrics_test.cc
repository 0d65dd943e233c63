// Per-request speculative metrics as vLLM reports them (serve/spec_decode_metrics.h): the
// counting rules by hand, then the whole serving stack over loopback HTTP, each response's
// `metrics.speculative_decoding` block checked step by step against the step log the same
// server wrote: its replay-buffer record of the request (SampleLogger, one SpecStep per
// verification step: the draft tokens and how many were accepted), and against the
// response's own `speculative` totals (the decoder's SpeculativeStats).
#include "serve/spec_decode_metrics.h"

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/serve/buffer_records.h"
#include "tests/serve/serving_stack.h"
#include "tests/serve/test_util.h"

namespace specloop {
namespace {

using json = nlohmann::json;
using serve_test::TempDir;

TEST(SpecDecodeMetrics, CountsOnlyStepsWithADraftAsVllmDoes) {
  RequestSpecDecodeMetrics m;
  m.Begin(SpecMetricsLevel::kDetailed, 3);
  m.Observe(3, 2);
  m.Observe(0, 0);  // plain decoding: not a speculative step
  m.Observe(3, 0);
  m.Observe(2, 2);  // a block cut short (near max_tokens)
  EXPECT_EQ(m.histogram, (std::vector<int64_t>{1, 0, 2, 0}));
  EXPECT_EQ(m.num_spec_steps(), 3);
  EXPECT_EQ(m.num_draft_tokens, 8);
  EXPECT_EQ(m.num_accepted_draft_tokens, 4);
  EXPECT_DOUBLE_EQ(m.mean_acceptance_length(), 1.0 + 4.0 / 3.0);
  EXPECT_DOUBLE_EQ(m.draft_acceptance_rate(), 4.0 / 8.0);
  EXPECT_EQ(m.per_step_accepted, (std::vector<int>{2, 0, 2}));
  EXPECT_EQ(m.per_step_drafted, (std::vector<int>{3, 3, 2}));

  RequestSpecDecodeMetrics summary;
  summary.Begin(SpecMetricsLevel::kSummary, 2);
  summary.Observe(5, 2);  // a tree: 5 nodes drafted, a path of 2 accepted
  EXPECT_EQ(summary.histogram, (std::vector<int64_t>{0, 0, 1}));
  EXPECT_TRUE(summary.per_step_accepted.empty());  // summary keeps no per-step arrays

  RequestSpecDecodeMetrics none;  // vLLM's values for a request without a speculative step
  none.Begin(SpecMetricsLevel::kSummary, 4);
  EXPECT_EQ(none.num_spec_steps(), 0);
  EXPECT_DOUBLE_EQ(none.mean_acceptance_length(), 1.0);
  EXPECT_DOUBLE_EQ(none.draft_acceptance_rate(), 0.0);

  RequestSpecDecodeMetrics off;  // not collected: Observe is a no-op
  off.Observe(3, 1);
  EXPECT_EQ(off.num_draft_tokens, 0);
}

TEST(SpecDecodeMetrics, ParsesTheThreeLevelsAndNothingElse) {
  SpecMetricsLevel level = SpecMetricsLevel::kSummary;
  EXPECT_TRUE(ParseSpecMetricsLevel("none", &level));
  EXPECT_EQ(level, SpecMetricsLevel::kNone);
  EXPECT_TRUE(ParseSpecMetricsLevel("detailed", &level));
  EXPECT_EQ(level, SpecMetricsLevel::kDetailed);
  for (const char* bad : {"", "Summary", "full", "summary ", "1"}) {
    EXPECT_FALSE(ParseSpecMetricsLevel(bad, &level)) << bad;
    EXPECT_EQ(level, SpecMetricsLevel::kDetailed) << "left untouched";
  }
}

// target-6m with draft-mix-1m, logging every request into a replay buffer.
serve_test::StackOptions Stack(const std::string& buffer_dir, int k, SpecMetricsLevel level,
                               std::vector<int> tree_branching = {}) {
  serve_test::StackOptions o;
  o.target_dir = serve_test::TargetDir();
  o.draft_dir = serve_test::DraftDir();
  o.k = k;
  o.max_batch = 4;
  o.per_request_spec_metrics = level;
  o.tree_branching = std::move(tree_branching);
  o.buffer_dir = buffer_dir;
  return o;
}

// POSTs `body`, expecting 200; returns the response (or, streaming, the last chunk) and a
// stream's chunks.
json Post(const serve_test::ServingStack& server, const std::string& path, const json& body,
          std::vector<json>* chunks) {
  json out;
  EXPECT_EQ(server.Post(path, body, &out, chunks), 200) << out.dump();
  return out;
}

// The block's own arithmetic: vLLM's definitions, as its test of PR 48915 checks them.
void ExpectConsistent(const json& m, bool detailed) {
  const std::vector<int64_t> histogram = m.at("acceptance_histogram");
  int64_t steps = 0, accepted = 0;
  for (size_t j = 0; j < histogram.size(); ++j) {
    steps += histogram[j];
    accepted += static_cast<int64_t>(j) * histogram[j];
  }
  EXPECT_EQ(histogram.size(), m.at("num_spec_tokens").get<size_t>() + 1);
  EXPECT_EQ(m.at("num_spec_steps").get<int64_t>(), steps);
  EXPECT_EQ(m.at("num_accepted_draft_tokens").get<int64_t>(), accepted);
  const double drafted = m.at("num_draft_tokens").get<double>();
  EXPECT_DOUBLE_EQ(m.at("mean_acceptance_length").get<double>(),
                   steps ? 1.0 + double(accepted) / steps : 1.0);
  EXPECT_DOUBLE_EQ(m.at("draft_acceptance_rate").get<double>(),
                   drafted > 0 ? accepted / drafted : 0.0);
  EXPECT_EQ(m.contains("per_step_accepted"), detailed);
  EXPECT_EQ(m.contains("per_step_drafted"), detailed);
}

// The record's speculative steps (prompt rows and steps without a draft left out), in order:
// {drafted, accepted} each.
std::vector<std::pair<int, int>> LoggedSteps(const Record& r) {
  std::vector<std::pair<int, int>> steps;
  for (const SpecStep& s : r.steps) {
    if (s.start_pos < r.prompt_len || s.draft_tokens.empty()) continue;
    steps.emplace_back(static_cast<int>(s.draft_tokens.size()), static_cast<int>(s.num_accepted));
  }
  return steps;
}

// Checks each response's block against the request's record: the per-step arrays step by
// step (detailed), else the totals and the histogram; and against its `speculative` totals.
// Returns the speculative steps seen in all.
int64_t ExpectBlocksMatchTheStepLog(const std::map<std::string, json>& responses,
                                    const std::vector<Record>& records, bool detailed) {
  EXPECT_EQ(records.size(), responses.size());
  int64_t total_steps = 0;
  for (const Record& r : records) {
    auto it = responses.find(r.request_id);
    if (it == responses.end()) {
      ADD_FAILURE() << "a record of no response: " << r.request_id;
      continue;
    }
    SCOPED_TRACE(r.request_id);
    const json& body = it->second;
    const json& m = body.at("metrics").at("speculative_decoding");
    ExpectConsistent(m, detailed);
    const std::vector<std::pair<int, int>> logged = LoggedSteps(r);
    std::vector<int64_t> histogram(m.at("acceptance_histogram").size(), 0);
    int64_t drafted = 0, accepted = 0;
    for (const auto& [d, a] : logged) {
      if (static_cast<size_t>(a) >= histogram.size()) {
        ADD_FAILURE() << "a step accepted " << a << ", past the histogram";
        continue;
      }
      histogram[a]++;
      drafted += d;
      accepted += a;
    }
    EXPECT_EQ(m.at("acceptance_histogram").get<std::vector<int64_t>>(), histogram);
    EXPECT_EQ(m.at("num_spec_steps").get<int64_t>(), static_cast<int64_t>(logged.size()));
    EXPECT_EQ(m.at("num_draft_tokens").get<int64_t>(), drafted);
    EXPECT_EQ(m.at("num_accepted_draft_tokens").get<int64_t>(), accepted);
    if (detailed) {
      std::vector<int> logged_drafted, logged_accepted;
      for (const auto& [d, a] : logged) {
        logged_drafted.push_back(d);
        logged_accepted.push_back(a);
      }
      EXPECT_EQ(m.at("per_step_drafted").get<std::vector<int>>(), logged_drafted);
      EXPECT_EQ(m.at("per_step_accepted").get<std::vector<int>>(), logged_accepted);
    }
    const json& spec = body.at("speculative");
    EXPECT_EQ(m.at("num_spec_steps"), spec.at("drafts"));
    EXPECT_EQ(m.at("num_draft_tokens"), spec.at("drafted"));
    EXPECT_EQ(m.at("num_accepted_draft_tokens"), spec.at("accepted"));
    total_steps += static_cast<int64_t>(logged.size());
  }
  return total_steps;
}

const char* const kPrompts[] = {
    "The history of the city begins with",
    "def parse_config(path):\n    with open(path) as f:\n",
    "int main(int argc, char** argv) {\n",
};

// Fixed k, detailed: completions and chat, whole and streamed, greedy and sampled.
TEST(SpecDecodeMetricsHttp, DetailedBlockEqualsTheStepLogAtFixedK) {
  TempDir dir;
  const std::string buffer = dir.Sub("buffer");
  std::map<std::string, json> responses;
  {
    serve_test::ServingStack server(Stack(buffer, 3, SpecMetricsLevel::kDetailed));
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    int i = 0;
    for (const char* prompt : kPrompts) {
      for (bool stream : {false, true}) {
        for (bool chat : {false, true}) {
          json body = {{"max_tokens", 24 + 5 * i},
                       {"stream", stream},
                       {"temperature", i % 2 ? 0.8 : 0.0},
                       {"seed", 7 + i}};
          if (chat) {
            body["messages"] = json::array({{{"role", "user"}, {"content", prompt}}});
          } else {
            body["prompt"] = prompt;
          }
          std::vector<json> chunks;
          const json out =
              Post(server, chat ? "/v1/chat/completions" : "/v1/completions", body, &chunks);
          ASSERT_TRUE(out.contains("metrics")) << out.dump();
          EXPECT_EQ(out["metrics"]["speculative_decoding"]["num_spec_tokens"], 3);
          if (stream) {
            // As vLLM: exactly one chunk carries the block, the one with usage, the last.
            int with_metrics = 0;
            for (const json& c : chunks) with_metrics += c.contains("metrics") ? 1 : 0;
            EXPECT_EQ(with_metrics, 1);
            EXPECT_TRUE(chunks.back().contains("usage"));
          }
          responses[out["id"].get<std::string>()] = out;
          ++i;
        }
      }
    }
    server.Shutdown();
  }
  const int64_t steps =
      ExpectBlocksMatchTheStepLog(responses, serve_test::ReadRecords(buffer), true);
  EXPECT_GT(steps, 12 * 3) << "too few speculative steps to compare";
  std::printf("[ fixed k=3, detailed ] %zu requests, %lld speculative steps compared\n",
              responses.size(), static_cast<long long>(steps));
}

// Adaptive k (suffix blocks on, a recurring prompt so that they are taken), summary: no
// per-step arrays; the histogram and totals still equal the step log's.
TEST(SpecDecodeMetricsHttp, SummaryBlockEqualsTheStepLogAtAdaptiveK) {
  TempDir dir;
  const std::string buffer = dir.Sub("buffer");
  std::map<std::string, json> responses;
  {
    serve_test::ServingStack server(Stack(buffer, -1, SpecMetricsLevel::kSummary));
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    for (int round = 0; round < 3; ++round) {
      for (const char* prompt : kPrompts) {
        json body = {
            {"prompt", prompt}, {"max_tokens", 40}, {"temperature", 0.0}, {"stream", round == 1}};
        std::vector<json> chunks;
        const json out = Post(server, "/v1/completions", body, &chunks);
        ASSERT_TRUE(out.contains("metrics")) << out.dump();
        EXPECT_EQ(out["metrics"]["speculative_decoding"]["num_spec_tokens"],
                  SpeculationPolicyOptions().k_max);
        responses[out["id"].get<std::string>()] = out;
      }
    }
    server.Shutdown();
  }
  int64_t suffix_steps = 0;
  for (const auto& [id, out] : responses) {
    suffix_steps += out["speculative"]["suffix"]["steps"].get<int64_t>();
  }
  const int64_t steps =
      ExpectBlocksMatchTheStepLog(responses, serve_test::ReadRecords(buffer), false);
  EXPECT_GT(steps, 0);
  std::printf("[ adaptive k, summary ] %zu requests, %lld speculative steps (%lld suffix)\n",
              responses.size(), static_cast<long long>(steps),
              static_cast<long long>(suffix_steps));
}

// Token trees at a fixed depth: a step drafts a tree's nodes and accepts a path of at most k
// (the record logs the path alone: accepted per step against it, drafted against the nodes
// the response's `speculative.tree` counts).
TEST(SpecDecodeMetricsHttp, TreeStepsCountNodesDraftedAndThePathAccepted) {
  TempDir dir;
  const std::string buffer = dir.Sub("buffer");
  std::map<std::string, json> responses;
  {
    serve_test::ServingStack server(Stack(buffer, 3, SpecMetricsLevel::kDetailed, {2, 2, 1}));
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    for (const char* prompt : kPrompts) {
      std::vector<json> chunks;
      const json out =
          Post(server, "/v1/completions",
               {{"prompt", prompt}, {"max_tokens", 30}, {"temperature", 0.0}}, &chunks);
      ASSERT_TRUE(out.contains("metrics")) << out.dump();
      responses[out["id"].get<std::string>()] = out;
    }
    server.Shutdown();
  }
  const std::vector<Record> records = serve_test::ReadRecords(buffer);
  ASSERT_EQ(records.size(), responses.size());
  int64_t steps = 0;
  for (const Record& r : records) {
    SCOPED_TRACE(r.request_id);
    const json& out = responses.at(r.request_id);
    const json& m = out["metrics"]["speculative_decoding"];
    ExpectConsistent(m, true);
    std::vector<int> accepted;
    for (const SpecStep& s : r.steps) {
      if (s.start_pos >= r.prompt_len) accepted.push_back(static_cast<int>(s.num_accepted));
    }
    // Every decoding step of a fixed-k tree drafts (none is plain), so each logged step is one.
    EXPECT_EQ(m["per_step_accepted"].get<std::vector<int>>(), accepted);
    const std::vector<int> drafted = m["per_step_drafted"];
    for (int d : drafted) EXPECT_LE(d, 2 + 4 + 4) << "more than the tree's nodes";
    const json& tree = out["speculative"]["tree"];
    EXPECT_EQ(m["num_spec_steps"], tree["steps"]);
    EXPECT_EQ(m["num_draft_tokens"], tree["drafted"]);
    EXPECT_EQ(m["num_accepted_draft_tokens"], tree["accepted"]);
    EXPECT_GT(m["num_draft_tokens"].get<int64_t>(), 3 * m["num_spec_steps"].get<int64_t>())
        << "trees of 2,2,1 draft more nodes than a chain of 3";
    steps += m["num_spec_steps"].get<int64_t>();
  }
  std::printf("[ tree 2,2,1 at k=3, detailed ] %zu requests, %lld tree steps compared\n",
              responses.size(), static_cast<long long>(steps));
}

// Off (the default): the response is unchanged, no "metrics" anywhere.
TEST(SpecDecodeMetricsHttp, OffByDefaultLeavesTheResponseUnchanged) {
  TempDir dir;
  serve_test::ServingStack server(
      Stack(dir.Sub("buffer"), 3, SchedulerOptions().per_request_spec_metrics));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  for (bool stream : {false, true}) {
    std::vector<json> chunks;
    const json out =
        Post(server, "/v1/completions",
             {{"prompt", kPrompts[0]}, {"max_tokens", 8}, {"stream", stream}}, &chunks);
    EXPECT_FALSE(out.contains("metrics")) << out.dump();
    EXPECT_TRUE(out.contains("speculative"));
    for (const json& c : chunks) EXPECT_FALSE(c.contains("metrics"));
  }
}

// The flag: a bad level, or metrics without speculation, is refused with a clear message
// before any model loads.
TEST(SpecDecodeMetricsCli, BadValuesAreRefusedClearly) {
  const std::string serve = std::string(SPECLOOP_BINARY) + " serve --target " +
                            serve_test::ShellQuote(serve_test::TargetDir()) + " --port 0 ";
  std::string out;
  EXPECT_EQ(serve_test::RunCommand(serve + "--per-request-spec-metrics full 2>&1", &out), 2);
  EXPECT_NE(out.find("--per-request-spec-metrics takes none, summary or detailed, not 'full'"),
            std::string::npos)
      << out;
  EXPECT_EQ(
      serve_test::RunCommand(serve + "--k 0 --per-request-spec-decode-metrics summary 2>&1", &out),
      2);
  EXPECT_NE(out.find("needs speculation"), std::string::npos) << out;
  const std::string up = std::string(SPECLOOP_BINARY) + " up --target " +
                         serve_test::ShellQuote(serve_test::TargetDir()) +
                         " --per-request-spec-metrics sometimes 2>&1";
  EXPECT_NE(serve_test::RunCommand(up, &out), 0);
  EXPECT_NE(out.find("sometimes"), std::string::npos) << out;
}

}  // namespace
}  // namespace specloop
