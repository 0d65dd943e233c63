#include "common/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "common/tokenizer/bpe_tokenizer.h"
#include "tests/common/test_models.h"

namespace specloop {
namespace {

std::unique_ptr<Tokenizer> Tokenizer4k() {
  std::unique_ptr<Tokenizer> t;
  Status s = Tokenizer::Load(testing::SharedDir() + "/models/tokenizer-4k", &t);
  if (!s.ok()) throw std::runtime_error(s.ToString());
  return t;
}

// Documents of a corpus split (separated by lines holding ASCII 0x1E).
std::vector<std::string> Documents(const std::string& domain, size_t max_docs) {
  std::ifstream in(testing::SharedDir() + "/corpus/" + domain + "/valid.txt");
  std::stringstream ss;
  ss << in.rdbuf();
  std::vector<std::string> docs;
  std::string all = ss.str();
  size_t start = 0;
  while (start < all.size() && docs.size() < max_docs) {
    size_t end = all.find("\n\x1e\n", start);
    if (end == std::string::npos) end = all.size();
    docs.push_back(all.substr(start, end - start));
    start = end + 3;
  }
  return docs;
}

TEST(Tokenizer, SentencePieceDecodeInvertsEncodeOnTheCorpus) {
  auto t = Tokenizer4k();
  EXPECT_EQ(t->vocab_size(), 4096);
  for (const char* domain : {"prose", "python", "c", "legal", "docs"}) {
    for (const std::string& doc : Documents(domain, 20)) {
      std::vector<int> ids = t->Encode(doc);
      for (int id : ids) ASSERT_TRUE(id >= 0 && id < 4096);
      EXPECT_EQ(t->Decode(ids), doc) << domain;
    }
  }
}

TEST(Tokenizer, ContinuationDecodesLikeTheWhole) {
  // Streaming decodes each new id after its predecessor; the pieces must add up to the whole.
  auto t = Tokenizer4k();
  const std::string text = "int main(void) {\n  return 0; /* ünïcödé ✓ 😀 */\n}";
  std::vector<int> ids = t->Encode(text);
  std::string streamed;
  int prev = -1;
  for (int id : ids) {
    streamed += t->Decode({id}, prev);
    prev = id;
  }
  EXPECT_EQ(streamed, text);
  EXPECT_EQ(t->Decode(ids, 1), text);  // after BOS: the dummy-prefix space is dropped too
}

TEST(Tokenizer, ByteFallbackForUnseenCharacters) {
  auto t = Tokenizer4k();
  const std::string text = "\xF0\x9F\xA6\x99 \xE4\xB8\xAD";  // 🦙 中: surely not whole pieces
  std::vector<int> ids = t->Encode(text);
  EXPECT_GE(ids.size(), 7u);  // at least one id per byte of the two characters
  EXPECT_EQ(t->Decode(ids), text);
  EXPECT_TRUE(t->Encode("").empty());
}

TEST(Tokenizer, CompleteUtf8Prefix) {
  EXPECT_EQ(CompleteUtf8Prefix("abc"), 3u);
  EXPECT_EQ(CompleteUtf8Prefix("a\xC3"), 1u);             // é cut after its lead byte
  EXPECT_EQ(CompleteUtf8Prefix("a\xC3\xA9"), 3u);         // é whole
  EXPECT_EQ(CompleteUtf8Prefix("\xF0\x9F\x98"), 0u);      // 😀 missing its last byte
  EXPECT_EQ(CompleteUtf8Prefix("\xF0\x9F\x98\x80"), 4u);
  EXPECT_EQ(CompleteUtf8Prefix(""), 0u);
}

TEST(Tokenizer, MissingOrCorruptFiles) {
  std::unique_ptr<Tokenizer> t;
  EXPECT_TRUE(Tokenizer::Load(::testing::TempDir() + "/nowhere", &t).IsNotFound());
  const std::string bad = ::testing::TempDir() + "/bad.model";
  std::ofstream(bad) << "\x0a\xff\xff\xff\xff\x0f garbage";
  EXPECT_TRUE(BpeTokenizer::OpenSentencePiece(bad, &t).IsCorruption());
  const std::string l2c = ::testing::TempDir() + "/bad.bin";
  std::ofstream(l2c) << "abcdefgh";
  EXPECT_TRUE(BpeTokenizer::OpenLlama2c(l2c, 512, &t).IsCorruption());
}

}  // namespace
}  // namespace specloop
