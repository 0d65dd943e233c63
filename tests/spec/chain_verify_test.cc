#include "common/spec/chain_verify.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "common/base/sampling.h"
#include "common/spec/acceptance.h"
#include "common/spec/distribution.h"
#include "tests/spec/cases.h"
#include "tests/spec/stat_util.h"

namespace specloop {
namespace spec {
namespace {

using spec_test::GTest;
using spec_test::GofResult;
using spec_test::kSignificance;
using Row = std::vector<float>;

constexpr int kTrials = 200000;

// A verifier under test: same signature as VerifyChain.
using ChainVerifier = std::function<Status(int k, int vocab, const int* drafts, const float* q,
                                           const float* p, Rng* rng, ChainOutcome* out)>;

// Deliberately wrong verifiers, to show that the statistics below have power.
enum class Bug { kAcceptWithQOverP, kRecoverFromP };

Status BuggyChain(Bug bug, int k, int vocab, const int* drafts, const float* q_rows,
                  const float* p_rows, Rng* rng, ChainOutcome* out) {
  out->tokens.clear();
  std::vector<double> p, q, residual;
  for (int i = 0; i < k; ++i) {
    NormalizedCopy(p_rows + i * vocab, vocab, &p);
    NormalizedCopy(q_rows + i * vocab, vocab, &q);
    const int x = drafts[i];
    const double u = rng->Uniform();
    const bool accept = bug == Bug::kAcceptWithQOverP ? (p[x] > 0.0 && u * p[x] < q[x])
                                                      : (q[x] > 0.0 && u * q[x] < p[x]);
    if (accept) {
      out->tokens.push_back(x);
      continue;
    }
    const double mass = PositivePart(p.data(), q.data(), vocab, &residual);
    const bool from_p = bug == Bug::kRecoverFromP || mass <= 0.0;
    out->num_accepted = i;
    out->tokens.push_back(SampleIndex(from_p ? p.data() : residual.data(), vocab, rng));
    return Status::OK();
  }
  NormalizedCopy(p_rows + k * vocab, vocab, &p);
  out->num_accepted = k;
  out->tokens.push_back(SampleIndex(p.data(), vocab, rng));
  return Status::OK();
}

using ChainCase = spec_test::DistCase;

// Position-independent rows: p_i and q_i are `p` and `q` rotated by i, so every position differs.
Row Rotate(const Row& r, int by) {
  Row out(r.size());
  for (size_t i = 0; i < r.size(); ++i) out[(i + by) % r.size()] = r[i];
  return out;
}

std::vector<ChainCase> Cases() { return spec_test::BaseCases(); }

struct ChainStats {
  std::vector<std::vector<int64_t>> emitted;  // [k + 1][vocab]: token at position j, if emitted
  std::vector<int64_t> accepted;               // [k + 1]: histogram of num_accepted
  std::vector<int64_t> pair;                   // [vocab * vocab]: (t0, t1) when 2+ emitted
};

// Drafts each position independently from q_i (the rows do not depend on the prefix here) and
// verifies; p_i is the law of the token at position i given that the ones before are accepted.
ChainStats RunTrials(const ChainVerifier& verify, const ChainCase& c, int k, uint64_t seed) {
  const int vocab = static_cast<int>(c.p.size());
  Row q_rows, p_rows;
  for (int i = 0; i < k; ++i) {
    const Row q = Rotate(c.q, i);
    q_rows.insert(q_rows.end(), q.begin(), q.end());
  }
  for (int i = 0; i <= k; ++i) {
    const Row p = Rotate(c.p, i);
    p_rows.insert(p_rows.end(), p.begin(), p.end());
  }
  ChainStats s;
  s.emitted.assign(k + 1, std::vector<int64_t>(vocab, 0));
  s.accepted.assign(k + 1, 0);
  s.pair.assign(vocab * vocab, 0);
  Rng rng(seed);
  std::vector<int> drafts(k);
  ChainOutcome out;
  for (int t = 0; t < kTrials; ++t) {
    for (int i = 0; i < k; ++i) drafts[i] = SampleFrom(q_rows.data() + i * vocab, vocab, &rng);
    EXPECT_TRUE(verify(k, vocab, drafts.data(), q_rows.data(), p_rows.data(), &rng, &out).ok());
    EXPECT_EQ(out.tokens.size(), static_cast<size_t>(out.num_accepted + 1));
    ++s.accepted[out.num_accepted];
    for (size_t j = 0; j < out.tokens.size(); ++j) ++s.emitted[j][out.tokens[j]];
    if (out.tokens.size() >= 2) ++s.pair[out.tokens[0] * vocab + out.tokens[1]];
  }
  return s;
}

std::vector<double> AsDouble(const Row& r) { return std::vector<double>(r.begin(), r.end()); }

// The token at each emitted position follows p at that position (G-test, level 1e-3).
GofResult WorstMarginal(const ChainStats& s, const ChainCase& c, int k) {
  GofResult worst;
  for (int j = 0; j <= k; ++j) {
    const GofResult r = GTest(s.emitted[j], AsDouble(Rotate(c.p, j)));
    if (r.p_value <= worst.p_value) worst = r;
  }
  return worst;
}

TEST(VerifyChain, EmittedTokensFollowTargetAtEveryPosition) {
  const ChainVerifier verify = VerifyChain;
  uint64_t seed = 1000;
  for (const ChainCase& c : Cases()) {
    const int vocab = static_cast<int>(c.p.size());
    for (int k = 0; k <= 4; ++k) {
      SCOPED_TRACE(c.name + " k=" + std::to_string(k));
      const ChainStats s = RunTrials(verify, c, k, ++seed);
      for (int j = 0; j <= k; ++j) {
        const GofResult r = GTest(s.emitted[j], AsDouble(Rotate(c.p, j)));
        EXPECT_GE(r.p_value, kSignificance) << "position " << j << ": " << r.ToString();
      }
      // The accepted count follows the exact law P(N >= j) = alpha_1 ... alpha_j, where
      // alpha_i = sum min(p_i, q_i).
      std::vector<double> alphas, law;
      for (int i = 0; i < k; ++i) {
        alphas.push_back(AcceptanceRate(Rotate(c.p, i).data(), Rotate(c.q, i).data(), vocab));
      }
      AcceptedCountDistribution(alphas, &law);
      const GofResult acc = GTest(s.accepted, law);
      EXPECT_GE(acc.p_value, kSignificance) << "accepted count: " << acc.ToString();
      // Two emitted tokens: the first is an accepted draft, so it follows min(p0, q0) / alpha_0,
      // and the second follows p1 independently of it.
      if (k >= 1 && alphas[0] > 0.0) {
        const Row p0 = Rotate(c.p, 0), q0 = Rotate(c.q, 0), p1 = Rotate(c.p, 1);
        std::vector<double> joint(vocab * vocab);
        for (int a = 0; a < vocab; ++a) {
          for (int b = 0; b < vocab; ++b) joint[a * vocab + b] = std::min(p0[a], q0[a]) * p1[b];
        }
        const GofResult pr = GTest(s.pair, joint);
        EXPECT_GE(pr.p_value, kSignificance) << "pair: " << pr.ToString();
      }
    }
  }
}

TEST(VerifyChain, WrongVerifiersFailTheSameTest) {
  // Same cases, trial counts and level as above; position 0 alone already rejects them.
  for (const Bug bug : {Bug::kAcceptWithQOverP, Bug::kRecoverFromP}) {
    const ChainVerifier wrong = [bug](int k, int vocab, const int* d, const float* q,
                                      const float* p, Rng* rng, ChainOutcome* out) {
      return BuggyChain(bug, k, vocab, d, q, p, rng, out);
    };
    for (const char* name : {"mixed_v5", "q_on_p_tail_v8"}) {
      for (const ChainCase& c : Cases()) {
        if (c.name != name) continue;
        for (int k : {1, 3}) {
          const GofResult r = WorstMarginal(RunTrials(wrong, c, k, 77), c, k);
          std::cout << "  wrong chain " << static_cast<int>(bug) << " " << name << " k=" << k
                    << ": " << r.ToString() << "\n";
          EXPECT_LT(r.p_value, kSignificance)
              << "bug " << static_cast<int>(bug) << " " << name << " k=" << k << " "
              << r.ToString();
        }
      }
    }
  }
}

TEST(VerifyChain, MatchesAutoregressiveSamplingOfAMarkovTarget) {
  // End to end: target and draft are Markov chains over 3 tokens (row 3 = start of sequence).
  // Speculative steps are repeated until 3 tokens exist; their joint law must be the target's
  // p(t0) p(t1 | t0) p(t2 | t1): 27 cells, G-test at level 1e-3.
  const int vocab = 3, len = 3;
  const std::vector<Row> p = {{0.6f, 0.3f, 0.1f}, {0.1f, 0.1f, 0.8f}, {0.3f, 0.4f, 0.3f},
                              {0.2f, 0.5f, 0.3f}};
  const std::vector<Row> q = {{0.2f, 0.2f, 0.6f}, {0.0f, 0.5f, 0.5f}, {0.3f, 0.4f, 0.3f},
                              {0.7f, 0.0f, 0.3f}};
  std::vector<double> joint(27);
  for (int a = 0; a < 3; ++a) {
    for (int b = 0; b < 3; ++b) {
      for (int c = 0; c < 3; ++c) joint[a * 9 + b * 3 + c] = p[3][a] * p[a][b] * p[b][c];
    }
  }
  auto run = [&](const ChainVerifier& verify, int k, uint64_t seed) {
    Rng rng(seed);
    std::vector<int64_t> counts(27, 0);
    std::vector<int> seq, drafts;
    Row q_rows, p_rows;
    ChainOutcome out;
    for (int t = 0; t < kTrials; ++t) {
      seq.clear();
      while (static_cast<int>(seq.size()) < len) {
        int prev = seq.empty() ? 3 : seq.back();
        drafts.clear();
        q_rows.clear();
        p_rows.clear();
        for (int i = 0; i <= k; ++i) {
          p_rows.insert(p_rows.end(), p[prev].begin(), p[prev].end());
          if (i == k) break;
          q_rows.insert(q_rows.end(), q[prev].begin(), q[prev].end());
          drafts.push_back(SampleFrom(q[prev].data(), vocab, &rng));
          prev = drafts.back();
        }
        EXPECT_TRUE(verify(k, vocab, drafts.data(), q_rows.data(), p_rows.data(), &rng, &out).ok());
        seq.insert(seq.end(), out.tokens.begin(), out.tokens.end());
      }
      ++counts[seq[0] * 9 + seq[1] * 3 + seq[2]];
    }
    return GTest(counts, joint);
  };
  for (int k = 1; k <= 4; ++k) {
    const GofResult r = run(VerifyChain, k, 500 + k);
    EXPECT_GE(r.p_value, kSignificance) << "k=" << k << " " << r.ToString();
  }
  const ChainVerifier wrong = [](int k, int vocab, const int* d, const float* q,
                                 const float* p, Rng* rng, ChainOutcome* out) {
    return BuggyChain(Bug::kRecoverFromP, k, vocab, d, q, p, rng, out);
  };
  const GofResult bad = run(wrong, 2, 99);
  std::cout << "  wrong chain (Markov, k=2): " << bad.ToString() << "\n";
  EXPECT_LT(bad.p_value, kSignificance) << bad.ToString();
}

TEST(VerifyChain, EdgeCases) {
  Rng rng(3);
  ChainOutcome out;
  // k = 0: one token from p0.
  const Row p1 = {0.0f, 1.0f, 0.0f};
  ASSERT_TRUE(VerifyChain(0, 3, nullptr, nullptr, p1.data(), &rng, &out).ok());
  EXPECT_EQ(out.num_accepted, 0);
  EXPECT_EQ(out.tokens, std::vector<int>({1}));
  // q == p: always accepted, then the bonus token.
  const Row pq = {0.2f, 0.5f, 0.3f, 0.2f, 0.5f, 0.3f, 0.0f, 0.0f, 1.0f};
  for (int t = 0; t < 100; ++t) {
    const int drafts[2] = {t % 3, (t / 3) % 3};
    ASSERT_TRUE(VerifyChain(2, 3, drafts, pq.data(), pq.data(), &rng, &out).ok());
    EXPECT_EQ(out.num_accepted, 2);
    EXPECT_EQ(out.tokens, std::vector<int>({drafts[0], drafts[1], 2}));
  }
  // Disjoint supports: always rejected, recovered from p itself.
  const Row q_dis = {0.0f, 0.0f, 1.0f};
  const Row p_dis = {0.5f, 0.5f, 0.0f, 0.5f, 0.5f, 0.0f};
  const int draft2[1] = {2};
  for (int t = 0; t < 100; ++t) {
    ASSERT_TRUE(VerifyChain(1, 3, draft2, q_dis.data(), p_dis.data(), &rng, &out).ok());
    EXPECT_EQ(out.num_accepted, 0);
    ASSERT_EQ(out.tokens.size(), 1u);
    EXPECT_NE(out.tokens[0], 2);
  }
  // q(x) == 0 for the drafted x is a rejection even where p(x) > 0 (as in vLLM); p == q there,
  // so the residual is empty and the token is recovered from p.
  const Row flat = {0.5f, 0.5f, 0.0f, 0.5f, 0.5f, 0.0f};
  const int bad_draft[1] = {2};
  ASSERT_TRUE(VerifyChain(1, 3, bad_draft, flat.data(), flat.data(), &rng, &out).ok());
  EXPECT_EQ(out.num_accepted, 0);
  EXPECT_NE(out.tokens[0], 2);
}

TEST(VerifyChain, RejectsBadArguments) {
  Rng rng(1);
  ChainOutcome out;
  const Row rows = {0.5f, 0.5f, 0.5f, 0.5f};
  const int ok_draft[1] = {1};
  const int bad_draft[1] = {2};
  EXPECT_TRUE(VerifyChain(1, 2, bad_draft, rows.data(), rows.data(), &rng, &out)
                  .IsInvalidArgument());
  EXPECT_TRUE(VerifyChain(-1, 2, ok_draft, rows.data(), rows.data(), &rng, &out)
                  .IsInvalidArgument());
  EXPECT_TRUE(VerifyChain(1, 2, ok_draft, nullptr, rows.data(), &rng, &out).IsInvalidArgument());
  const Row zero_q = {0.0f, 0.0f};
  EXPECT_TRUE(VerifyChain(1, 2, ok_draft, zero_q.data(), rows.data(), &rng, &out)
                  .IsInvalidArgument());
  const Row nan_p = {0.5f, NAN, 0.5f, 0.5f};
  EXPECT_TRUE(VerifyChain(1, 2, ok_draft, rows.data(), nan_p.data(), &rng, &out)
                  .IsInvalidArgument());
  EXPECT_TRUE(out.tokens.empty());
  EXPECT_TRUE(VerifyChainGreedy(1, 2, bad_draft, rows.data(), &out).IsInvalidArgument());
}

TEST(VerifyChain, SameSeedSameOutputs) {
  const ChainCase c = Cases()[1];
  const int vocab = 5, k = 3;
  Row q_rows, p_rows;
  for (int i = 0; i < k; ++i) q_rows.insert(q_rows.end(), c.q.begin(), c.q.end());
  for (int i = 0; i <= k; ++i) p_rows.insert(p_rows.end(), c.p.begin(), c.p.end());
  auto trace = [&](uint64_t seed) {
    Rng rng(seed);
    std::vector<int> all, drafts(k);
    ChainOutcome out;
    for (int t = 0; t < 2000; ++t) {
      for (int i = 0; i < k; ++i) drafts[i] = SampleFrom(c.q.data(), vocab, &rng);
      EXPECT_TRUE(VerifyChain(k, vocab, drafts.data(), q_rows.data(), p_rows.data(), &rng, &out)
                      .ok());
      all.push_back(out.num_accepted);
      all.insert(all.end(), out.tokens.begin(), out.tokens.end());
    }
    return all;
  };
  EXPECT_EQ(trace(42), trace(42));
  EXPECT_NE(trace(42), trace(43));
}

// ---- Greedy fast path ----

TEST(VerifyChainGreedy, HandBuiltLogits) {
  // Row argmaxes: 2, 0, 1, 3.
  const Row logits = {0.1f, 0.2f, 3.0f, -1.0f,  //
                      5.0f, 0.0f, 0.0f, 0.0f,   //
                      0.0f, 2.0f, 1.0f, 1.5f,   //
                      0.0f, 0.0f, 0.0f, 9.0f};
  ChainOutcome out;
  const int all_match[3] = {2, 0, 1};
  ASSERT_TRUE(VerifyChainGreedy(3, 4, all_match, logits.data(), &out).ok());
  EXPECT_EQ(out.num_accepted, 3);
  EXPECT_EQ(out.tokens, std::vector<int>({2, 0, 1, 3}));  // bonus = argmax of the last row
  const int early_mismatch[3] = {2, 1, 1};
  ASSERT_TRUE(VerifyChainGreedy(3, 4, early_mismatch, logits.data(), &out).ok());
  EXPECT_EQ(out.num_accepted, 1);
  EXPECT_EQ(out.tokens, std::vector<int>({2, 0}));
  const int first_mismatch[3] = {3, 0, 1};
  ASSERT_TRUE(VerifyChainGreedy(3, 4, first_mismatch, logits.data(), &out).ok());
  EXPECT_EQ(out.num_accepted, 0);
  EXPECT_EQ(out.tokens, std::vector<int>({2}));
  ASSERT_TRUE(VerifyChainGreedy(0, 4, nullptr, logits.data(), &out).ok());
  EXPECT_EQ(out.tokens, std::vector<int>({2}));
  // Ties go to the lowest id, as Argmax and the greedy ProcessedDistribution.
  const Row tie = {1.0f, 7.0f, 7.0f, 7.0f, 0.0f, 0.0f};
  const int d1[1] = {2};
  ASSERT_TRUE(VerifyChainGreedy(1, 3, d1, tie.data(), &out).ok());
  EXPECT_EQ(out.tokens, std::vector<int>({1}));
}

TEST(VerifyChainGreedy, AgreesWithRandomPathOnOneHotTarget) {
  // A temperature-0 target is one-hot; the random verifier must then do exactly what the greedy
  // path does, for any draft distribution that gave the drafts positive probability.
  const int vocab = 5, k = 4;
  Rng rng(11);
  const Row logits_row = {0.3f, -1.0f, 2.0f, 0.5f, 1.0f};
  for (int t = 0; t < 500; ++t) {
    Row logits, p_rows, q_rows;
    std::vector<int> drafts;
    SamplingParams greedy;
    greedy.temperature = 0.0f;
    for (int i = 0; i <= k; ++i) {
      const Row row = Rotate(logits_row, (t + i) % vocab);
      logits.insert(logits.end(), row.begin(), row.end());
      std::vector<float> one_hot;
      ProcessedDistribution(row.data(), vocab, greedy, &one_hot);
      p_rows.insert(p_rows.end(), one_hot.begin(), one_hot.end());
      if (i == k) break;
      const Row q = Rotate({0.3f, 0.1f, 0.2f, 0.25f, 0.15f}, t % vocab);
      q_rows.insert(q_rows.end(), q.begin(), q.end());
      // Drafts that often match: half the time the argmax, else a q sample.
      drafts.push_back(rng.Uniform() < 0.7 ? Argmax(row.data(), vocab)
                                            : SampleFrom(q.data(), vocab, &rng));
    }
    ChainOutcome fast, slow;
    ASSERT_TRUE(VerifyChainGreedy(k, vocab, drafts.data(), logits.data(), &fast).ok());
    ASSERT_TRUE(VerifyChain(k, vocab, drafts.data(), q_rows.data(), p_rows.data(), &rng, &slow)
                    .ok());
    EXPECT_EQ(fast.num_accepted, slow.num_accepted);
    EXPECT_EQ(fast.tokens, slow.tokens);
  }
}

}  // namespace
}  // namespace spec
}  // namespace specloop
