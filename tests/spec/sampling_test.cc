// Tests of common/sampling (the processed distributions p and q that every verifier compares).
#include "common/base/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "common/base/rng.h"
#include "tests/spec/stat_util.h"

namespace specloop {
namespace {

double Sum(const std::vector<float>& v) { return std::accumulate(v.begin(), v.end(), 0.0); }

// Reference: softmax(logits / T) in double, then keep the top-k (ties toward lower ids), then
// the smallest prefix whose mass reaches top_p of the kept mass; renormalize.
std::vector<double> Reference(const std::vector<float>& logits, float t, int top_k, float top_p) {
  const int n = static_cast<int>(logits.size());
  std::vector<double> p(n);
  const double mx = *std::max_element(logits.begin(), logits.end());
  for (int i = 0; i < n; ++i) p[i] = std::exp((logits[i] - mx) / t);
  const double s = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& v : p) v /= s;
  std::vector<int> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return p[a] > p[b]; });
  int keep = (top_k > 0 && top_k < n) ? top_k : n;
  double kept = 0.0;
  for (int i = 0; i < keep; ++i) kept += p[ids[i]];
  if (top_p < 1.0f) {
    double cum = 0.0;
    for (int i = 0; i < keep; ++i) {
      cum += p[ids[i]];
      if (cum >= top_p * kept) {
        keep = i + 1;
        break;
      }
    }
  }
  std::vector<double> out(n, 0.0);
  double mass = 0.0;
  for (int i = 0; i < keep; ++i) mass += p[ids[i]];
  for (int i = 0; i < keep; ++i) out[ids[i]] = p[ids[i]] / mass;
  return out;
}

void ExpectMatches(const std::vector<float>& logits, float t, int top_k, float top_p) {
  SamplingParams params;
  params.temperature = t;
  params.top_k = top_k;
  params.top_p = top_p;
  std::vector<float> got;
  ProcessedDistribution(logits.data(), static_cast<int>(logits.size()), params, &got);
  const std::vector<double> want = Reference(logits, t, top_k, top_p);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i] == 0.0f, want[i] == 0.0) << "token " << i << " kept set differs";
    EXPECT_NEAR(got[i], want[i], 2e-6) << "token " << i;
  }
  EXPECT_NEAR(Sum(got), 1.0, 1e-5);
}

TEST(ProcessedDistribution, GreedyIsOneHotOnLowestArgmax) {
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  std::vector<float> probs;
  const std::vector<float> logits = {1.0f, 3.0f, -2.0f, 3.0f};
  ProcessedDistribution(logits.data(), 4, greedy, &probs);
  EXPECT_EQ(probs, std::vector<float>({0.0f, 1.0f, 0.0f, 0.0f}));
  EXPECT_EQ(Argmax(logits.data(), 4), 1);
}

// Argmax keeps its maximum in lanes: at every length (tails shorter than a lane included), with
// ties, -inf and NaNs, it is the first index of the largest value, as a plain scan finds it.
TEST(Argmax, IsTheFirstLargestAtAnyLength) {
  Rng rng(11);
  const float inf = std::numeric_limits<float>::infinity();
  for (int n = 1; n <= 40; ++n) {
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<float> v(n);
      for (float& x : v) {
        const double u = rng.Uniform();
        // Few distinct values, so that ties are common.
        x = u < 0.05 ? -inf : u < 0.1 ? std::nanf("") : static_cast<float>(std::floor(u * 6));
      }
      int want = -1;
      for (int i = 0; i < n; ++i) {
        if (!std::isnan(v[i]) && (want < 0 || v[i] > v[want])) want = i;
      }
      EXPECT_EQ(Argmax(v.data(), n), std::max(want, 0)) << "n " << n << " trial " << trial;
    }
  }
  EXPECT_EQ(Argmax(std::vector<float>(9, -inf).data(), 9), 0);
}

TEST(ProcessedDistribution, TemperatureIsExact) {
  const std::vector<float> logits = {2.0f, 1.0f, 0.5f, -1.0f, 0.0f};
  for (float t : {0.25f, 0.7f, 1.0f, 1.5f, 4.0f}) ExpectMatches(logits, t, 0, 1.0f);
  std::vector<float> probs;
  Softmax(logits.data(), 5, &probs);
  const std::vector<double> want = Reference(logits, 1.0f, 0, 1.0f);
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(probs[i], want[i], 1e-6);
}

TEST(ProcessedDistribution, TopKKeepsExactlyKWithLowIdTies) {
  const std::vector<float> logits = {1.0f, 2.0f, 2.0f, 0.5f, 2.0f, -1.0f};
  SamplingParams params;
  params.top_k = 2;
  std::vector<float> probs;
  ProcessedDistribution(logits.data(), 6, params, &probs);
  // Three tokens tie at the top; ids 1 and 2 are kept, each with half the mass.
  EXPECT_NEAR(probs[1], 0.5, 1e-6);
  EXPECT_NEAR(probs[2], 0.5, 1e-6);
  EXPECT_EQ(probs[4], 0.0f);
  EXPECT_EQ(probs[0], 0.0f);
  for (int k : {1, 3, 5, 6, 100}) ExpectMatches(logits, 1.0f, k, 1.0f);
}

