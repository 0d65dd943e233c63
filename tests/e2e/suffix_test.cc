// Model-free blocks in `specloop serve` (chosen per step in common/engine/decode_step.h).
// Suffix proposals (common/spec/suffix_proposer.h): prompts answered a second time are drafted
// from the first answers, and the output stays what the target decodes (greedy: the same bytes
// as with --no-suffix, and as the first time); the server's estimate of its speed over plain
// decoding (specloop_plain_equivalent_seconds_total over specloop_decode_seconds_total) is ~1
// for plain decoding and well above it for the suffix pass. Prompt lookup (--prompt-lookup,
// common/spec/prompt_lookup_proposer.h): prompts whose continuation repeats them are drafted
// from their own tokens, with the same greedy output.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>

#include "tests/e2e/e2e_util.h"

namespace specloop {
namespace e2e {
namespace {

struct Pass {
  std::vector<std::string> texts;
  double steps = 0, generated = 0, suffix_steps = 0, suffix_drafted = 0, suffix_accepted = 0;
  double lookup_steps = 0, lookup_drafted = 0, lookup_accepted = 0;
  double decode_seconds = 0, plain_seconds = 0;  // speed over plain = plain / decode
  // The same counts summed over the responses' `speculative` blocks.
  double response_steps = 0, response_drafts = 0, response_suffix_steps = 0,
         response_suffix_drafted = 0, response_suffix_accepted = 0, response_lookup_steps = 0;
};

// Two passes over the same prompts (JSON strings; default: four python prompts), one request at
// a time, greedy; counters per pass.
std::vector<Pass> TwoPasses(const std::vector<std::string>& extra,
                            std::vector<std::string> prompts = {}) {
  if (prompts.empty()) prompts = PromptsJson("python", 4);
  const int port = FreePort();
  std::vector<std::string> cmd = {SPECLOOP_BINARY, "serve", "--target", TargetDir(), "--draft",
                                  DraftDir(), "--port", std::to_string(port), "--no-log"};
  cmd.insert(cmd.end(), extra.begin(), extra.end());
  Child serve(cmd);
  std::vector<Pass> passes(2);
  if (serve.WaitForLine("listening on", 60).empty()) {
    ADD_FAILURE() << serve.Output();
    return passes;
  }
  const std::string label = "domain=\"python\"";
  Pass before;
  for (Pass& pass : passes) {
    for (const std::string& p : prompts) {
      const std::string req = "{\"prompt\":" + p +
                              ",\"max_tokens\":64,\"temperature\":0,\"domain\":\"python\"}";
      std::string body;
      EXPECT_EQ(HttpPost(port, "/v1/completions", req, &body), 200) << body;
      const nlohmann::json j = nlohmann::json::parse(body);
      pass.texts.push_back(j["choices"][0]["text"].get<std::string>());
      const nlohmann::json& spec = j["speculative"];
      pass.response_steps += spec["steps"].get<double>();
      pass.response_drafts += spec["drafts"].get<double>();
      pass.response_suffix_steps += spec["suffix"]["steps"].get<double>();
      pass.response_suffix_drafted += spec["suffix"]["drafted"].get<double>();
      pass.response_suffix_accepted += spec["suffix"]["accepted"].get<double>();
      pass.response_lookup_steps += spec["lookup"]["steps"].get<double>();
    }
    std::string text;
    EXPECT_EQ(HttpGet(port, "/metrics", &text), 200);
    Pass now;
    now.steps = MetricValue(text, "specloop_spec_steps_total", label);
    now.generated = MetricValue(text, "specloop_generated_tokens_total", label);
    now.suffix_steps = MetricValue(text, "specloop_suffix_steps_total", label);
    now.suffix_drafted = MetricValue(text, "specloop_suffix_draft_tokens_total", label);
    now.suffix_accepted = MetricValue(text, "specloop_suffix_accepted_tokens_total", label);
    now.lookup_steps = MetricValue(text, "specloop_lookup_steps_total", label);
    now.lookup_drafted = MetricValue(text, "specloop_lookup_draft_tokens_total", label);
    now.lookup_accepted = MetricValue(text, "specloop_lookup_accepted_tokens_total", label);
    now.decode_seconds = MetricValue(text, "specloop_decode_seconds_total", label);
    now.plain_seconds = MetricValue(text, "specloop_plain_equivalent_seconds_total", label);
    pass.steps = now.steps - before.steps;
    pass.generated = now.generated - before.generated;
    pass.suffix_steps = now.suffix_steps - before.suffix_steps;
    pass.suffix_drafted = now.suffix_drafted - before.suffix_drafted;
    pass.suffix_accepted = now.suffix_accepted - before.suffix_accepted;
    pass.lookup_steps = now.lookup_steps - before.lookup_steps;
    pass.lookup_drafted = now.lookup_drafted - before.lookup_drafted;
    pass.lookup_accepted = now.lookup_accepted - before.lookup_accepted;
    pass.decode_seconds = now.decode_seconds - before.decode_seconds;
    pass.plain_seconds = now.plain_seconds - before.plain_seconds;
    before = now;
  }
  return passes;
}

TEST(SuffixTest, RepeatedPromptsAreDraftedFromEarlierAnswersAndDecodeTheSame) {
  const std::vector<Pass> on = TwoPasses({});
  const std::vector<Pass> off = TwoPasses({"--no-suffix"});
  ASSERT_EQ(on[1].texts.size(), 4u);
  // Exact: greedy output is the target's, whoever drafted it.
  EXPECT_EQ(on[1].texts, on[0].texts);
  EXPECT_EQ(on[0].texts, off[0].texts);
  EXPECT_EQ(off[1].texts, off[0].texts);
  // The second pass repeats outputs the index holds: suffix blocks carry it, and nearly all
  // their tokens are accepted; the same pass without them takes more target steps.
  std::printf("second pass: %.0f steps (%.0f suffix, %.0f of %.0f tokens accepted); without "
              "suffix %.0f steps\n",
              on[1].steps, on[1].suffix_steps, on[1].suffix_accepted, on[1].suffix_drafted,
              off[1].steps);
  EXPECT_GE(on[1].suffix_steps, 5);
  EXPECT_GE(on[1].suffix_accepted, 0.8 * on[1].suffix_drafted);
  EXPECT_LT(on[1].steps, off[1].steps);
  EXPECT_EQ(off[0].suffix_steps + off[1].suffix_steps, 0);
  // The server's speed over plain decoding (step cost table's plain step against the steps
  // taken): the suffix pass far above 1 (its steps emit ~5 tokens each).
  const double suffix_over_plain = on[1].plain_seconds / on[1].decode_seconds;
  std::printf("speed over plain, as the server estimates it: suffix pass %.2fx\n",
              suffix_over_plain);
  EXPECT_GT(suffix_over_plain, 1.5);
  // Each response tells its share of the suffix steps; together they are the metrics' counts.
  for (const Pass* p : {&on[0], &on[1], &off[0], &off[1]}) {
    EXPECT_EQ(p->response_suffix_steps, p->suffix_steps);
    EXPECT_EQ(p->response_suffix_drafted, p->suffix_drafted);
    EXPECT_EQ(p->response_suffix_accepted, p->suffix_accepted);
    EXPECT_LE(p->response_drafts, p->response_steps);
    EXPECT_GE(p->response_drafts, p->response_suffix_steps);
  }
}

// Prompts that hold a passage, its greedy continuation G and the passage again: target-6m's
// greedy continuation then repeats G for a stretch (two of the first four python prompts
// nearly all of it), which prompt lookup drafts from the request's own tokens. With
// --prompt-lookup its blocks carry much of the output in fewer target steps, and the output is
// the same bytes as without it. (--no-suffix keeps the domain's suffix index out of all three
// servers.) Three runs: ~50 lookup blocks a pass, 143-168 tokens accepted, 69-80 steps against
// 100-133.
TEST(SuffixTest, PromptLookupDraftsRepeatsFromTheRequestsOwnTokens) {
  std::vector<std::string> passages;
  for (const std::string& p : PromptsJson("python", 4)) {
    passages.push_back(nlohmann::json::parse(p).get<std::string>().substr(0, 160));
  }
  std::vector<std::string> first;
  for (const std::string& p : passages) first.push_back(nlohmann::json(p).dump());
  const std::vector<std::string> g = TwoPasses({"--no-suffix"}, first)[0].texts;
  ASSERT_EQ(g.size(), passages.size());
  std::vector<std::string> prompts;
  for (size_t i = 0; i < passages.size(); ++i) {
    prompts.push_back(nlohmann::json(passages[i] + g[i] + "\n\n" + passages[i]).dump());
  }
  const std::vector<Pass> on = TwoPasses({"--no-suffix", "--prompt-lookup"}, prompts);
  const std::vector<Pass> off = TwoPasses({"--no-suffix"}, prompts);
  ASSERT_EQ(on[0].texts.size(), 4u);
  EXPECT_EQ(on[0].texts, off[0].texts);
  EXPECT_EQ(on[1].texts, off[1].texts);
  for (int i = 0; i < 2; ++i) {
    std::printf("pass %d, prompt lookup: %.0f steps (%.0f lookup, %.0f of %.0f tokens "
                "accepted); without %.0f steps\n",
                i, on[i].steps, on[i].lookup_steps, on[i].lookup_accepted, on[i].lookup_drafted,
                off[i].steps);
    EXPECT_EQ(on[i].response_lookup_steps, on[i].lookup_steps);
    EXPECT_EQ(off[i].lookup_steps, 0);
  }
  EXPECT_GE(on[0].lookup_steps + on[1].lookup_steps, 10);
  // Drafts off by a token would be rejected.
  EXPECT_GE(on[0].lookup_accepted + on[1].lookup_accepted, 40);
  EXPECT_LT(on[0].steps + on[1].steps, off[0].steps + off[1].steps);
}

// Plain decoding (--k 0) measured against its own plain steps: the estimate is 1 within the
// table's error (a decayed mean per size, a context slope), so the suffix pass's figure above
// is the speed-up and not the estimator's bias.
TEST(SuffixTest, ThePlainSpeedEstimateOfPlainDecodingIsOne) {
  const std::vector<Pass> plain = TwoPasses({"--k", "0"});
  for (const Pass& p : plain) {
    ASSERT_GT(p.decode_seconds, 0);
    const double over_plain = p.plain_seconds / p.decode_seconds;
    std::printf("plain decoding over plain, as the server estimates it: %.3fx\n", over_plain);
    EXPECT_GT(over_plain, 0.8);
    EXPECT_LT(over_plain, 1.2);
  }
}

}  // namespace
}  // namespace e2e
}  // namespace specloop
