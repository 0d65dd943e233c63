// The request defaults of a model's generation_config.json through the serving stack and the
// binary: the zoo's qwen3-target (temperature 0.6, top_k 20, top_p 0.95) and target-6m's
// weights under the same file get them when a request omits them, a request's own values win,
// --generation-config ignore restores the plain ones; an extra eos_token_id ends generation;
// `specloop generate --json` and `specloop serve`'s start-up show them; a malformed file is a
// clear error. Each check of the sampling reads the log-probs the request decoded with.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include <gtest/gtest.h>

#include "tests/serve/serving_stack.h"
#include "tests/serve/test_util.h"

namespace specloop {
namespace {

using json = nlohmann::json;
using serve_test::ServingStack;
using serve_test::StackOptions;

const char* kQwen3Defaults = R"({"do_sample": true, "eos_token_id": [2], "temperature": 0.6,
                                 "top_k": 20, "top_p": 0.95})";

// target-6m's files (symlinks) beside a generation_config.json of `text` in `dir`.
void WriteModelDir(const std::string& dir, const std::string& text) {
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.model",
                        "tokenizer_config.json"}) {
    std::filesystem::create_symlink(serve_test::TargetDir() + "/" + f, dir + "/" + f);
  }
  std::ofstream(dir + "/generation_config.json") << text;
}

// The first position's alternatives of a one-token request: id -> log-prob.
std::map<int, double> FirstTop(const json& res) {
  std::map<int, double> out;
  for (const auto& [key, v] : res["choices"][0]["logprobs"]["top_logprobs"][0].items()) {
    out[std::stoi(key.substr(9))] = v.get<double>();
  }
  return out;
}

// What the first position's kept set must be under temperature t, top-k 20 and top-p p, from
// the greedy request's top 20 plain log-probs (they hold the whole top-20 set).
std::map<int, double> Expected(const std::map<int, double>& plain20, double t, double p) {
  std::vector<std::pair<double, int>> sorted;
  for (const auto& [id, g] : plain20) sorted.push_back({-g, id});
  std::sort(sorted.begin(), sorted.end());
  const double best = -sorted[0].first;
  std::vector<double> w;  // exp((g - best) / t) in order, the top-20 set's mass
  double mass = 0;
  for (const auto& [neg, id] : sorted) {
    w.push_back(std::exp((-neg - best) / t));
    mass += w.back();
  }
  size_t keep = sorted.size();
  double cum = 0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    cum += w[i] / mass;
    if (cum >= p) {
      keep = i + 1;
      break;
    }
  }
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += w[i];
  std::map<int, double> out;
  for (size_t i = 0; i < keep; ++i) out[sorted[i].second] = std::log(w[i] / kept);
  return out;
}

void ExpectNear(const std::map<int, double>& got, const std::map<int, double>& want,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [id, v] : want) {
    ASSERT_TRUE(got.count(id)) << what << ": id " << id;
    EXPECT_NEAR(got.at(id), v, 1e-4) << what << ": id " << id;
  }
}

json OneToken(json extra = json::object()) {
  json req = {{"prompt", "And God said unto"}, {"max_tokens", 1}, {"logprobs", 20},
              {"return_tokens_as_token_ids", true}, {"seed", 3}};
  req.update(extra);
  return req;
}

class GenerationDefaultsTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new serve_test::TempDir("specloop-gencfg");
    WriteModelDir(dir_->path(), kQwen3Defaults);
  }
  static void TearDownTestSuite() { delete dir_; }
  // The model dir of the parameter: the zoo's, or target-6m's weights with qwen3's file.
  static std::string Dir(const std::string& param) {
    return param == "target-6m" ? dir_->path() : serve_test::Shared() + "/models/zoo/" + param;
  }
  static serve_test::TempDir* dir_;
};
serve_test::TempDir* GenerationDefaultsTest::dir_ = nullptr;

