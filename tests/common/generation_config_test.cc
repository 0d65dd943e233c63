// generation_config.json parsing and the request defaults it implies
// (common/tokenizer/generation_config.h): the zoo's files, auto against ignore, do_sample,
// the keys that are not implemented, and malformed files.
#include "common/tokenizer/generation_config.h"

#include <gtest/gtest.h>

#include <fstream>

#include "tests/testing/temp_dir.h"

namespace specloop {
namespace {

constexpr int kVocab = 4096;
const std::vector<int> kModelEos = {2};

std::string Zoo(const std::string& name) { return testing::SharedDir() + "/models/zoo/" + name; }

GenerationDefaults Resolve(const GenerationConfig& c,
                           GenerationConfigMode mode = GenerationConfigMode::kAuto) {
  GenerationDefaults d;
  const Status s = ResolveGenerationDefaults(c, mode, kModelEos, kVocab, &d);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return d;
}

GenerationConfig Parse(const std::string& text) {
  GenerationConfig c;
  const Status s = GenerationConfig::FromJson(text, "DIR/generation_config.json", &c);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return c;
}

TEST(GenerationConfigTest, Qwen3TargetGivesItsSamplingDefaults) {
  GenerationConfig c;
  ASSERT_TRUE(GenerationConfig::FromDir(Zoo("qwen3-target"), &c).ok());
  EXPECT_TRUE(c.present);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>({2}));  // a list in this file
  const GenerationDefaults d = Resolve(c);
  EXPECT_FLOAT_EQ(d.sampling.temperature, 0.6f);
  EXPECT_FLOAT_EQ(d.sampling.top_p, 0.95f);
  EXPECT_EQ(d.sampling.top_k, 20);
  EXPECT_EQ(d.source, "generation_config.json");
  EXPECT_TRUE(d.eos_token_ids.empty()) << "2 is config.json's EOS already";
  EXPECT_TRUE(d.not_applied.empty());
  EXPECT_EQ(d.Describe(), "temperature 0.6, top_p 0.95, top_k 20 (generation_config.json)");
}

TEST(GenerationConfigTest, IgnoreRestoresThePlainDefaults) {
  GenerationConfig c;
  ASSERT_TRUE(GenerationConfig::FromDir(Zoo("qwen3-target"), &c).ok());
  const GenerationDefaults d = Resolve(c, GenerationConfigMode::kIgnore);
  EXPECT_FLOAT_EQ(d.sampling.temperature, 1.0f);
  EXPECT_FLOAT_EQ(d.sampling.top_p, 1.0f);
  EXPECT_EQ(d.sampling.top_k, 0);
  EXPECT_EQ(d.max_tokens, 0);
  EXPECT_EQ(d.source, "plain");
  // The file's EOS ids still end generation (as vLLM's --generation-config vllm).
  const GenerationDefaults e =
      Resolve(Parse(R"({"eos_token_id": [2, 7], "temperature": 0.3})"), GenerationConfigMode::kIgnore);
  EXPECT_EQ(e.eos_token_ids, std::vector<int>({7}));
  EXPECT_FLOAT_EQ(e.sampling.temperature, 1.0f);
}

TEST(GenerationConfigTest, TheOtherZooFamilies) {
  GenerationConfig c;
  // Llama 3: do_sample true, temperature 0.6, top_p 0.9, eos an int.
  ASSERT_TRUE(GenerationConfig::FromDir(Zoo("llama3-target"), &c).ok());
  GenerationDefaults d = Resolve(c);
  EXPECT_FLOAT_EQ(d.sampling.temperature, 0.6f);
  EXPECT_FLOAT_EQ(d.sampling.top_p, 0.9f);
  EXPECT_EQ(d.sampling.top_k, 0);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>({2}));
  // Qwen2: do_sample false is greedy; max_new_tokens the default max_tokens.
  ASSERT_TRUE(GenerationConfig::FromDir(Zoo("qwen2-target"), &c).ok());
  d = Resolve(c);
  EXPECT_TRUE(d.sampling.greedy());
  EXPECT_EQ(d.max_tokens, 2048);
  EXPECT_EQ(d.source, "generation_config.json");
  // Mistral: ids only, the plain defaults.
  ASSERT_TRUE(GenerationConfig::FromDir(Zoo("mistral-target"), &c).ok());
  d = Resolve(c);
  EXPECT_FLOAT_EQ(d.sampling.temperature, 1.0f);
  EXPECT_EQ(d.source, "plain");
  EXPECT_EQ(c.bos_token_id, 1);
}

