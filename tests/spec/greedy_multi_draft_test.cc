#include "common/spec/greedy_multi_draft.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "common/spec/distribution.h"
#include "common/spec/optimal_acceptance.h"
#include "common/spec/rrs.h"
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

// Deliberately wrong variants, to show that the statistics below have power.
enum class Bug {
  kRawQ,              // the last draft is verified against q instead of q' (not renormalized)
  kTopNotInResidual,  // the residual forgets p's mass on the top n-1 drafts
};

Status BuggyGreedy(Bug bug, int vocab, const std::vector<int>& drafts, const float* q_row,
                   const float* p_row, Rng* rng, MultiDraftOutcome* out) {
  GreedyDraftPlan plan;
  SPECLOOP_RETURN_IF_ERROR(MakeGreedyDraftPlan(static_cast<int>(drafts.size()), vocab, q_row,
                                               &plan));
  std::vector<double> p, q, residual;
  NormalizedCopy(p_row, vocab, &p);
  NormalizedCopy(q_row, vocab, &q);
  const std::vector<double>& q_used = bug == Bug::kRawQ ? q : plan.last_probs;
  const int last = drafts.back();
  const double u = rng->Uniform();
  if (q_used[last] > 0.0 && u * q_used[last] < p[last]) {
    out->token = last;
  } else {
    double mass = PositivePart(p.data(), q_used.data(), vocab, &residual);
    if (bug == Bug::kTopNotInResidual) {
      for (int x : plan.top) {
        mass -= residual[x];
        residual[x] = 0.0;
      }
    }
    out->token = SampleIndex(mass > 1e-12 ? residual.data() : p.data(), vocab, rng);
  }
  out->accepted_index = -1;
  for (size_t j = 0; j < drafts.size(); ++j) {
    if (drafts[j] == out->token) out->accepted_index = static_cast<int>(j);
  }
  return Status::OK();
}

struct Stats {
  std::vector<int64_t> tokens;  // [vocab]
  int64_t accepted = 0;
};

Stats RunTrials(const Verifier& verify, const DistCase& c, int n, uint64_t seed) {
  const int vocab = static_cast<int>(c.p.size());
  Stats s;
  s.tokens.assign(vocab, 0);
  Rng rng(seed);
  std::vector<int> drafts;
  MultiDraftOutcome out;
  for (int t = 0; t < kTrials; ++t) {
    EXPECT_TRUE(SampleGreedyDrafts(n, vocab, c.q.data(), &rng, &drafts).ok());
    EXPECT_TRUE(verify(vocab, drafts, c.q.data(), c.p.data(), &rng, &out).ok());
    ++s.tokens[out.token];
    if (out.accepted_index >= 0) {
      ++s.accepted;
      EXPECT_EQ(drafts[out.accepted_index], out.token);
    }
  }
  return s;
}

std::vector<double> AsDouble(const std::vector<float>& r) {
  return std::vector<double>(r.begin(), r.end());
}

TEST(GreedyMultiDraft, EmittedTokenFollowsTargetAndAcceptanceIsOptimal) {
  uint64_t seed = 3000;
  for (const DistCase& c : spec_test::MultiDraftCases()) {
    const int vocab = static_cast<int>(c.p.size());
    for (int n = 1; n <= std::min(4, vocab); ++n) {
      SCOPED_TRACE(c.name + " n=" + std::to_string(n));
      const Stats s = RunTrials(VerifyGreedyMultiDraft, c, n, ++seed);
      const GofResult r = GTest(s.tokens, AsDouble(c.p));
      EXPECT_GE(r.p_value, kSignificance) << r.ToString();
      const double alpha = GreedyMultiDraftAcceptance(n, vocab, c.q.data(), c.p.data());
      const GofResult a = GTest({s.accepted, kTrials - s.accepted}, {alpha, 1.0 - alpha});
      EXPECT_GE(a.p_value, kSignificance) << "alpha=" << alpha << " " << a.ToString();
      // The verifier reaches alpha* of its draft law (checked against brute force in
      // optimal_acceptance_test.cc).
      EXPECT_NEAR(alpha, OptimalAcceptanceGreedy(n, vocab, c.p.data(), c.q.data()), 1e-9);
      // Print the comparison with RRS (without replacement) so the gaps are visible.
      if (n >= 2) {
        std::cout << "  [" << c.name << " n=" << n << "] greedy alpha=" << alpha
                  << "  rrs alpha=" << RecursiveRejectionAcceptance(n, vocab, c.q.data(),
                                                                     c.p.data())
                  << "  rrs-draws alpha*="
                  << OptimalAcceptanceWithoutReplacement(n, vocab, c.p.data(), c.q.data())
                  << "\n";
      }
    }
  }
}