TEST_P(GenerationDefaultsTest, OmittedFieldsGetTheModelsDefaultsAndGivenOnesWin) {
  StackOptions o;
  o.target_dir = Dir(GetParam());
  ServingStack stack(o);
  if (!stack.ok()) GTEST_SKIP() << o.target_dir << " does not load yet: " << stack.status().ToString();
  const json models = stack.Get("/v1/models");
  EXPECT_EQ(models["data"][0]["generation_defaults"],
            json::parse(R"({"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": null,
                            "eos_token_ids": [], "source": "generation_config.json"})"));
  json greedy, res;
  ASSERT_EQ(stack.Post("/v1/completions", OneToken({{"temperature", 0}}), &greedy), 200);
  const std::map<int, double> plain = FirstTop(greedy);
  ASSERT_EQ(plain.size(), 20u);

  // Nothing given: temperature 0.6, top_k 20, top_p 0.95 decode it (streamed and chat alike).
  ASSERT_EQ(stack.Post("/v1/completions", OneToken(), &res), 200) << res.dump();
  EXPECT_EQ(res["sampling"], json::parse(R"({"temperature": 0.6, "top_p": 0.95, "top_k": 20,
                                             "seed": 3})"));
  ExpectNear(FirstTop(res), Expected(plain, 0.6, 0.95), "defaults");
  ASSERT_EQ(stack.Post("/v1/completions", OneToken({{"stream", true}}), &res), 200);
  EXPECT_EQ(res["sampling"]["top_k"], 20);
  ASSERT_EQ(stack.Post("/v1/chat/completions",
                       {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 1}},
                       &res),
            200);
  EXPECT_EQ(res["sampling"]["temperature"], 0.6);
  // One field given: it wins, the others stay the model's.
  ASSERT_EQ(stack.Post("/v1/completions", OneToken({{"temperature", 0.9}}), &res), 200);
  EXPECT_EQ(res["sampling"]["temperature"], 0.9);
  EXPECT_EQ(res["sampling"]["top_p"], 0.95);
  ExpectNear(FirstTop(res), Expected(plain, 0.9, 0.95), "temperature 0.9");
  // All given: the plain distribution (top_k -1 is off).
  ASSERT_EQ(stack.Post("/v1/completions",
                       OneToken({{"temperature", 1}, {"top_p", 1}, {"top_k", -1}}), &res),
            200);
  EXPECT_EQ(res["sampling"], json::parse(R"({"temperature": 1.0, "top_p": 1.0, "top_k": null,
                                             "seed": 3})"));
  ExpectNear(FirstTop(res), plain, "given plain");
}

TEST_P(GenerationDefaultsTest, IgnoreRestoresThePlainDefaults) {
  StackOptions o;
  o.target_dir = Dir(GetParam());
  o.generation_config = GenerationConfigMode::kIgnore;
  ServingStack stack(o);
  if (!stack.ok()) GTEST_SKIP() << o.target_dir << " does not load yet: " << stack.status().ToString();
  EXPECT_EQ(stack.Get("/v1/models")["data"][0]["generation_defaults"]["source"], "plain");
  json greedy, res;
  ASSERT_EQ(stack.Post("/v1/completions", OneToken({{"temperature", 0}}), &greedy), 200);
  ASSERT_EQ(stack.Post("/v1/completions", OneToken(), &res), 200);
  EXPECT_EQ(res["sampling"], json::parse(R"({"temperature": 1.0, "top_p": 1.0, "top_k": null,
                                             "seed": 3})"));
  ExpectNear(FirstTop(res), FirstTop(greedy), "ignore");
}

INSTANTIATE_TEST_SUITE_P(Models, GenerationDefaultsTest,
                         ::testing::Values("qwen3-target", "target-6m"));

// A request's generated ids (logprobs' "token_id:ID" tokens).
std::vector<int> Ids(const json& res) {
  std::vector<int> ids;
  for (const json& t : res["choices"][0]["logprobs"]["tokens"]) {
    ids.push_back(std::stoi(t.get<std::string>().substr(9)));
  }
  return ids;
}