TEST(GenerationConfigTest, ADirectoryWithoutTheFileHasNoDefaults) {
  testing::TempDir dir;
  GenerationConfig c;
  c.temperature = 0.1;
  ASSERT_TRUE(GenerationConfig::FromDir(dir.path(), &c).ok());
  EXPECT_FALSE(c.present);
  EXPECT_FALSE(c.temperature.has_value());
  const GenerationDefaults d = Resolve(c);
  EXPECT_FLOAT_EQ(d.sampling.temperature, 1.0f);
  EXPECT_EQ(d.source, "plain");
}

TEST(GenerationConfigTest, EachSamplingKeyOnItsOwnAndNulls) {
  GenerationDefaults d = Resolve(Parse(R"({"top_k": 5, "temperature": null})"));
  EXPECT_EQ(d.sampling.top_k, 5);
  EXPECT_FLOAT_EQ(d.sampling.temperature, 1.0f);
  EXPECT_FLOAT_EQ(d.sampling.top_p, 1.0f);
  d = Resolve(Parse(R"({"top_k": -1, "temperature": 0})"));
  EXPECT_EQ(d.sampling.top_k, 0);
  EXPECT_TRUE(d.sampling.greedy());
}

TEST(GenerationConfigTest, DoSampleFalseIsGreedyAndSaysWhatItDoesNotApply) {
  const GenerationDefaults d =
      Resolve(Parse(R"({"do_sample": false, "temperature": 0.7, "top_p": 0.8})"));
  EXPECT_TRUE(d.sampling.greedy());
  EXPECT_FLOAT_EQ(d.sampling.top_p, 1.0f);
  ASSERT_EQ(d.not_applied.size(), 1u);
  EXPECT_NE(d.not_applied[0].find("temperature top_p not applied: do_sample is false"),
            std::string::npos)
      << d.not_applied[0];
}

TEST(GenerationConfigTest, UnimplementedKeysAreNotedNeverRefused) {
  GenerationDefaults d = Resolve(
      Parse(R"({"repetition_penalty": 1.05, "min_p": 0.05, "temperature": 0.7})"));
  EXPECT_FLOAT_EQ(d.sampling.temperature, 0.7f);
  ASSERT_EQ(d.not_applied.size(), 2u);
  EXPECT_EQ(d.not_applied[0], "repetition_penalty 1.05 is not applied (not implemented)");
  EXPECT_EQ(d.not_applied[1], "min_p 0.05 is not applied (not implemented)");
  // Neutral values say nothing; an unreadable one is noted, not an error.
  EXPECT_TRUE(Resolve(Parse(R"({"repetition_penalty": 1.0, "min_p": 0})")).not_applied.empty());
  d = Resolve(Parse(R"({"repetition_penalty": "high"})"));
  ASSERT_EQ(d.not_applied.size(), 1u);
  EXPECT_EQ(d.not_applied[0], "repetition_penalty \"high\" is not applied (not implemented)");
}

