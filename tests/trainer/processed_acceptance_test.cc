// A logged position's acceptance under its request's sampling (trainer/processed_acceptance.h),
// against the exact processed distributions of full random rows (common/base/sampling.h).
#include "trainer/processed_acceptance.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/base/rng.h"
#include "trainer/distill_loss.h"

namespace specloop {
namespace trainer {
namespace {

// A standard normal draw (Box-Muller), platform-independent.
double Normal(Rng* rng) {
  const double u = 1.0 - rng->Uniform(), v = rng->Uniform();
  return std::sqrt(-2 * std::log(u)) * std::cos(6.283185307179586 * v);
}

std::vector<float> RandomLogits(int vocab, double scale, Rng* rng) {
  std::vector<float> x(vocab);
  for (float& v : x) v = static_cast<float>(scale * Normal(rng));
  return x;
}

// What serving logs for a row of target logits: its K most likely ids (lower ids first on
// ties), their raw log-probs and the mass outside them.
struct Logged {
  std::vector<int64_t> ids;
  std::vector<float> logprobs;
  double tail = 0;
  LoggedTarget View() const {
    LoggedTarget t;
    t.ids = ids.data();
    t.logprobs = logprobs.data();
    t.k = static_cast<int>(ids.size());
    t.tail = tail;
    return t;
  }
};

Logged LogTopK(const std::vector<float>& logits, int K) {
  const int V = static_cast<int>(logits.size());
  const double mx = *std::max_element(logits.begin(), logits.end());
  double z = 0;
  for (float l : logits) z += std::exp(l - mx);
  std::vector<int> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  Logged g;
  double kept = 0;
  for (int i = 0; i < K; ++i) {
    const double lp = logits[order[i]] - mx - std::log(z);
    g.ids.push_back(order[i]);
    g.logprobs.push_back(static_cast<float>(lp));
    kept += std::exp(lp);
  }
  g.tail = std::max(0.0, 1.0 - kept);
  return g;
}

double SumMin(const std::vector<float>& p, const std::vector<float>& q) {
  double s = 0;
  for (size_t i = 0; i < p.size(); ++i) s += std::min(p[i], q[i]);
  return s;
}

SamplingParams Params(float temperature, int top_k, float top_p) {
  SamplingParams s;
  s.temperature = temperature;
  s.top_k = top_k;
  s.top_p = top_p;
  return s;
}

TEST(ProcessedAcceptance, SamplingRegimes) {
  EXPECT_STREQ(SamplingRegime(Params(0, 0, 1)), "greedy");
  EXPECT_STREQ(SamplingRegime(Params(0, 5, 0.5f)), "greedy");
  EXPECT_STREQ(SamplingRegime(Params(1, 0, 1)), "sampled");
  EXPECT_STREQ(SamplingRegime(Params(0.3f, 0, 0.9f)), "sampled");
}

// The bounds hold the exact processed target probability of every logged id, and of the tail,
// and the acceptance bounds hold the exact alpha = sum_x min(p(x), q(x)) of the full rows, for
// every combination of temperature (both sides of 1), top-k (inside and beyond the logged K)
// and top-p.
TEST(ProcessedAcceptance, BoundsBracketTheExactProcessedValues) {
  const int V = 48, K = 8;
  Rng rng(11);
  int cases = 0, loose = 0;
  for (int row = 0; row < 40; ++row) {
    const std::vector<float> target = RandomLogits(V, 2.0, &rng);
    std::vector<float> draft = target;
    for (float& x : draft) x += static_cast<float>(Normal(&rng));
    const Logged g = LogTopK(target, K);
    for (float t : {0.3f, 0.7f, 1.0f, 1.6f}) {
      for (int top_k : {0, 4, K, 20}) {
        for (float top_p : {1.0f, 0.9f, 0.6f}) {
          const SamplingParams s = Params(t, top_k, top_p);
          std::vector<float> p, q;
          ProcessedDistribution(target.data(), V, s, &p);
          ProcessedDistribution(draft.data(), V, s, &q);
          ProcessedTargetBounds b;
          BoundProcessedTarget(g.View(), V, s, &b);
          double tail = 1;
          for (int i = 0; i < K; ++i) {
            const double exact = p[g.ids[i]];
            tail -= exact;
            EXPECT_LE(b.lower[i], exact + 1e-5) << row << " T " << t << " k " << top_k << " p "
                                                << top_p << " entry " << i;
            EXPECT_GE(b.upper[i] + 1e-5, exact) << row << " T " << t << " k " << top_k << " p "
                                                << top_p << " entry " << i;
          }
          EXPECT_GE(b.tail_upper + 1e-5, tail) << row << " T " << t;
          const double alpha = SumMin(p, q);
          const AcceptanceBounds a = ProcessedAcceptance(draft.data(), V, g.View(), s);
          EXPECT_LE(a.lower, alpha + 1e-5) << row << " T " << t << " k " << top_k << " p " << top_p;
          EXPECT_GE(a.upper + 1e-5, alpha) << row << " T " << t << " k " << top_k << " p " << top_p;
          ++cases;
          if (a.upper - a.lower > 1e-3) ++loose;
        }
      }
    }
  }
  // The bounds are not trivially wide: most cases pin alpha within 0.001 ...
  EXPECT_GT(loose, 0);
  EXPECT_LT(loose, cases / 2) << loose << " of " << cases;
}

// With nothing unknown about the kept set the bounds close: at temperature 1 with no cut the
// processed target is the logged distribution itself; a top-k within the logged K drops the
// tail at any temperature and top-p, so p, and alpha, are exact.
TEST(ProcessedAcceptance, ExactWhenTheTailIsKnownOrCut) {
  const int V = 48, K = 8;
  Rng rng(12);
  for (int row = 0; row < 20; ++row) {
    const std::vector<float> target = RandomLogits(V, 2.0, &rng);
    std::vector<float> draft = target;
    for (float& x : draft) x += static_cast<float>(Normal(&rng));
    const Logged g = LogTopK(target, K);
    for (const SamplingParams& s : {Params(1, 0, 1), Params(0.5f, 5, 1), Params(1.7f, K, 1), Params(0.8f, 6, 0.7f)}) {
      std::vector<float> p, q;
      ProcessedDistribution(target.data(), V, s, &p);
      ProcessedDistribution(draft.data(), V, s, &q);
      ProcessedTargetBounds b;
      BoundProcessedTarget(g.View(), V, s, &b);
      for (int i = 0; i < K; ++i) {
        EXPECT_NEAR(b.lower[i], p[g.ids[i]], 1e-6) << row;
        EXPECT_NEAR(b.upper[i], p[g.ids[i]], 1e-6) << row;
      }
      const AcceptanceBounds a = ProcessedAcceptance(draft.data(), V, g.View(), s);
      if (s.top_k > 0) {  // nothing outside the logged ids is kept: the lower bound is alpha
        EXPECT_NEAR(a.lower, SumMin(p, q), 1e-6) << row;
        EXPECT_NEAR(a.upper, SumMin(p, q), 1e-6) << row;
      }
    }
  }
}

// At temperature 1 with no cut, the two bounds are the K-bucket and K+1-bucket acceptances
// distill_loss.h computes on tensors (the estimates the trainer used before sampling counted).
TEST(ProcessedAcceptance, AtTemperatureOneTheyAreTheBucketAcceptances) {
  const int V = 40, K = 6, N = 16;
  Rng rng(13);
  std::vector<float> drafts, lps, tails;
  std::vector<int64_t> ids;
  std::vector<Logged> logged;
  for (int n = 0; n < N; ++n) {
    const std::vector<float> target = RandomLogits(V, 1.5, &rng);
    const std::vector<float> draft = RandomLogits(V, 1.5, &rng);
    logged.push_back(LogTopK(target, K));
    drafts.insert(drafts.end(), draft.begin(), draft.end());
    ids.insert(ids.end(), logged.back().ids.begin(), logged.back().ids.end());
    lps.insert(lps.end(), logged.back().logprobs.begin(), logged.back().logprobs.end());
    tails.push_back(static_cast<float>(logged.back().tail));
  }
  const at::Tensor x = at::from_blob(drafts.data(), {N, V}, at::kFloat).to(at::kDouble);
  const at::Tensor id = at::from_blob(ids.data(), {N, K}, at::kLong);
  const at::Tensor lp = at::from_blob(lps.data(), {N, K}, at::kFloat);
  const at::Tensor tail = at::from_blob(tails.data(), {N}, at::kFloat);
  const at::Tensor lower = LoggedAcceptance(x, id, lp, tail);
  const at::Tensor upper = CoarsenedAcceptance(x, id, lp, tail);
  for (int n = 0; n < N; ++n) {
    LoggedTarget t = logged[n].View();
    t.tail = tails[n];
    const AcceptanceBounds a = ProcessedAcceptance(drafts.data() + n * V, V, t, SamplingParams());
    EXPECT_NEAR(a.lower, lower[n].item<double>(), 1e-6) << n;
    EXPECT_NEAR(a.upper, upper[n].item<double>(), 1e-6) << n;
  }
}

// Renormalising over the logged entries alone would overstate them: below temperature 1 the
// tail's share shrinks but does not vanish, and the lower bound must leave room for it.
TEST(ProcessedAcceptance, TheTailIsBoundedNotDropped) {
  const int V = 1000, K = 2;
  // Two logged tokens of raw probability 0.3 each; the other 998 share 0.4 (each <= 0.3).
  const std::vector<int64_t> ids = {3, 7};
  const std::vector<float> lps = {std::log(0.3f), std::log(0.3f)};
  LoggedTarget t{ids.data(), lps.data(), K, 0.4};
  const SamplingParams s = Params(0.5f, 0, 1);
  ProcessedTargetBounds b;
  BoundProcessedTarget(t, V, s, &b);
  // At T = 0.5 a token's weight is p^2: 0.09 each logged; the tail's at most 0.09 + 0.01 (one
  // token of 0.3, one of 0.1), at least 998 * (0.4 / 998)^2 (spread evenly).
  EXPECT_NEAR(b.lower[0], 0.09 / (0.18 + 0.10), 1e-6);
  EXPECT_NEAR(b.upper[0], 0.09 / (0.18 + 0.4 * 0.4 / 998), 1e-6);
  EXPECT_LT(b.lower[0], 0.5);  // what dropping the tail would claim
  // A tail that could be as large as it is: a full row with exactly that arrangement.
  std::vector<float> logits(V, -1e4f);
  logits[3] = logits[7] = logits[1] = std::log(0.3f);
  logits[2] = std::log(0.1f);
  std::vector<float> p;
  ProcessedDistribution(logits.data(), V, s, &p);
  EXPECT_NEAR(p[3], b.lower[0], 1e-5);  // the lower bound is attained
}

// Greedy: 1 exactly when the draft's argmax is the target's, ties toward lower ids on both
// sides; top-k and top-p do not matter.
TEST(ProcessedAcceptance, GreedyScoresArgmaxAgreement) {
  const int V = 12;
  const std::vector<int64_t> ids = {5, 2, 9};
  const std::vector<float> lps = {-0.9f, -0.9f, -2.0f};  // 2 and 5 tie: the target picks 2
  const LoggedTarget t{ids.data(), lps.data(), 3, 1 - 2 * std::exp(-0.9) - std::exp(-2.0)};
  auto score = [&](const std::vector<float>& draft, const SamplingParams& s) {
    const AcceptanceBounds a = ProcessedAcceptance(draft.data(), V, t, s);
    EXPECT_EQ(a.lower, a.upper);
    return a.lower;
  };
  std::vector<float> draft(V, 0.0f);
  draft[2] = 3;
  EXPECT_EQ(score(draft, Params(0, 0, 1)), 1.0);
  EXPECT_EQ(score(draft, Params(0, 1, 0.1f)), 1.0);
  draft[5] = 3;  // a tie in the draft too: its argmax is 2
  EXPECT_EQ(score(draft, Params(0, 0, 1)), 1.0);
  draft[5] = 3.5f;
  EXPECT_EQ(score(draft, Params(0, 0, 1)), 0.0);
  draft[7] = 9;  // not logged
  EXPECT_EQ(score(draft, Params(0, 0, 1)), 0.0);
}

}  // namespace
}  // namespace trainer
}  // namespace specloop
