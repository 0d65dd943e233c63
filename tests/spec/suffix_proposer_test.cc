// SuffixIndex and SuffixProposer: what is proposed (longest match, most frequent continuation,
// the probability threshold), its expected acceptance, the memory bound under eviction, and the
// index's counts and proposals against a brute force over the retained sequences.
//
// No statistical exactness check here: proposals are deterministic, so their q is one-hot (the
// rows checked below), and the verifier's exactness for any q, one-hot included, is tested in
// chain_verify_test.cc.
#include "common/spec/suffix_proposer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <random>
#include <utility>
#include <vector>

namespace specloop {
namespace {

using Tokens = std::vector<int>;

TEST(SuffixProposer, ProposesWhatFollowedTheLongestMatch) {
  SuffixIndex index;
  index.Add({1, 2, 3, 4, 5, 6});
  index.Add({9, 3, 4, 7, 8});
  SuffixProposer p(/*vocab=*/10, /*greedy=*/true, &index);
  DraftBlock b;
  // [2 3 4] occurs once, followed by [5 6]; the shorter [3 4] would be ambiguous.
  p.Propose({0, 2, 3, 4}, 4, &b);
  EXPECT_EQ(b.tokens, (Tokens{5, 6}));  // only 2 tokens follow
  EXPECT_EQ(p.match_length(), 3);
  EXPECT_EQ(p.match_count(), 1);
  EXPECT_TRUE(b.probs.empty());
  p.Propose({0, 2, 3, 4}, 1, &b);  // max_k respected
  EXPECT_EQ(b.tokens, (Tokens{5}));
  p.Propose({8, 9, 3}, 8, &b);  // [9 3] then [4 7 8]
  EXPECT_EQ(b.tokens, (Tokens{4, 7, 8}));
  EXPECT_EQ(p.match_length(), 2);
}

TEST(SuffixProposer, NothingWithoutAMatch) {
  SuffixIndex index;
  SuffixProposer p(10, true, &index);
  DraftBlock b;
  p.Propose({1, 2, 3}, 4, &b);  // empty index
  EXPECT_TRUE(b.tokens.empty());
  index.Add({1, 2, 3});
  p.Propose({5, 6}, 4, &b);  // no token of the context occurs
  EXPECT_TRUE(b.tokens.empty());
  EXPECT_EQ(p.match_length(), 0);
  EXPECT_EQ(p.expected_accepted(), 0.0);
  p.Propose({7, 3}, 4, &b);  // [3] occurs only at the end of a sequence: nothing follows
  EXPECT_TRUE(b.tokens.empty());
  p.Propose({1, 2}, 0, &b);
  EXPECT_TRUE(b.tokens.empty());
  p.Propose({}, 4, &b);
  EXPECT_TRUE(b.tokens.empty());
  // A longest match with no continuation gives way to a shorter one that has one.
  index.Add({3, 9});
  p.Propose({2, 3}, 4, &b);
  EXPECT_EQ(b.tokens, (Tokens{9}));
  EXPECT_EQ(p.match_length(), 1);
  EXPECT_DOUBLE_EQ(p.expected_accepted(), 0.5);  // [3] twice, followed by 9 once
}

TEST(SuffixProposer, OneHotDraftDistributionWhenSampling) {
  SuffixIndex index;
  index.Add({3, 4, 1, 2});
  SuffixProposer p(5, /*greedy=*/false, &index);
  DraftBlock b;
  p.Propose({0, 3}, 2, &b);
  ASSERT_EQ(b.tokens, (Tokens{4, 1}));
  ASSERT_EQ(b.probs.size(), 10u);
  for (int i = 0; i < 2; ++i) {
    for (int v = 0; v < 5; ++v) EXPECT_EQ(b.probs[i * 5 + v], v == b.tokens[i] ? 1.0f : 0.0f);
  }
  EXPECT_TRUE(b.parents.empty());
  p.Propose({0, 0}, 2, &b);  // nothing proposed: no rows
  EXPECT_TRUE(b.probs.empty());
}

// The companion that shows the frequency rule matters: the most frequent continuation is
// neither the first child inserted, nor the most recent, nor the smallest token.
TEST(SuffixProposer, MostFrequentContinuationWins) {
  SuffixIndex index;
  index.Add({1, 2, 5, 6});  // first
  index.Add({1, 2, 7, 8});
  index.Add({1, 2, 7, 8});
  index.Add({1, 2, 3, 4});  // most recent, smallest token
  SuffixProposer p(10, true, &index);
  DraftBlock b;
  p.Propose({1, 2}, 4, &b);
  EXPECT_EQ(b.tokens, (Tokens{7, 8}));
  EXPECT_EQ(p.match_count(), 4);
  EXPECT_EQ(p.token_probs(), (std::vector<double>{0.5, 0.5}));
  // Once [1 2 5 ...] is the most frequent, it wins; among equals, the newest.
  index.Add({1, 2, 5, 6});
  index.Add({1, 2, 5, 6});
  p.Propose({1, 2}, 4, &b);
  EXPECT_EQ(b.tokens, (Tokens{5, 6}));
  index.Add({1, 2, 7, 8});  // 3 and 3: the newest is [1 2 7 8]
  p.Propose({1, 2}, 4, &b);
  EXPECT_EQ(b.tokens, (Tokens{7, 8}));
}

TEST(SuffixProposer, ThresholdStopsOnALowFrequencyBranch) {
  SuffixIndex index;
  // [1 2 3] then 5 (10 of 12) or 6 (2 of 12); after [1 2 3 5], ten tokens once each.
  for (int i = 0; i < 10; ++i) index.Add({1, 2, 3, 5, 20 + i});
  for (int i = 0; i < 2; ++i) index.Add({1, 2, 3, 6, 40 + i});
  DraftBlock b;
  SuffixProposer p(64, true, &index);  // min_prob 0.1
  p.Propose({1, 2}, 8, &b);
  // 3: 1; 5: 10/12; then 1/10 would make 1/12 < 0.1: the branch after 5 is not proposed.
  EXPECT_EQ(b.tokens, (Tokens{3, 5}));
  EXPECT_DOUBLE_EQ(p.expected_accepted(), 1.0 + 10.0 / 12);
  SuffixProposer loose(64, true, &index, SuffixProposer::kDefaultMaxMatch, 0.05);
  loose.Propose({1, 2}, 8, &b);
  EXPECT_EQ(b.tokens, (Tokens{3, 5, 29}));  // ten equals: the newest
  EXPECT_DOUBLE_EQ(loose.token_probs()[2], 10.0 / 12 / 10);
  SuffixProposer strict(64, true, &index, SuffixProposer::kDefaultMaxMatch, 0.9);
  strict.Propose({1, 2}, 8, &b);
  EXPECT_EQ(b.tokens, (Tokens{3}));
  // A low-frequency first branch proposes nothing: after [9], eleven tokens once each.
  for (int i = 0; i < 11; ++i) index.Add({9, 50 + i});
  p.Propose({9}, 8, &b);
  EXPECT_TRUE(b.tokens.empty());
  EXPECT_EQ(p.match_length(), 1);
  EXPECT_EQ(p.match_count(), 11);
}

TEST(SuffixProposer, ExpectedAcceptedIsTheSumOfRunningProducts) {
  SuffixIndex index;
  for (int i = 0; i < 3; ++i) index.Add({1, 2, 3, 4, 5});
  index.Add({1, 2, 3, 6, 7});
  index.Add({1, 2, 8});
  SuffixProposer p(10, true, &index);
  DraftBlock b;
  p.Propose({0, 1, 2}, 8, &b);
  // [1 2] x5: 3 (4/5 = 0.8); [1 2 3] x4: 4 (3/4, product 0.6); [1 2 3 4] x3: 5 (1, 0.6).
  ASSERT_EQ(b.tokens, (Tokens{3, 4, 5}));
  ASSERT_EQ(p.token_probs().size(), 3u);
  EXPECT_DOUBLE_EQ(p.token_probs()[0], 0.8);
  EXPECT_DOUBLE_EQ(p.token_probs()[1], 0.6);
  EXPECT_DOUBLE_EQ(p.token_probs()[2], 0.6);
  EXPECT_DOUBLE_EQ(p.expected_accepted(), 0.8 + 0.6 + 0.6);
  p.Propose({0, 1, 2}, 2, &b);
  EXPECT_DOUBLE_EQ(p.expected_accepted(), 0.8 + 0.6);
}

TEST(SuffixIndex, StaysWithinItsTokenCapAndForgetsTheOldest) {
  SuffixIndex::Options o;
  o.max_tokens = 100;
  o.max_depth = 16;
  SuffixIndex index(o);
  SuffixProposer p(100000, true, &index);
  DraftBlock b;
  auto seq = [](int j) {  // sequence j: tokens unique to it
    Tokens s;
    for (int t = 0; t < 10; ++t) s.push_back(1000 * j + t);
    return s;
  };
  for (int j = 0; j < 50; ++j) {
    index.Add(seq(j));
    EXPECT_LE(index.num_tokens(), 100);
    EXPECT_LE(index.num_nodes(), 2 * index.num_tokens() + 1);
  }
  EXPECT_EQ(index.num_sequences(), 10);  // 40..49
  const Tokens old = seq(39), fresh = seq(40), newest = seq(49);
  EXPECT_EQ(index.Count(old.data(), 2), 0);
  p.Propose({old[0], old[1]}, 3, &b);
  EXPECT_TRUE(b.tokens.empty());
  p.Propose({fresh[0], fresh[1]}, 3, &b);
  EXPECT_EQ(b.tokens, (Tokens(fresh.begin() + 2, fresh.begin() + 5)));
  p.Propose({newest[0]}, 3, &b);
  EXPECT_EQ(b.tokens, (Tokens(newest.begin() + 1, newest.begin() + 4)));
  // Re-adding what is there does not grow the index.
  const int64_t nodes = index.num_nodes();
  for (int j = 40; j < 50; ++j) index.Add(seq(j));
  EXPECT_EQ(index.num_nodes(), nodes);
  // A sequence longer than the cap keeps its last max_tokens tokens, alone.
  Tokens big;
  for (int t = 0; t < 150; ++t) big.push_back(500000 + t);
  index.Add(big);
  EXPECT_EQ(index.num_tokens(), 100);
  EXPECT_EQ(index.num_sequences(), 1);
  EXPECT_EQ(index.Count(&big[49], 1), 0);
  EXPECT_EQ(index.Count(&big[50], 16), 1);
  EXPECT_LE(index.num_nodes(), 2 * 100 + 1);
}

// Brute force over the retained sequences: occurrences, and the greedy walk of Speculate.
struct Retained {
  std::deque<std::pair<int64_t, Tokens>> seqs;  // (id, tokens), oldest first
  int64_t next_id = 0, tokens = 0, cap = 0;

