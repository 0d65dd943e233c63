// Log-probabilities through the serving stack (/v1/completions `logprobs`, /v1/chat/completions
// `logprobs` + `top_logprobs`): the model goldens' top-5 log-probs, plain and speculating
// (chains, token trees, suffix blocks); a sampled request's values against an independent
// computation from one plain target forward; streamed against whole; stop strings; and the
// 400s of bad values.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>

#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include "tests/serve/serving_stack.h"
#include "tests/serve/test_util.h"

namespace specloop {
namespace {

using json = nlohmann::json;
using serve_test::ServingStack;
using serve_test::StackOptions;

std::string ModelDir(const std::string& name) { return serve_test::Shared() + "/models/" + name; }

// "token_id:ID" (return_tokens_as_token_ids) -> ID.
int IdOf(const std::string& token) {
  EXPECT_EQ(token.rfind("token_id:", 0), 0u) << token;
  return std::stoi(token.substr(9));
}

// A model with goldens (golden-greedy.jsonl: input_ids, generated, top5_logprobs) and the draft
// it speculates with: its family's (a draft, itself).
struct GoldenModel {
  std::string name, draft;
};
void PrintTo(const GoldenModel& m, std::ostream* os) { *os << m.name << " (draft " << m.draft << ")"; }
const GoldenModel kGoldenModels[] = {
    {"target-6m", "draft-mix-1m"},
    {"zoo/llama3-target", "zoo/llama3-draft"},   {"zoo/llama3-draft", "zoo/llama3-draft"},
    {"zoo/qwen2-target", "zoo/qwen2-draft"},     {"zoo/qwen2-draft", "zoo/qwen2-draft"},
    {"zoo/qwen3-target", "zoo/qwen3-draft"},     {"zoo/qwen3-draft", "zoo/qwen3-draft"},
    {"zoo/mistral-target", "zoo/mistral-draft"}, {"zoo/mistral-draft", "zoo/mistral-draft"},
};

std::vector<json> Goldens(const std::string& name) {
  std::ifstream in(ModelDir(name) + "/golden-greedy.jsonl");
  std::vector<json> rows;
  for (std::string line; std::getline(in, line);) rows.push_back(json::parse(line));
  return rows;
}

class GoldenLogprobsTest : public ::testing::TestWithParam<GoldenModel> {};

// Each golden row as a greedy request of its input_ids with logprobs 5: the generated ids and
// the top-5 (id, log-prob) pairs at every position equal the golden's within 1e-4, decoded
// plainly and speculating with the family's draft as chains (k 3), token trees (k 3, 2-2-1) and
// adaptive k (each row twice, the second time answered by suffix blocks).
TEST_P(GoldenLogprobsTest, TopFiveEqualTheGoldens) {
  const GoldenModel& m = GetParam();
  const std::vector<json> rows = Goldens(m.name);
  ASSERT_GE(rows.size(), 8u) << m.name;  // the zoo's 8, target-6m's 10
  struct Mode {
    const char* name;
    int k;
    std::vector<int> tree;
    int repeats;
  };
  const Mode modes[] = {{"plain", 0, {}, 1},
                        {"chain k 3", 3, {}, 1},
                        {"tree k 3 (2,2,1)", 3, {2, 2, 1}, 1},
                        {"adaptive k, suffix", -1, {}, 2}};
  for (const Mode& mode : modes) {
    StackOptions o;
    o.target_dir = ModelDir(m.name);
    o.draft_dir = mode.k != 0 ? ModelDir(m.draft) : "";
    o.k = mode.k;
    o.tree_branching = mode.tree;
    ServingStack stack(o);
    if (!stack.ok()) {
      GTEST_SKIP() << m.name << " does not load yet (" << stack.status().ToString()
                   << "): its goldens are not checked";
    }
    int64_t drafted = 0, accepted = 0, suffix_steps = 0;
    for (const json& row : rows) {
      for (int r = 0; r < mode.repeats; ++r) {
        const json req = {{"prompt", row["input_ids"]}, {"max_tokens", 32}, {"temperature", 0},
                          {"logprobs", 5}, {"return_tokens_as_token_ids", true},
                          {"ignore_eos", true}, {"domain", "golden"}};
        json res;
        ASSERT_EQ(stack.Post("/v1/completions", req, &res), 200) << res.dump();
        const json& lp = res["choices"][0]["logprobs"];
        const json& want = row["generated"];
        ASSERT_EQ(lp["tokens"].size(), want.size()) << m.name << " " << mode.name;
        for (size_t i = 0; i < want.size(); ++i) {
          const std::string where = m.name + " " + mode.name + " position " + std::to_string(i);
          ASSERT_EQ(IdOf(lp["tokens"][i]), want[i].get<int>()) << where;
          const json& top = lp["top_logprobs"][i];
          const json& golden = row["top5_logprobs"][i];
          ASSERT_EQ(top.size(), 5u) << where;
          for (const json& pair : golden) {
            const std::string key = "token_id:" + std::to_string(pair[0].get<int>());
            ASSERT_TRUE(top.contains(key)) << where << ": " << key << " not in " << top.dump();
            EXPECT_NEAR(top[key].get<double>(), pair[1].get<double>(), 1e-4) << where;
          }
          // Greedy: the chosen token is the top one, at its value.
          EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), golden[0][1].get<double>(), 1e-4)
              << where;
        }
        const json& spec = res["speculative"];
        drafted += spec["drafted"].get<int64_t>();
        accepted += spec["accepted"].get<int64_t>();
        suffix_steps += spec["suffix"]["steps"].get<int64_t>();
      }
    }
    // The speculative modes did speculate (the values above include accepted drafts).
    if (mode.k != 0) {
      EXPECT_GT(accepted, 0) << m.name << " " << mode.name;
      if (m.draft != m.name) {
        EXPECT_GT(drafted, accepted) << m.name << " " << mode.name << ": no draft was rejected";
      }
    }
    if (mode.repeats > 1) {
      EXPECT_GT(suffix_steps, 0) << m.name << ": no suffix block";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GoldenLogprobsTest, ::testing::ValuesIn(kGoldenModels),
                         [](const ::testing::TestParamInfo<GoldenModel>& info) {
                           std::string n = info.param.name;
                           for (char& c : n) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return n;
                         });

// The log-prob of every kept token under temperature, top-k then top-p, renormalized, computed
// here in double from a row of logits (sorted candidates; not the server's code).
std::map<int, double> ProcessedLogprobs(const float* logits, int vocab, double t, int top_k,
                                        double top_p) {
  std::vector<int> ids(vocab);
  for (int i = 0; i < vocab; ++i) ids[i] = i;
  std::sort(ids.begin(), ids.end(), [&](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  const double m = logits[ids[0]];
  std::vector<double> w(vocab);  // exp((l - m) / t), sorted
  for (int i = 0; i < vocab; ++i) w[i] = std::exp((logits[ids[i]] - m) / t);
  int keep = top_k > 0 ? std::min(top_k, vocab) : vocab;
  double mass = 0;
  for (int i = 0; i < keep; ++i) mass += w[i];
  double cum = 0;
  for (int i = 0; i < keep; ++i) {
    cum += w[i] / mass;
    if (cum >= top_p) {
      keep = i + 1;
      break;
    }
  }
  double kept = 0;
  for (int i = 0; i < keep; ++i) kept += w[i];
  std::map<int, double> out;
  for (int i = 0; i < keep; ++i) out[ids[i]] = std::log(w[i] / kept);
  return out;
}

class SampledLogprobsTest : public ::testing::Test {
 protected:
  static std::vector<int> PromptIds(const ServingStack& stack, const std::string& text) {
    std::vector<int> ids = stack.tokenizer().Encode(text);
    ids.insert(ids.begin(), stack.target().config().bos_token_id);
    return ids;
  }
};

// A sampled request (T 0.8, top-k 50, top-p 0.9) speculating with chains and with token trees:
// each chosen token's log-prob and the top 5 equal the log of the processed distribution
// computed independently from ONE plain forward of the target over the prompt and the output;
// the streamed response carries the same entries, chunk by chunk, as the whole one (fixed k
// and seed: the same tokens); the chat API reports the same values in its shape.
TEST_F(SampledLogprobsTest, ChosenAndTopValuesAreTheTargetsProcessedDistribution) {
  for (const std::vector<int>& tree : {std::vector<int>{}, std::vector<int>{2, 2, 1}}) {
    StackOptions o;
    o.target_dir = serve_test::TargetDir();
    o.draft_dir = serve_test::DraftDir();
    o.k = 3;
    o.tree_branching = tree;
    ServingStack stack(o);
    ASSERT_TRUE(stack.ok()) << stack.status().ToString();
    const std::vector<int> prompt = PromptIds(stack, "And God said unto Moses, Go");
    json req = {{"prompt", prompt}, {"max_tokens", 24},  {"temperature", 0.8},
                {"top_k", 50},      {"top_p", 0.9},      {"seed", 11},
                {"logprobs", 5},    {"ignore_eos", true}, {"return_tokens_as_token_ids", true}};
    json whole;
    ASSERT_EQ(stack.Post("/v1/completions", req, &whole), 200) << whole.dump();
    const json& lp = whole["choices"][0]["logprobs"];
    ASSERT_EQ(lp["tokens"].size(), 24u);
    EXPECT_GT(whole["speculative"]["accepted"].get<int>(), 0);

    // One forward of the whole sequence; row j is the distribution of token j + 1.
    std::vector<int64_t> all(prompt.begin(), prompt.end());
    for (const json& t : lp["tokens"]) all.push_back(IdOf(t));
    c10::InferenceMode guard;
    KVCache cache = stack.target().NewCache();
    ForwardInput in;
    in.cache = &cache;
    in.tokens = all;
    in.all_logits = true;
    const at::Tensor logits = stack.target().Forward({in}).to(at::kCPU).contiguous();
    const int vocab = static_cast<int>(logits.size(1));
    for (size_t i = 0; i < lp["tokens"].size(); ++i) {
      const int64_t row = static_cast<int64_t>(prompt.size() + i) - 1;
      const std::map<int, double> want =
          ProcessedLogprobs(logits.data_ptr<float>() + row * vocab, vocab, 0.8, 50, 0.9);
      const int chosen = IdOf(lp["tokens"][i]);
      ASSERT_TRUE(want.count(chosen)) << "position " << i << ": drawn outside the kept set";
      EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), want.at(chosen), 1e-4) << i;
      // The top 5 (or the whole kept set, when smaller), at their values.
      std::vector<std::pair<double, int>> best;
      for (const auto& [id, v] : want) best.push_back({-v, id});
      std::sort(best.begin(), best.end());
      best.resize(std::min<size_t>(5, best.size()));
      const json& top = lp["top_logprobs"][i];
      ASSERT_EQ(top.size(), best.size()) << i << ": " << top.dump();
      for (const auto& [neg, id] : best) {
        const std::string key = "token_id:" + std::to_string(id);
        ASSERT_TRUE(top.contains(key)) << i << ": " << key << " not in " << top.dump();
        EXPECT_NEAR(top[key].get<double>(), -neg, 1e-4) << i;
      }
    }

    // Streamed: the chunks' entries, concatenated, are the whole response's.
    req["stream"] = true;
    json last;
    std::vector<json> chunks;
    ASSERT_EQ(stack.Post("/v1/completions", req, &last, &chunks), 200);
    json joined = {{"tokens", json::array()}, {"token_logprobs", json::array()},
                   {"top_logprobs", json::array()}, {"text_offset", json::array()}};
    int carrying = 0;
    for (const json& c : chunks) {
      const json& l = c["choices"][0]["logprobs"];
      if (l.is_null()) continue;
      carrying += !l["tokens"].empty();
      for (auto& [key, list] : joined.items()) {
        for (const json& v : l[key]) list.push_back(v);
      }
    }
    EXPECT_EQ(joined, lp);
    EXPECT_GT(carrying, 2) << "the entries did not come chunk by chunk";

    // The chat API: the same values (a chat prompt of the default template, so other tokens).
    json chat = {{"messages", {{{"role", "user"}, {"content", "Go"}}}},
                 {"max_tokens", 12}, {"temperature", 0.8}, {"top_k", 50}, {"top_p", 0.9},
                 {"seed", 5}, {"logprobs", true}, {"top_logprobs", 3}, {"ignore_eos", true}};
    json chat_whole, chat_last;
    std::vector<json> chat_chunks;
    ASSERT_EQ(stack.Post("/v1/chat/completions", chat, &chat_whole), 200) << chat_whole.dump();
    const json& content = chat_whole["choices"][0]["logprobs"]["content"];
    ASSERT_EQ(content.size(), 12u);
    std::string text;
    for (const json& e : content) {
      EXPECT_GE(e["top_logprobs"].size(), 1u);
      EXPECT_LE(e["top_logprobs"].size(), 3u);
      EXPECT_LE(e["logprob"].get<double>(), 0.0);
      std::string bytes;
      for (const json& b : e["bytes"]) bytes += static_cast<char>(b.get<int>());
      if (std::all_of(bytes.begin(), bytes.end(), [](char c) { return c > 0; })) {
        EXPECT_EQ(bytes, e["token"].get<std::string>());
      }
      text += bytes;
    }
    EXPECT_EQ(text, chat_whole["choices"][0]["message"]["content"].get<std::string>());
    chat["stream"] = true;
    ASSERT_EQ(stack.Post("/v1/chat/completions", chat, &chat_last, &chat_chunks), 200);
    json chat_joined = json::array();
    for (const json& c : chat_chunks) {
      const json& l = c["choices"][0]["logprobs"];
      if (!l.is_null()) {
        for (const json& e : l["content"]) chat_joined.push_back(e);
      }
    }
    EXPECT_EQ(chat_joined, content);
  }
}

// The legacy format's fields agree with the text; with a stop string the entries end at the
// token that completes it (the text is cut before it).
TEST_F(SampledLogprobsTest, LegacyFieldsMatchTheTextAndStopStringsCutThem) {
  StackOptions o;
  o.target_dir = serve_test::TargetDir();
  ServingStack stack(o);
  ASSERT_TRUE(stack.ok()) << stack.status().ToString();
  json req = {{"prompt", "In the beginning God created"}, {"max_tokens", 32},
              {"temperature", 0}, {"logprobs", 2}};
  json full;
  ASSERT_EQ(stack.Post("/v1/completions", req, &full), 200);
  const std::string text = full["choices"][0]["text"];
  const json& lp = full["choices"][0]["logprobs"];
  std::string joined;
  for (size_t i = 0; i < lp["tokens"].size(); ++i) {
    EXPECT_EQ(lp["text_offset"][i].get<size_t>(), joined.size()) << i;  // ASCII: bytes = chars
    joined += lp["tokens"][i].get<std::string>();
    EXPECT_EQ(lp["top_logprobs"][i].size(), 2u);
  }
  EXPECT_EQ(joined, text);
  ASSERT_GT(text.size(), 40u);
  // A stop string inside the output: the text ends before it, the entries at its last token.
  const std::string stop = text.substr(25, 5);
  req["stop"] = stop;
  for (bool stream : {false, true}) {
    req["stream"] = stream;
    json res;
    std::vector<json> chunks;
    ASSERT_EQ(stack.Post("/v1/completions", req, &res, &chunks), 200);
    std::string cut_text, cut_tokens;
    size_t n = 0;
    for (const json& c : stream ? chunks : std::vector<json>{res}) {
      cut_text += c["choices"][0]["text"].get<std::string>();
      const json& l = c["choices"][0]["logprobs"];
      if (l.is_null()) continue;
      for (const json& t : l["tokens"]) cut_tokens += t.get<std::string>(), ++n;
    }
    EXPECT_EQ(cut_text, text.substr(0, text.find(stop))) << "stream " << stream;
    EXPECT_EQ(cut_tokens, joined.substr(0, cut_tokens.size())) << "stream " << stream;
    EXPECT_NE(cut_tokens.find(stop), std::string::npos) << cut_tokens;
    const std::string before_last = joined.substr(0, cut_tokens.size() - lp["tokens"][n - 1].get<std::string>().size());
    EXPECT_EQ(before_last.find(stop), std::string::npos) << "entries past the stop string";
  }
}

// Bad logprobs values are 400s naming the field; chat's logprobs alone is fine (no
// alternatives); a request without logprobs has "logprobs": null.
TEST_F(SampledLogprobsTest, BadValuesAre400s) {
  StackOptions o;
  o.target_dir = serve_test::TargetDir();
  ServingStack stack(o);
  ASSERT_TRUE(stack.ok()) << stack.status().ToString();
  const json messages = {{{"role", "user"}, {"content", "Hi"}}};
  struct Case {
    const char* path;
    json body;
    const char* param;
  };
  const std::vector<Case> cases = {
      {"/v1/completions", {{"prompt", "a"}, {"logprobs", 21}}, "logprobs"},
      {"/v1/completions", {{"prompt", "a"}, {"logprobs", -1}}, "logprobs"},
      {"/v1/completions", {{"prompt", "a"}, {"logprobs", "5"}}, "logprobs"},
      {"/v1/completions", {{"prompt", "a"}, {"logprobs", 2.5}}, "logprobs"},
      {"/v1/completions", {{"prompt", "a"}, {"logprobs", true}}, "logprobs"},
      {"/v1/completions", {{"prompt", "a"}, {"return_tokens_as_token_ids", 1}},
       "return_tokens_as_token_ids"},
      {"/v1/completions", {{"prompt", {1, 4096}}}, "prompt"},
      {"/v1/completions", {{"prompt", {1, -3}}}, "prompt"},
      {"/v1/completions", {{"prompt", {{1, 2}, {3}}}}, "prompt"},
      {"/v1/chat/completions", {{"messages", messages}, {"logprobs", "yes"}}, "logprobs"},
      {"/v1/chat/completions", {{"messages", messages}, {"logprobs", true}, {"top_logprobs", 21}},
       "top_logprobs"},
      {"/v1/chat/completions", {{"messages", messages}, {"logprobs", true}, {"top_logprobs", "3"}},
       "top_logprobs"},
      {"/v1/chat/completions", {{"messages", messages}, {"top_logprobs", 2}}, "top_logprobs"},
  };
  for (const Case& c : cases) {
    json res;
    EXPECT_EQ(stack.Post(c.path, c.body, &res), 400) << c.body.dump();
    EXPECT_EQ(res["error"]["param"], c.param) << c.body.dump() << " -> " << res.dump();
    EXPECT_FALSE(res["error"]["message"].get<std::string>().empty());
  }
  json res;
  ASSERT_EQ(stack.Post("/v1/chat/completions",
                       {{"messages", messages}, {"logprobs", true}, {"max_tokens", 4}}, &res),
            200)
      << res.dump();
  const json& content = res["choices"][0]["logprobs"]["content"];
  ASSERT_FALSE(content.empty());
  for (const json& e : content) EXPECT_TRUE(e["top_logprobs"].empty());
  ASSERT_EQ(stack.Post("/v1/completions", {{"prompt", "a"}, {"max_tokens", 2}}, &res), 200);
  EXPECT_TRUE(res["choices"][0]["logprobs"].is_null());
  // Token ids as the prompt, used as given (the golden test's input).
  ASSERT_EQ(stack.Post("/v1/completions", {{"prompt", {{1, 400, 500}}}, {"max_tokens", 2}}, &res),
            200)
      << res.dump();
  EXPECT_EQ(res["usage"]["prompt_tokens"], 3);
}

}  // namespace
}  // namespace specloop