TEST(GreedyMultiDraft, WrongVerifiersFailTheSameTest) {
  for (const Bug bug : {Bug::kRawQ, Bug::kTopNotInResidual}) {
    const Verifier wrong = [bug](int vocab, const std::vector<int>& d, const float* q,
                                 const float* p, Rng* rng, MultiDraftOutcome* out) {
      return BuggyGreedy(bug, vocab, d, q, p, rng, out);
    };
    for (const DistCase& c : spec_test::MultiDraftCases()) {
      if (c.name != "mixed_v5" && c.name != "q_on_p_tail_v8") continue;
      for (int n : {2, 3}) {
        const GofResult r = GTest(RunTrials(wrong, c, n, 66).tokens, AsDouble(c.p));
        std::cout << "  wrong greedy " << static_cast<int>(bug) << " " << c.name << " n=" << n
                  << ": " << r.ToString() << "\n";
        EXPECT_LT(r.p_value, kSignificance)
            << "bug " << static_cast<int>(bug) << " " << c.name << " n=" << n << " "
            << r.ToString();
      }
    }
  }
}

TEST(GreedyMultiDraft, PlanTakesTopTokensWithLowIdTies) {
  const std::vector<float> q = {0.1f, 0.3f, 0.1f, 0.3f, 0.2f};
  GreedyDraftPlan plan;
  ASSERT_TRUE(MakeGreedyDraftPlan(4, 5, q.data(), &plan).ok());
  EXPECT_EQ(plan.top, std::vector<int>({1, 3, 4}));
  EXPECT_NEAR(plan.last_probs[0], 0.5, 1e-6);
  EXPECT_NEAR(plan.last_probs[2], 0.5, 1e-6);
  EXPECT_EQ(plan.last_probs[1], 0.0);
  // No mass left outside the top: the last draft is uniform over the other tokens.
  const std::vector<float> narrow = {0.0f, 1.0f, 0.0f, 0.0f};
  ASSERT_TRUE(MakeGreedyDraftPlan(2, 4, narrow.data(), &plan).ok());
  EXPECT_EQ(plan.top, std::vector<int>({1}));
  EXPECT_EQ(plan.last_probs, std::vector<double>({1.0 / 3, 0.0, 1.0 / 3, 1.0 / 3}));
  EXPECT_TRUE(MakeGreedyDraftPlan(5, 4, narrow.data(), &plan).IsInvalidArgument());
  EXPECT_TRUE(MakeGreedyDraftPlan(0, 4, narrow.data(), &plan).IsInvalidArgument());
}

TEST(GreedyMultiDraft, RejectsDraftsNotFromThePlan) {
  const std::vector<float> q = {0.1f, 0.3f, 0.1f, 0.3f, 0.2f};
  Rng rng(1);
  MultiDraftOutcome out;
  EXPECT_TRUE(VerifyGreedyMultiDraft(5, {3, 1, 0}, q.data(), q.data(), &rng, &out)
                  .IsInvalidArgument());  // top order is {1, 3}
  EXPECT_TRUE(VerifyGreedyMultiDraft(5, {1, 3, 3}, q.data(), q.data(), &rng, &out)
                  .IsInvalidArgument());  // last draft in the top
  EXPECT_TRUE(VerifyGreedyMultiDraft(5, {1, 3, 7}, q.data(), q.data(), &rng, &out)
                  .IsInvalidArgument());
  EXPECT_TRUE(VerifyGreedyMultiDraft(5, {1, 3, 0}, q.data(), q.data(), &rng, &out).ok());
}

TEST(GreedyMultiDraft, SameSeedSameOutputs) {
  const DistCase c = spec_test::MultiDraftCases()[4];
  auto trace = [&](uint64_t seed) {
    Rng rng(seed);
    std::vector<int> all, drafts;
    MultiDraftOutcome out;
    for (int t = 0; t < 2000; ++t) {
      EXPECT_TRUE(SampleGreedyDrafts(3, 8, c.q.data(), &rng, &drafts).ok());
      EXPECT_TRUE(VerifyGreedyMultiDraft(8, drafts, c.q.data(), c.p.data(), &rng, &out).ok());
      all.insert(all.end(), drafts.begin(), drafts.end());
      all.push_back(out.token);
    }
    return all;
  };
  EXPECT_EQ(trace(4), trace(4));
  EXPECT_NE(trace(4), trace(5));
}

}  // namespace
}  // namespace spec
}  // namespace specloop
