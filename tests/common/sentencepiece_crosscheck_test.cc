// specloop's BPE encoder gives libsentencepiece's ids on every validation document of every
// corpus domain (and on edge cases).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <sentencepiece_processor.h>

#include "common/tokenizer/tokenizer.h"

namespace specloop {
namespace {

std::string Shared() {
  const char* env = std::getenv("SPECLOOP_SHARED");
  return env ? env : SPECLOOP_SHARED_DIR;
}

TEST(SentencePieceCrossCheck, SameIdsAsLibsentencepiece) {
  const std::string dir = Shared() + "/models/tokenizer-4k";
  sentencepiece::SentencePieceProcessor sp;
  ASSERT_TRUE(sp.Load(dir + "/tokenizer.model").ok());
  std::unique_ptr<Tokenizer> ours;
  ASSERT_TRUE(Tokenizer::Load(dir, &ours).ok());

  std::vector<std::string> texts = {"", " ", "  two  spaces  ", "\n\n", "\t tab", "a", "x\x1e",
                                    "\xF0\x9F\x98\x80 emoji", "\xFF\xFE invalid", "<s> </s> <unk>"};
  size_t docs = 0;
  for (const char* domain : {"prose", "python", "c", "legal", "docs"}) {
    std::ifstream in(Shared() + "/corpus/" + domain + "/valid.txt");
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string all = ss.str();
    ASSERT_FALSE(all.empty()) << domain;
    for (size_t start = 0; start < all.size();) {
      size_t end = all.find("\n\x1e\n", start);
      if (end == std::string::npos) end = all.size();
      texts.push_back(all.substr(start, end - start));
      start = end + 3;
      ++docs;
    }
  }
  for (const std::string& text : texts) {
    std::vector<int> expected;
    ASSERT_TRUE(sp.Encode(text, &expected).ok());
    ASSERT_EQ(ours->Encode(text), expected) << text.substr(0, 200);
  }
  EXPECT_GT(docs, 50u);
}

}  // namespace
}  // namespace specloop