TEST(GenerationConfigEos, AnExtraEosIdEndsGeneration) {
  // Where target-6m's greedy output goes, and a token of it that is new at its position.
  const json req = {{"prompt", "And God said"}, {"max_tokens", 12}, {"temperature", 0},
                    {"logprobs", 0}, {"return_tokens_as_token_ids", true}};
  StackOptions plain_options;
  plain_options.target_dir = serve_test::TargetDir();
  std::vector<int> plain;
  size_t j = 0;
  std::string cut_text;
  {
    ServingStack stack(plain_options);
    ASSERT_TRUE(stack.ok()) << stack.status().ToString();
    json res;
    ASSERT_EQ(stack.Post("/v1/completions", req, &res), 200);
    plain = Ids(res);
    ASSERT_EQ(plain.size(), 12u);
    for (j = 4; j < plain.size(); ++j) {
      if (std::count(plain.begin(), plain.begin() + j, plain[j]) == 0) break;
    }
    ASSERT_LT(j, plain.size());
    json shorter = req;
    shorter["max_tokens"] = j + 1;
    ASSERT_EQ(stack.Post("/v1/completions", shorter, &res), 200);
    cut_text = res["choices"][0]["text"];
  }
  const int stop_id = plain[j];
  serve_test::TempDir dir("specloop-gencfg-eos");
  WriteModelDir(dir.path(), "{\"eos_token_id\": [2, " + std::to_string(stop_id) + "]}");
  const std::vector<int> want(plain.begin(), plain.begin() + j + 1);
  for (GenerationConfigMode mode : {GenerationConfigMode::kAuto, GenerationConfigMode::kIgnore}) {
    for (int k : {0, 3}) {
      StackOptions o;
      o.target_dir = dir.path();
      o.draft_dir = k ? serve_test::DraftDir() : "";
      o.k = k;
      o.generation_config = mode;
      ServingStack stack(o);
      ASSERT_TRUE(stack.ok()) << stack.status().ToString();
      EXPECT_EQ(stack.Get("/v1/models")["data"][0]["generation_defaults"]["eos_token_ids"],
                json::array({stop_id}));
      for (bool stream : {false, true}) {
        const std::string what = "k " + std::to_string(k) + (stream ? " streamed" : "");
        json r = req, res;
        r["stream"] = stream;
        std::vector<json> chunks;
        ASSERT_EQ(stack.Post("/v1/completions", r, &res, &chunks), 200) << what;
        std::vector<int> got;
        std::string text;
        for (const json& c : stream ? chunks : std::vector<json>{res}) {
          text += c["choices"][0]["text"].get<std::string>();
          if (!c["choices"][0]["logprobs"].is_null()) {
            for (int id : Ids(c)) got.push_back(id);
          }
        }
        EXPECT_EQ(got, want) << what;
        EXPECT_EQ(text, cut_text) << what;
        EXPECT_EQ(res["choices"][0]["finish_reason"], "stop") << what;
        EXPECT_EQ(res["usage"]["completion_tokens"], j + 1) << what;
      }
      // ignore_eos: on to max_tokens.
      json r = req, res;
      r["ignore_eos"] = true;
      ASSERT_EQ(stack.Post("/v1/completions", r, &res), 200);
      EXPECT_EQ(Ids(res), plain);
      EXPECT_EQ(res["choices"][0]["finish_reason"], "length");
    }
  }
  // `specloop generate`, plain and speculating.
  for (const std::string& extra :
       {std::string(), " --draft " + serve_test::DraftDir() + " --k 3"}) {
    std::string out;
    ASSERT_EQ(serve_test::RunCommand(std::string(SPECLOOP_BINARY) + " generate --model " +
                                         dir.path() + " --prompt 'And God said' --temperature 0 "
                                         "--max-tokens 12 --json" + extra,
                                     &out),
              0)
        << out;
    const json g = json::parse(out);
    EXPECT_EQ(g["tokens"].get<std::vector<int>>(), want) << extra;
    EXPECT_EQ(g["finish_reason"], "stop") << extra;
    EXPECT_EQ(g["text"], cut_text) << extra;
  }
}

