#include "serve/completion_params.h"

#include <gtest/gtest.h>

#include "tests/serve/test_util.h"

namespace specloop {
namespace {

class CompletionParamsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(Tokenizer::Load(serve_test::TargetDir(), &tok_).ok());
    ASSERT_TRUE(ModelConfig::FromDir(serve_test::TargetDir(), &config_).ok());
  }
  CompletionLimits Limits() const {
    CompletionLimits l;
    l.model_name = "target-6m";
    l.config = &config_;
    l.tokenizer = tok_.get();
    return l;
  }
  bool Parse(const std::string& body, CompletionParams* p, ApiError* e,
             const std::string& header = "") {
    return ParseCompletionRequest(body, header, Limits(), 42, p, e);
  }
  static std::unique_ptr<Tokenizer> tok_;
  static ModelConfig config_;
};
std::unique_ptr<Tokenizer> CompletionParamsTest::tok_;
ModelConfig CompletionParamsTest::config_;

TEST_F(CompletionParamsTest, ParsesEveryField) {
  CompletionParams p;
  ApiError e;
  ASSERT_TRUE(Parse(R"({"model":"target-6m","prompt":"Hello","max_tokens":7,"temperature":0.5,
      "top_p":0.9,"top_k":40,"stop":["\n","END"],"seed":9,"stream":true,"domain":"prose",
      "user":"ignored"})", &p, &e)) << e.message;
  EXPECT_EQ(p.generate.max_tokens, 7);
  EXPECT_FLOAT_EQ(p.generate.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(p.generate.sampling.top_p, 0.9f);
  EXPECT_EQ(p.generate.sampling.top_k, 40);
  EXPECT_EQ(p.generate.sampling.seed, 9u);
  EXPECT_EQ(p.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_TRUE(p.stream);
  EXPECT_EQ(p.domain, "prose");
  std::vector<int> want = tok_->Encode("Hello");
  want.insert(want.begin(), config_.bos_token_id);
  EXPECT_EQ(p.prompt, want);
}

TEST_F(CompletionParamsTest, DefaultsAndHeaderDomain) {
  CompletionParams p;
  ApiError e;
  ASSERT_TRUE(Parse(R"({"prompt":["Hi"]})", &p, &e, "python")) << e.message;
  EXPECT_EQ(p.generate.max_tokens, 16);
  EXPECT_EQ(p.generate.sampling.seed, 42u);
  EXPECT_EQ(p.domain, "python");
  EXPECT_FALSE(p.stream);
  ASSERT_TRUE(Parse(R"({"prompt":"Hi","domain":"c"})", &p, &e, "python"));
  EXPECT_EQ(p.domain, "c");  // the body wins
  ASSERT_TRUE(Parse(R"({"prompt":"Hi"})", &p, &e));
  EXPECT_EQ(p.domain, "default");
}

TEST_F(CompletionParamsTest, RejectsBadInputWithA4xxAndAMessage) {
  const std::string long_prompt(6000, 'x');
  struct Case {
    std::string body;
    int status;
    std::string param;
  } cases[] = {
      {"{\"prompt\": ", 400, ""},
      {"[1, 2]", 400, ""},
      {R"({"max_tokens": 5})", 400, "prompt"},
      {R"({"prompt": 5})", 400, "prompt"},
      {R"({"prompt": ["a", "b"]})", 400, "prompt"},
      {R"({"prompt": "a", "max_tokens": "10"})", 400, "max_tokens"},
      {R"({"prompt": "a", "max_tokens": -1})", 400, "max_tokens"},
      {R"({"prompt": "a", "max_tokens": 2.5})", 400, "max_tokens"},
      {R"({"prompt": "a", "temperature": "hot"})", 400, "temperature"},
      {R"({"prompt": "a", "temperature": 3})", 400, "temperature"},
      {R"({"prompt": "a", "top_p": 0})", 400, "top_p"},
      {R"({"prompt": "a", "top_k": -5})", 400, "top_k"},
      {R"({"prompt": "a", "stream": "yes"})", 400, "stream"},
      {R"({"prompt": "a", "stop": [1]})", 400, "stop"},
      {R"({"prompt": "a", "stop": ["a","b","c","d","e"]})", 400, "stop"},
      {R"({"prompt": "a", "n": 2})", 400, "n"},
      {R"({"prompt": "a", "domain": "bad domain!"})", 400, "domain"},
      {R"({"prompt": "a", "model": "gpt-4"})", 404, "model"},
      {R"({"prompt": "a", "max_tokens": 5000})", 400, "max_tokens"},
      {"{\"prompt\": \"" + long_prompt + "\"}", 400, "prompt"},
  };
  for (const Case& c : cases) {
    CompletionParams p;
    ApiError e;
    EXPECT_FALSE(Parse(c.body, &p, &e)) << c.body.substr(0, 80);
    EXPECT_EQ(e.status, c.status) << c.body.substr(0, 80);
    EXPECT_EQ(e.param, c.param) << c.body.substr(0, 80);
    EXPECT_FALSE(e.message.empty());
    const auto j = e.ToJson();
    EXPECT_TRUE(j["error"]["message"].is_string());
    EXPECT_TRUE(j["error"]["type"].is_string());
  }
}

TEST_F(CompletionParamsTest, ChatRendersTheMessagesAndTokenizesWithOneBos) {
  CompletionParams p;
  ApiError e;
  CompletionLimits l = Limits();  // no chat template: the default one
  ASSERT_TRUE(ParseChatCompletionRequest(
      R"({"messages":[{"role":"developer","content":"Be brief."},
                      {"role":"user","content":[{"type":"text","text":"Hello"},
                                                {"type":"text","text":"there"}]}],
          "max_completion_tokens":7,"max_tokens":99,"temperature":0,"stop":"\n","seed":3,
          "stream":true})",
      "docs", l, 42, &p, &e))
      << e.message;
  EXPECT_EQ(p.prompt_text, "system: Be brief.\nuser: Hello\nthere\nassistant:");
  std::vector<int> want = tok_->Encode(p.prompt_text);
  want.insert(want.begin(), config_.bos_token_id);
  EXPECT_EQ(p.prompt, want);
  EXPECT_EQ(p.generate.max_tokens, 7);  // max_completion_tokens wins
  EXPECT_EQ(p.stop, (std::vector<std::string>{"\n"}));
  EXPECT_EQ(p.generate.sampling.seed, 3u);
  EXPECT_EQ(p.domain, "docs");
  EXPECT_TRUE(p.stream);
  // Without a max: the room left in the context (OpenAI's chat default), not 16.
  ASSERT_TRUE(ParseChatCompletionRequest(R"({"messages":[{"role":"user","content":"Hi"}]})", "",
                                         l, 42, &p, &e));
  EXPECT_EQ(p.generate.max_tokens,
            config_.max_model_len - static_cast<int>(p.prompt.size()));
  l.max_tokens_limit = 64;
  ASSERT_TRUE(ParseChatCompletionRequest(R"({"messages":[{"role":"user","content":"Hi"}]})", "",
                                         l, 42, &p, &e));
  EXPECT_EQ(p.generate.max_tokens, 64);
  // add_generation_prompt and chat_template_kwargs reach the template.
  std::unique_ptr<ChatTemplate> t;
  ASSERT_TRUE(ChatTemplate::Compile("{{ messages[0].content }}|{{ add_generation_prompt }}|"
                                    "{{ flavour }}",
                                    nlohmann::json::object(), &t)
                  .ok());
  l.chat_template = t.get();
  ASSERT_TRUE(ParseChatCompletionRequest(
      R"({"messages":[{"role":"user","content":"Hi"}],"add_generation_prompt":false,
          "chat_template_kwargs":{"flavour":"mint"}})",
      "", l, 42, &p, &e))
      << e.message;
  EXPECT_EQ(p.prompt_text, "Hi|False|mint");
  // A template error is a 400 naming it.
  ASSERT_TRUE(ChatTemplate::Compile("{{ raise_exception('no ' + messages[0].role) }}",
                                    nlohmann::json::object(), &t)
                  .ok());
  l.chat_template = t.get();
  EXPECT_FALSE(ParseChatCompletionRequest(R"({"messages":[{"role":"user","content":"Hi"}]})", "",
                                          l, 42, &p, &e));
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.code, "chat_template_error");
  EXPECT_EQ(e.message, "chat template raised: no user");
}

}  // namespace
}  // namespace specloop
