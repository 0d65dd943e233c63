#include "common/spec/rrs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "common/spec/distribution.h"
#include "common/spec/optimal_acceptance.h"
#include "tests/spec/cases.h"
#include "tests/spec/stat_util.h"

namespace specloop {
namespace spec {
namespace {

using spec_test::DistCase;
using spec_test::GTest;
using spec_test::GofResult;
using spec_test::kSignificance;

constexpr int kTrials = 200000;

using Verifier = std::function<Status(int vocab, const std::vector<int>& drafts, const float* q,
                                      const float* p, Rng* rng, MultiDraftOutcome* out)>;

// Deliberately wrong RRS variants, to show that the statistics below have power.
enum class Bug {
  kKeepRejectedInQ,   // q_j stays q: rejected drafts are not removed from the draft law
  kNoResidualUpdate,  // every candidate is checked against p instead of the running residual
};

Status BuggyRrs(Bug bug, int vocab, const std::vector<int>& drafts, const float* q_row,
                const float* p_row, Rng* rng, MultiDraftOutcome* out) {
  std::vector<double> p, q, r, next;
  NormalizedCopy(p_row, vocab, &p);
  NormalizedCopy(q_row, vocab, &q);
  r = p;
  for (size_t j = 0; j < drafts.size(); ++j) {
    const int x = drafts[j];
    const double u = rng->Uniform();
    if (q[x] > 0.0 && u * q[x] < r[x]) {
      out->token = x;
      out->accepted_index = static_cast<int>(j);
      return Status::OK();
    }
    if (bug != Bug::kNoResidualUpdate || j + 1 == drafts.size()) {
      const double mass = PositivePart(r.data(), q.data(), vocab, &next);
      if (mass > 0.0) {
        for (double& v : next) v /= mass;
        r = next;
      }
    }
    if (bug != Bug::kKeepRejectedInQ) {
      q[x] = 0.0;
      Normalize(&q);
    }
  }
  out->token = SampleIndex(r.data(), vocab, rng);
  out->accepted_index = -1;
  return Status::OK();
}

struct Stats {
  std::vector<int64_t> tokens;  // [vocab]
  int64_t accepted = 0;
  int64_t inconsistent = 0;  // outcomes whose accepted_index disagrees with the drafts
};

Stats RunTrials(const Verifier& verify, const DistCase& c, int n, uint64_t seed) {
  const int vocab = static_cast<int>(c.p.size());
  Stats s;
  s.tokens.assign(vocab, 0);
  Rng rng(seed);
  std::vector<int> drafts;
  MultiDraftOutcome out;
  for (int t = 0; t < kTrials; ++t) {
    EXPECT_TRUE(SampleWithoutReplacement(n, vocab, c.q.data(), &rng, &drafts).ok());
    EXPECT_TRUE(verify(vocab, drafts, c.q.data(), c.p.data(), &rng, &out).ok());
    ++s.tokens[out.token];
    if (out.accepted_index >= 0) {
      ++s.accepted;
      if (drafts[out.accepted_index] != out.token) ++s.inconsistent;
    } else if (std::count(drafts.begin(), drafts.end(), out.token) != 0) {
      ++s.inconsistent;  // a recovered token must never be one of the drafts
    }
  }
  return s;
}

std::vector<double> AsDouble(const std::vector<float>& r) {
  return std::vector<double>(r.begin(), r.end());
}

TEST(RecursiveRejection, EmittedTokenFollowsTargetAndAcceptanceIsExact) {
  uint64_t seed = 2000;
  for (const DistCase& c : spec_test::MultiDraftCases()) {
    const int vocab = static_cast<int>(c.p.size());
    for (int n = 1; n <= 4; ++n) {
      SCOPED_TRACE(c.name + " n=" + std::to_string(n));
      const Stats s = RunTrials(VerifyRecursiveRejection, c, n, ++seed);
      const GofResult r = GTest(s.tokens, AsDouble(c.p));
      EXPECT_GE(r.p_value, kSignificance) << r.ToString();
      EXPECT_EQ(s.inconsistent, 0);
      // Simulated acceptance against the exact enumeration (two-cell G-test, same level).
      const double alpha = RecursiveRejectionAcceptance(n, vocab, c.q.data(), c.p.data());
      const GofResult a = GTest({s.accepted, kTrials - s.accepted}, {alpha, 1.0 - alpha});
      EXPECT_GE(a.p_value, kSignificance) << "alpha=" << alpha << " " << a.ToString();
      // Never above the optimum for this draft law.
      const double best = OptimalAcceptanceWithoutReplacement(n, vocab, c.p.data(), c.q.data());
      EXPECT_LE(alpha, best + 1e-9);
      if (n == 1) {
        EXPECT_NEAR(alpha, OptimalAcceptanceSingleDraft(vocab, c.p.data(), c.q.data()), 1e-9);
      }
    }
  }
}

TEST(RecursiveRejection, WrongVerifiersFailTheSameTest) {
  for (const Bug bug : {Bug::kKeepRejectedInQ, Bug::kNoResidualUpdate}) {
    const Verifier wrong = [bug](int vocab, const std::vector<int>& d, const float* q,
                                 const float* p, Rng* rng, MultiDraftOutcome* out) {
      return BuggyRrs(bug, vocab, d, q, p, rng, out);
    };
    for (const DistCase& c : spec_test::MultiDraftCases()) {
      if (c.name != "mixed_v5" && c.name != "q_on_p_tail_v8") continue;
      for (int n : {2, 3}) {
        const GofResult r = GTest(RunTrials(wrong, c, n, 88).tokens, AsDouble(c.p));
        std::cout << "  wrong RRS " << static_cast<int>(bug) << " " << c.name << " n=" << n
                  << ": " << r.ToString() << "\n";
        EXPECT_LT(r.p_value, kSignificance)
            << "bug " << static_cast<int>(bug) << " " << c.name << " n=" << n << " "
            << r.ToString();
      }
    }
  }
}

TEST(RecursiveRejection, EdgeCases) {
  Rng rng(5);
  MultiDraftOutcome out;
  // q == p: the first candidate is always accepted.
  const std::vector<float> p = {0.5f, 0.3f, 0.2f};
  for (int t = 0; t < 200; ++t) {
    std::vector<int> drafts;
    ASSERT_TRUE(SampleWithoutReplacement(3, 3, p.data(), &rng, &drafts).ok());
    ASSERT_EQ(drafts.size(), 3u);
    ASSERT_TRUE(VerifyRecursiveRejection(3, drafts, p.data(), p.data(), &rng, &out).ok());
    EXPECT_EQ(out.accepted_index, 0);
    EXPECT_EQ(out.token, drafts[0]);
  }
  EXPECT_NEAR(RecursiveRejectionAcceptance(3, 3, p.data(), p.data()), 1.0, 1e-12);
  // Drafts are distinct and never exceed q's support.
  const std::vector<float> narrow = {0.0f, 0.6f, 0.0f, 0.4f};
  std::vector<int> drafts;
  ASSERT_TRUE(SampleWithoutReplacement(4, 4, narrow.data(), &rng, &drafts).ok());
  std::sort(drafts.begin(), drafts.end());
  EXPECT_EQ(drafts, std::vector<int>({1, 3}));
  // An empty draft list samples p.
  const std::vector<float> one = {0.0f, 0.0f, 1.0f};
  ASSERT_TRUE(VerifyRecursiveRejection(3, {}, p.data(), one.data(), &rng, &out).ok());
  EXPECT_EQ(out.token, 2);
  EXPECT_EQ(out.accepted_index, -1);
  // Bad input.
  EXPECT_TRUE(VerifyRecursiveRejection(3, {1, 1}, p.data(), p.data(), &rng, &out)
                  .IsInvalidArgument());
  EXPECT_TRUE(VerifyRecursiveRejection(3, {3}, p.data(), p.data(), &rng, &out)
                  .IsInvalidArgument());
  EXPECT_TRUE(SampleWithoutReplacement(0, 3, p.data(), &rng, &drafts).IsInvalidArgument());
  const std::vector<float> zero = {0.0f, 0.0f, 0.0f};
  EXPECT_TRUE(SampleWithoutReplacement(2, 3, zero.data(), &rng, &drafts).IsInvalidArgument());
}

TEST(RecursiveRejection, SameSeedSameOutputs) {
  const DistCase c = spec_test::MultiDraftCases()[1];
  auto trace = [&](uint64_t seed) {
    Rng rng(seed);
    std::vector<int> all, drafts;
    MultiDraftOutcome out;
    for (int t = 0; t < 2000; ++t) {
      EXPECT_TRUE(SampleWithoutReplacement(3, 5, c.q.data(), &rng, &drafts).ok());
      EXPECT_TRUE(VerifyRecursiveRejection(5, drafts, c.q.data(), c.p.data(), &rng, &out).ok());
      all.insert(all.end(), drafts.begin(), drafts.end());
      all.push_back(out.token);
      all.push_back(out.accepted_index);
    }
    return all;
  };
  EXPECT_EQ(trace(9), trace(9));
  EXPECT_NE(trace(9), trace(10));
}

}  // namespace
}  // namespace spec
}  // namespace specloop
