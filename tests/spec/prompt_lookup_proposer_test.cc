#include "common/spec/prompt_lookup_proposer.h"

#include <gtest/gtest.h>

namespace specloop {
namespace {

TEST(PromptLookupProposer, ProposesWhatFollowedTheLatestMatch) {
  PromptLookupProposer p(/*vocab=*/10, /*greedy=*/true, 2, 3);
  DraftBlock b;
  p.Propose({1, 2, 3, 4, 2, 3}, 4, &b);  // [2 3] matched at 1..2, followed by [4 2 3]
  EXPECT_EQ(b.tokens, (std::vector<int>{4, 2, 3}));
  EXPECT_TRUE(b.probs.empty());
  p.Propose({1, 2, 3, 4, 2, 3}, 2, &b);
  EXPECT_EQ(b.tokens, (std::vector<int>{4, 2}));
  // The most recent of two matches wins.
  p.Propose({5, 6, 7, 5, 6, 8, 5, 6}, 3, &b);
  EXPECT_EQ(b.tokens, (std::vector<int>{8, 5, 6}));
  // Longer n-grams take precedence over shorter ones.
  p.Propose({1, 2, 9, 3, 1, 2, 7, 8, 3, 1, 2}, 1, &b);
  EXPECT_EQ(b.tokens, (std::vector<int>{7}));  // [3 1 2] beats the later [1 2]
}

TEST(PromptLookupProposer, NothingWithoutAMatch) {
  PromptLookupProposer p(10, true, 2, 3);
  DraftBlock b;
  p.Propose({1, 2, 3, 4, 5}, 4, &b);
  EXPECT_TRUE(b.tokens.empty());
  p.Propose({1}, 4, &b);
  EXPECT_TRUE(b.tokens.empty());
  p.Propose({1, 2, 1, 2}, 0, &b);
  EXPECT_TRUE(b.tokens.empty());
}

TEST(PromptLookupProposer, OneHotDraftDistributionWhenSampling) {
  PromptLookupProposer p(5, /*greedy=*/false, 1, 2);
  DraftBlock b;
  p.Propose({3, 4, 1, 3}, 2, &b);  // [3] matched at 0, followed by [4 1]
  ASSERT_EQ(b.tokens, (std::vector<int>{4, 1}));
  ASSERT_EQ(b.probs.size(), 10u);
  for (int i = 0; i < 2; ++i) {
    for (int v = 0; v < 5; ++v) EXPECT_EQ(b.probs[i * 5 + v], v == b.tokens[i] ? 1.0f : 0.0f);
  }
}

}  // namespace
}  // namespace specloop