  void Add(Tokens s) {
    if (s.empty()) return;
    if (static_cast<int64_t>(s.size()) > cap) s.erase(s.begin(), s.end() - cap);
    while (!seqs.empty() && tokens + static_cast<int64_t>(s.size()) > cap) {
      tokens -= seqs.front().second.size();
      seqs.pop_front();
    }
    tokens += s.size();
    seqs.emplace_back(next_id++, std::move(s));
  }
  // Occurrences of w, and the newest sequence holding one (-1: none).
  std::pair<int64_t, int64_t> Count(const Tokens& w) const {
    int64_t n = 0, newest = -1;
    for (const auto& [id, s] : seqs) {
      for (size_t i = 0; i + w.size() <= s.size(); ++i) {
        if (std::equal(w.begin(), w.end(), s.begin() + i)) {
          ++n;
          newest = id;
        }
      }
    }
    return {n, newest};
  }
  // The best continuation x of w (|w| < depth): (count, newest) largest; -1 when none.
  int Best(const Tokens& w, int vocab, int64_t* count) const {
    int best = -1;
    std::pair<int64_t, int64_t> best_key{0, -1};
    for (int x = 0; x < vocab; ++x) {
      Tokens wx = w;
      wx.push_back(x);
      const auto key = Count(wx);
      if (key.first > 0 && key > best_key) {
        best_key = key;
        best = x;
      }
    }
    *count = best_key.first;
    return best;
  }
  void Speculate(const Tokens& ctx, int max_match, int depth, int max_k, double min_prob, int vocab,
                 SuffixIndex::Speculation* out) const {
    *out = {};
    int64_t c;
    int m = std::min({max_match, depth, static_cast<int>(ctx.size())});
    for (; m > 0; --m) {
      const Tokens w(ctx.end() - m, ctx.end());
      if (Count(w).first > 0 && m < depth && Best(w, vocab, &c) >= 0) break;
    }
    if (m == 0) return;
    Tokens w(ctx.end() - m, ctx.end());
    out->match_length = m;
    out->match_count = Count(w).first;
    double p = 1.0;
    while (static_cast<int>(out->tokens.size()) < max_k && static_cast<int>(w.size()) < depth) {
      const int x = Best(w, vocab, &c);
      if (x < 0) break;
      p *= static_cast<double>(c) / Count(w).first;
      if (p < min_prob) break;
      out->tokens.push_back(x);
      out->probs.push_back(p);
      w.push_back(x);
    }
  }
};

TEST(SuffixIndex, MatchesABruteForceUnderEviction) {
  constexpr int kVocab = 4, kDepth = 8, kMaxMatch = 6;
  std::mt19937 rng(29);
  for (int cap : {1, 37, 200}) {
    SuffixIndex::Options o;
    o.max_depth = kDepth;
    o.max_tokens = cap;
    SuffixIndex index(o);
    Retained ref;
    ref.cap = cap;
    auto random_tokens = [&](int n) {
      // Skewed toward token 0 so that counts differ and long repeats occur.
      std::discrete_distribution<int> token({5, 3, 1, 1});
      Tokens s(n);
      for (int& t : s) t = token(rng);
      return s;
    };
    for (int step = 0; step < 60; ++step) {
      const Tokens s = random_tokens(std::uniform_int_distribution<int>(0, 30)(rng));
      index.Add(s);
      ref.Add(s);
      ASSERT_EQ(index.num_tokens(), ref.tokens);
      ASSERT_EQ(index.num_sequences(), static_cast<int64_t>(ref.seqs.size()));
      ASSERT_LE(index.num_nodes(), 2 * index.num_tokens() + 1);
      // The compacted trie of a set of suffixes is unique: eviction leaves no stale node (a
      // node neither branching nor ending a suffix), so the index has the nodes of a fresh one.
      SuffixIndex fresh(o);
      for (const auto& [id, r] : ref.seqs) fresh.Add(r);
      ASSERT_EQ(index.num_nodes(), fresh.num_nodes()) << "cap " << cap << " step " << step;
      // Counts of every string of the retained sequences, and of random strings.
      for (const auto& [id, r] : ref.seqs) {
        for (size_t i = 0; i < r.size(); ++i) {
          for (size_t n = 1; n <= kDepth && i + n <= r.size(); ++n) {
            const Tokens w(r.begin() + i, r.begin() + i + n);
            ASSERT_EQ(index.Count(w.data(), static_cast<int>(n)), ref.Count(w).first)
                << "cap " << cap << " step " << step;
          }
        }
      }
      for (int q = 0; q < 20; ++q) {
        const Tokens w = random_tokens(std::uniform_int_distribution<int>(1, kDepth)(rng));
        ASSERT_EQ(index.Count(w.data(), static_cast<int>(w.size())), ref.Count(w).first);
      }
      // Proposals, at two thresholds.
      for (int q = 0; q < 10; ++q) {
        const Tokens ctx = random_tokens(std::uniform_int_distribution<int>(0, 10)(rng));
        for (double min_prob : {0.0, 0.3}) {
          SuffixIndex::Speculation got, want;
          index.Speculate(ctx, kMaxMatch, 5, min_prob, &got);
          ref.Speculate(ctx, kMaxMatch, kDepth, 5, min_prob, kVocab, &want);
          ASSERT_EQ(got.tokens, want.tokens) << "cap " << cap << " step " << step;
          ASSERT_EQ(got.match_length, want.match_length);
          ASSERT_EQ(got.match_count, want.match_count);
          ASSERT_EQ(got.probs.size(), want.probs.size());
          for (size_t i = 0; i < got.probs.size(); ++i) {
            EXPECT_DOUBLE_EQ(got.probs[i], want.probs[i]);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace specloop
