#include "serve/text_stream.h"

#include <gtest/gtest.h>

#include "tests/serve/test_util.h"

namespace specloop {
namespace {

class TextStreamTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(Tokenizer::Load(serve_test::TargetDir(), &tok_).ok());
  }
  static std::unique_ptr<Tokenizer> tok_;
};
std::unique_ptr<Tokenizer> TextStreamTest::tok_;

// Feeds ids one by one and returns everything released.
std::string Stream(TextStream* ts, const std::vector<int>& ids) {
  std::string out;
  for (int id : ids) out += ts->Push({id});
  return out + ts->Finish();
}

TEST_F(TextStreamTest, ReleasesTheSameTextAsOneDecode) {
  const std::vector<int> ids = tok_->Encode(" and the LORD said unto Moses, Go in (x) ∑ café");
  TextStream ts(tok_.get(), 1, {});
  EXPECT_EQ(Stream(&ts, ids), tok_->Decode(ids, 1));
  EXPECT_FALSE(ts.stopped());
}

TEST_F(TextStreamTest, NeverReleasesHalfAUtf8Character) {
  const std::vector<int> ids = tok_->Encode("∑∑ é ∑");
  TextStream ts(tok_.get(), 1, {});
  for (int id : ids) {
    const std::string part = ts.Push({id});
    EXPECT_EQ(CompleteUtf8Prefix(part), part.size()) << "released a partial character";
  }
}

TEST_F(TextStreamTest, CutsAtTheFirstStopStringAcrossTokens) {
  const std::string text = " and the LORD said unto Moses, Go in unto Pharaoh";
  const std::vector<int> ids = tok_->Encode(text);
  TextStream ts(tok_.get(), 1, {"Pharaoh", "unto Mo"});
  std::string out;
  for (int id : ids) {
    out += ts.Push({id});
    // A released prefix never contains (or ends inside) a stop string's complete match.
    EXPECT_EQ(out.find("unto Mo"), std::string::npos);
  }
  out += ts.Finish();
  EXPECT_TRUE(ts.stopped());
  EXPECT_EQ(out, tok_->Decode(ids, 1).substr(0, tok_->Decode(ids, 1).find("unto Mo")));
  EXPECT_EQ(ts.Push(tok_->Encode(" more")), "");  // nothing after a stop
}

TEST_F(TextStreamTest, HoldsBackAPossibleStopPrefixThenReleasesIt) {
  const std::vector<int> ids = tok_->Encode(" and the LORD said");
  TextStream ts(tok_.get(), 1, {"the LORD spake"});
  EXPECT_EQ(Stream(&ts, ids), tok_->Decode(ids, 1));  // "the LORD said" is no match: released
  EXPECT_FALSE(ts.stopped());
}

}  // namespace
}  // namespace specloop