// A port something already listens on (so that `specloop serve` stops at binding, after its
// start-up log).
class BusyPort {
 public:
  BusyPort() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (bind(fd_, reinterpret_cast<sockaddr*>(&a), len) == 0 && listen(fd_, 1) == 0 &&
        getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      port_ = ntohs(a.sin_port);
    }
  }
  ~BusyPort() { close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

TEST(GenerationConfigBinary, GenerateAndServeShowTheDefaultsAndWarn) {
  serve_test::TempDir dir("specloop-gencfg-bin");
  WriteModelDir(dir.path(), R"({"temperature": 0.6, "top_k": 20, "top_p": 0.95,
                                "repetition_penalty": 1.1})");
  const std::string generate = std::string(SPECLOOP_BINARY) + " generate --model " + dir.path() +
                               " --prompt 'And God said' --max-tokens 4 --json";
  const std::string warning = "warning: " + dir.path() +
                              "/generation_config.json: repetition_penalty 1.1 is not applied "
                              "(not implemented)";
  struct Case {
    std::string flags;
    const char* sampling;
  };
  const Case cases[] = {
      {"", R"({"temperature": 0.6, "top_p": 0.95, "top_k": 20, "seed": 0})"},
      {" --temperature 0", R"({"temperature": 0.0, "top_p": 0.95, "top_k": 20, "seed": 0})"},
      {" --generation-config ignore", R"({"temperature": 1.0, "top_p": 1.0, "top_k": null,
                                          "seed": 0})"},
  };
  for (const Case& c : cases) {
    std::string out;
    ASSERT_EQ(serve_test::RunCommand(generate + c.flags + " 2>&1", &out), 0) << out;
    const json g = json::parse(out.substr(out.rfind("\n{") + 1));
    EXPECT_EQ(g["sampling"], json::parse(c.sampling)) << c.flags;
    if (c.flags.empty()) {
      EXPECT_NE(out.find(warning), std::string::npos) << out;
      EXPECT_EQ(g["generation_defaults"]["source"], "generation_config.json");
    }
  }
  // `specloop serve` logs them at start-up (here it then fails to bind a busy port).
  BusyPort busy;
  ASSERT_GT(busy.port(), 0);
  std::string out;
  EXPECT_NE(serve_test::RunCommand(std::string(SPECLOOP_BINARY) + " serve --target " +
                                       dir.path() + " --draft " + serve_test::DraftDir() +
                                       " --k 0 --no-log --port " + std::to_string(busy.port()) +
                                       " 2>&1",
                                   &out),
            0);
  EXPECT_NE(out.find("specloop serve: request defaults: temperature 0.6, top_p 0.95, top_k 20 "
                     "(generation_config.json)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find(warning), std::string::npos) << out;
}

TEST(GenerationConfigBinary, AMalformedFileIsAClearError) {
  serve_test::TempDir dir("specloop-gencfg-bad");
  WriteModelDir(dir.path(), R"({"temperature": 0.6, "top_p": "most"})");
  const std::string want = dir.path() + "/generation_config.json: \"top_p\" must be a number in "
                                        "(0, 1], got \"most\"";
  for (const std::string& cmd :
       {" generate --model " + dir.path() + " --prompt hi --max-tokens 2",
        " serve --target " + dir.path() + " --draft " + serve_test::DraftDir() +
            " --k 0 --no-log --port 0"}) {
    std::string out;
    EXPECT_EQ(serve_test::RunCommand(std::string(SPECLOOP_BINARY) + cmd + " 2>&1", &out), 1)
        << cmd << ": " << out;
    EXPECT_NE(out.find(want), std::string::npos) << cmd << ": " << out;
  }
}

}  // namespace
}  // namespace specloop
