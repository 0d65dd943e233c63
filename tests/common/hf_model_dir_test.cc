// A model directory that ships a tokenizer.json is decoded end to end by `specloop generate`:
// target-6m's weights beside a byte-level BPE tokenizer.json written here (same vocabulary
// size), with the BOS decision taken from tokenizer_config.json or the post-processor.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/tokenizer/hf_tokenizer.h"
#include "common/tokenizer/model_config.h"
#include "tests/testing/temp_dir.h"

namespace specloop {
namespace {

using json = nlohmann::json;

// GPT-2's byte-to-unicode map, as UTF-8 strings.
std::vector<std::string> ByteLevelAlphabet() {
  std::vector<std::string> out(256);
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const int cp = printable ? b : next++;
    out[b] = cp < 0x80 ? std::string(1, static_cast<char>(cp))
                       : std::string{static_cast<char>(0xC0 | (cp >> 6)),
                                     static_cast<char>(0x80 | (cp & 0x3F))};
  }
  return out;
}

// target-6m with a tokenizer.json of its vocabulary size: ids 0-255 are bytes, then a few
// merged tokens, then fillers (decodable, never produced by encoding).
void WriteModelDir(const std::string& dir, const json& post_processor, const json& config) {
  const std::string target = testing::SharedDir() + "/models/target-6m";
  for (const char* f : {"config.json", "model.safetensors"}) {
    std::filesystem::create_symlink(target + "/" + f, dir + "/" + f);
  }
  ModelConfig c;
  ASSERT_TRUE(ModelConfig::FromDir(target, &c).ok());
  const std::vector<std::string> alphabet = ByteLevelAlphabet();
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[alphabet[b]] = b;
  const std::string sp = alphabet[' '];
  const std::vector<std::pair<std::string, std::string>> merges = {
      {sp, "t"}, {"h", "e"}, {sp + "t", "he"}, {sp, "c"}, {"a", "t"}, {sp + "c", "at"}};
  json merge_list = json::array();
  for (const auto& [a, b] : merges) {
    vocab[a + b] = static_cast<int>(vocab.size());
    merge_list.push_back(a + " " + b);
  }
  while (static_cast<int>(vocab.size()) < c.vocab_size) {
    vocab[sp + "w" + std::to_string(vocab.size())] = static_cast<int>(vocab.size());
  }
  const json tok = {
      {"added_tokens", {{{"id", c.bos_token_id}, {"content", "<s>"}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", post_processor},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}}},
  };
  std::ofstream(dir + "/tokenizer.json") << tok.dump();
  std::ofstream(dir + "/tokenizer_config.json") << config.dump();
}

// `specloop generate --json` on DIR at temperature 0; null when its output is not JSON.
json Generate(const std::string& dir, const std::string& prompt) {
  const std::string command = std::string(SPECLOOP_BINARY) + " generate --model " + dir +
                              " --prompt '" + prompt + "' --max-tokens 12 --temperature 0 --json";
  std::string out;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return json();
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  const int rc = pclose(p);
  EXPECT_EQ(rc, 0) << out;
  return json::parse(out.substr(std::min(out.find('{'), out.size())), nullptr, false);
}

TEST(HfModelDir, GenerateUsesTheTokenizerJson) {
  testing::TempDir dir;
  WriteModelDir(dir.path(), {{"type", "ByteLevel"}}, {{"add_bos_token", false}});
  std::unique_ptr<HfTokenizer> tok;
  ASSERT_TRUE(HfTokenizer::Open(dir.path(), &tok).ok());
  const std::vector<int> prompt = tok->Encode("the cat sat");
  ASSERT_EQ(prompt.size(), 6u);  // "t" "he", " cat", " " "s" "at": the rules' merges
  const json j = Generate(dir.path(), "the cat sat");
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["prompt_tokens"].get<std::vector<int>>(), prompt);  // no BOS
  const std::vector<int> ids = j["tokens"].get<std::vector<int>>();
  EXPECT_EQ(ids.size(), 12u);
  EXPECT_EQ(j["text"].get<std::string>(), ToValidUtf8(tok->Decode(ids)));
}

// Without add_bos_token in tokenizer_config.json, the post-processor decides: a template that
// starts with a special token adds it, a plain ByteLevel one adds nothing (as in Hugging Face).
TEST(HfModelDir, BosComesFromThePostProcessorTemplate) {
  const json bos_template = {
      {"type", "TemplateProcessing"},
      {"single", {{{"SpecialToken", {{"id", "<s>"}}}}, {{"Sequence", {{"id", "A"}}}}}},
      {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}}}}}};
  for (const bool with_bos : {true, false}) {
    testing::TempDir dir;
    WriteModelDir(dir.path(), with_bos ? bos_template : json{{"type", "ByteLevel"}},
                  json::object());
    ModelConfig c;
    ASSERT_TRUE(ModelConfig::FromDir(dir.path(), &c).ok());
    EXPECT_EQ(c.add_bos_token, with_bos);
    std::unique_ptr<HfTokenizer> tok;
    ASSERT_TRUE(HfTokenizer::Open(dir.path(), &tok).ok());
    std::vector<int> want = tok->Encode("the cat");
    if (with_bos) want.insert(want.begin(), c.bos_token_id);
    const json j = Generate(dir.path(), "the cat");
    ASSERT_TRUE(j.is_object());
    EXPECT_EQ(j["prompt_tokens"].get<std::vector<int>>(), want) << "with_bos " << with_bos;
  }
}

}  // namespace
}  // namespace specloop