TEST(ProcessedDistribution, TopPKeepsSmallestSetReachingP) {
  // Probabilities 0.5, 0.3, 0.15, 0.05.
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f),
                                     std::log(0.05f)};
  SamplingParams params;
  params.top_p = 0.75f;
  std::vector<float> probs;
  ProcessedDistribution(logits.data(), 4, params, &probs);
  EXPECT_NEAR(probs[0], 0.5 / 0.8, 1e-6);
  EXPECT_NEAR(probs[1], 0.3 / 0.8, 1e-6);
  EXPECT_EQ(probs[2], 0.0f);
  params.top_p = 0.4f;  // the top token alone reaches it
  ProcessedDistribution(logits.data(), 4, params, &probs);
  EXPECT_EQ(probs, std::vector<float>({1.0f, 0.0f, 0.0f, 0.0f}));
  params.top_p = 0.97f;
  ProcessedDistribution(logits.data(), 4, params, &probs);
  EXPECT_GT(probs[3], 0.0f);
  // Top-k first, then top-p relative to the top-k mass: top_k = 3 keeps mass 0.95, and
  // 0.5 + 0.3 = 0.8 already reaches 0.8 * 0.95, so two tokens stay.
  SamplingParams both;
  both.top_k = 3;
  both.top_p = 0.8f;
  ProcessedDistribution(logits.data(), 4, both, &probs);
  EXPECT_NEAR(probs[0], 0.5 / 0.8, 1e-6);
  EXPECT_NEAR(probs[1], 0.3 / 0.8, 1e-6);
  EXPECT_EQ(probs[2], 0.0f);
  ExpectMatches(logits, 1.0f, 3, 0.8f);
  ExpectMatches(logits, 2.0f, 3, 0.9f);
}

TEST(ProcessedDistribution, MatchesReferenceOnLargeVocabularies) {
  // Past 64 candidates the top-p cut grows its sorted prefix; compare with a full sort.
  Rng rng(7);
  for (int trial = 0; trial < 30; ++trial) {
    const int vocab = 500 + 97 * trial;
    std::vector<float> logits(vocab);
    for (float& l : logits) l = static_cast<float>(6.0 * rng.Uniform());
    const float t = 0.5f + 0.1f * (trial % 10);
    const int k = trial % 3 == 0 ? 0 : 50 + trial * 13;
    const float top_p = trial % 4 == 0 ? 1.0f : 0.5f + 0.1f * (trial % 5);
    SCOPED_TRACE(trial);
    ExpectMatches(logits, t, k, top_p);
  }
}

TEST(ProcessedDistribution, TinyTemperatureStaysFiniteAndPeaked) {
  // A temperature so small that 1/T overflows float must still give a one-hot distribution
  // on the argmax (it is a valid, non-greedy setting: Validate() accepts it).
  const std::vector<float> logits = {0.5f, 2.0f, 1.0f};
  for (float t : {1e-20f, 1e-38f, 1e-40f, 1e-45f}) {
    SamplingParams params;
    params.temperature = t;
    ASSERT_EQ(params.Validate(), "");
    std::vector<float> probs;
    ProcessedDistribution(logits.data(), 3, params, &probs);
    for (float v : probs) EXPECT_TRUE(std::isfinite(v)) << "T=" << t;
    EXPECT_EQ(probs, std::vector<float>({0.0f, 1.0f, 0.0f})) << "T=" << t;
  }
}

TEST(SampleFrom, FollowsTheDistributionAndNeverDrawsZeros) {
  const std::vector<float> probs = {0.1f, 0.0f, 0.4f, 0.2f, 0.0f, 0.3f};
  std::vector<int64_t> counts(6, 0);
  Rng rng(99);
  const int trials = 200000;
  for (int t = 0; t < trials; ++t) ++counts[SampleFrom(probs.data(), 6, &rng)];
  EXPECT_EQ(counts[1], 0);
  EXPECT_EQ(counts[4], 0);
  const spec_test::GofResult r =
      spec_test::GTest(counts, std::vector<double>(probs.begin(), probs.end()));
  EXPECT_GE(r.p_value, spec_test::kSignificance) << r.ToString();
  // Unnormalized input is scaled by its sum.
  const std::vector<float> scaled = {0.0f, 5.0f, 0.0f};
  EXPECT_EQ(SampleFrom(scaled.data(), 3, &rng), 1);
}

}  // namespace
}  // namespace specloop