TEST(GenerationConfigTest, ExtraEosIdsAndTheirRange) {
  GenerationDefaults d = Resolve(Parse(R"({"eos_token_id": [2, 9, 9, 11]})"));
  EXPECT_EQ(d.eos_token_ids, std::vector<int>({9, 11}));
  EXPECT_EQ(d.Describe(), "temperature 1, top_p 1, top_k off (plain); extra EOS ids 9 11");
  d = Resolve(Parse(R"({"eos_token_id": 12})"));
  EXPECT_EQ(d.eos_token_ids, std::vector<int>({12}));
  GenerationDefaults out;
  const Status s = ResolveGenerationDefaults(Parse(R"({"eos_token_id": [2, 4096]})"),
                                             GenerationConfigMode::kAuto, kModelEos, kVocab, &out);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.message().find("generation_config.json: \"eos_token_id\" 4096 is outside the "
                             "vocabulary (4096 tokens)"),
            std::string::npos)
      << s.ToString();
}

TEST(GenerationConfigTest, MalformedFilesAreClearErrors) {
  struct Case {
    const char* text;
    const char* expect;  // a substring of the message
  };
  const Case cases[] = {
      {"{\"temperature\": 0.6,", "DIR/generation_config.json: not valid JSON"},
      {"[1, 2]", "DIR/generation_config.json: must be a JSON object"},
      {R"({"temperature": "hot"})",
       "\"temperature\" must be a number >= 0 within float's range, got \"hot\""},
      {R"({"temperature": -0.5})",
       "\"temperature\" must be a number >= 0 within float's range, got -0.5"},
      // generation_config_fuzzer's find: past float's range a request's float would be inf.
      {R"({"temperature": 0.7e+300})",
       "\"temperature\" must be a number >= 0 within float's range, got 7e+299"},
      {R"({"top_p": 0})", "\"top_p\" must be a number in (0, 1], got 0"},
      {R"({"top_p": 1.5})", "\"top_p\" must be a number in (0, 1], got 1.5"},
      {R"({"top_k": -2})", "\"top_k\" must be an integer >= -1, got -2"},
      {R"({"top_k": 2.5})", "\"top_k\" must be an integer >= -1, got 2.5"},
      {R"({"do_sample": "yes"})", "\"do_sample\" must be a boolean, got \"yes\""},
      {R"({"max_new_tokens": 0})", "\"max_new_tokens\" must be an integer >= 1, got 0"},
      {R"({"eos_token_id": "2"})", "\"eos_token_id\" must be a token id or a list"},
      {R"({"eos_token_id": [2, -1]})", "\"eos_token_id\" must be a token id or a list"},
      {R"({"eos_token_id": [2, 1e30]})", "\"eos_token_id\" must be a token id or a list"},
      {R"({"bos_token_id": {}})", "\"bos_token_id\" must be a token id"},
  };
  for (const Case& c : cases) {
    GenerationConfig out;
    const Status s = GenerationConfig::FromJson(c.text, "DIR/generation_config.json", &out);
    EXPECT_TRUE(s.IsInvalidArgument()) << c.text << ": " << s.ToString();
    EXPECT_NE(s.message().find(c.expect), std::string::npos) << c.text << ": " << s.ToString();
    EXPECT_EQ(s.message().rfind("DIR/generation_config.json: ", 0), 0u) << s.ToString();
  }
  // From a directory, the error names the file's path.
  testing::TempDir dir;
  std::ofstream(dir.Sub("generation_config.json")) << R"({"top_p": "most"})";
  GenerationConfig out;
  const Status s = GenerationConfig::FromDir(dir.path(), &out);
  EXPECT_EQ(s.message().rfind(dir.Sub("generation_config.json") + ": \"top_p\"", 0), 0u)
      << s.ToString();
}

TEST(GenerationConfigTest, Modes) {
  GenerationConfigMode m;
  ASSERT_TRUE(ParseGenerationConfigMode("ignore", &m).ok());
  EXPECT_EQ(m, GenerationConfigMode::kIgnore);
  ASSERT_TRUE(ParseGenerationConfigMode("auto", &m).ok());
  EXPECT_EQ(m, GenerationConfigMode::kAuto);
  EXPECT_TRUE(ParseGenerationConfigMode("vllm", &m).IsInvalidArgument());
}

}  // namespace
}  // namespace specloop
