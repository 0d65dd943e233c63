// ProcessedProbsTensor (common/spec/tensor_sampling.h) against ProcessedDistribution, row by
// row, and the device path from logits (processed rows, then the tensor verifier) against the
// host path from the same logits.
#include "common/spec/tensor_sampling.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <vector>

#include "common/base/rng.h"
#include "common/spec/chain_verify.h"
#include "common/spec/tensor_verify.h"

namespace specloop {
namespace spec {
namespace {

SamplingParams RandomParams(Rng* rng, int V) {
  const float temps[] = {0.0f, 0.5f, 0.8f, 1.0f, 1.7f};
  const int ks[] = {0, 1, 5, V, V + 3};
  const float ps[] = {1.0f, 0.9f, 0.5f, 0.1f};
  SamplingParams s;
  s.temperature = temps[static_cast<int>(rng->Uniform() * 5)];
  s.top_k = ks[static_cast<int>(rng->Uniform() * 5)];
  s.top_p = ps[static_cast<int>(rng->Uniform() * 4)];
  return s;
}

// Logits: half the sequences small integers (ties at the top-k / top-p cuts), half continuous.
std::vector<float> RandomLogits(Rng* rng, int B, int R, int V) {
  std::vector<float> x(static_cast<size_t>(B) * R * V);
  for (int b = 0; b < B; ++b) {
    for (size_t i = 0; i < static_cast<size_t>(R) * V; ++i) {
      const double u = rng->Uniform();
      x[b * R * V + i] = b % 2 ? static_cast<float>(static_cast<int>(u * 6)) : static_cast<float>(10 * u - 5);
    }
  }
  return x;
}

// Rows equal up to float32 exp rounding: same support in (nearly) every row; within 1e-6 where
// the supports agree. A support can differ only where a top-p prefix's mass is within rounding
// of its target; we allow 1 row in 1000.
TEST(TensorSampling, EqualsProcessedDistribution) {
  Rng rng(3);
  int64_t rows = 0, support_differs = 0, truncated = 0;
  for (const int B : {1, 4, 16}) {
    for (int rep = 0; rep < 40; ++rep) {
      const int R = 3, V = 48;
      const std::vector<float> x = RandomLogits(&rng, B, R, V);
      std::vector<SamplingParams> params;
      for (int b = 0; b < B; ++b) params.push_back(RandomParams(&rng, V));
      at::Tensor probs;
      ASSERT_TRUE(ProcessedProbsTensor(
                      at::from_blob(const_cast<float*>(x.data()), {B, R, V}, at::kFloat), params,
                      &probs)
                      .ok());
      const at::Tensor got = probs.contiguous();
      std::vector<float> want;
      for (int b = 0; b < B; ++b) {
        for (int r = 0; r < R; ++r) {
          const size_t off = (static_cast<size_t>(b) * R + r) * V;
          ProcessedDistribution(x.data() + off, V, params[b], &want);
          const float* g = got.data_ptr<float>() + off;
          bool same_support = true;
          double diff = 0;
          int zeros = 0;
          for (int v = 0; v < V; ++v) {
            same_support = same_support && ((g[v] > 0) == (want[v] > 0));
            diff = std::max(diff, std::fabs(static_cast<double>(g[v]) - want[v]));
            zeros += want[v] == 0;
          }
          ++rows;
          truncated += zeros > 0;
          if (!same_support) {
            ++support_differs;
            continue;
          }
          EXPECT_LE(diff, 1e-6) << "B " << B << " rep " << rep << " seq " << b << " row " << r;
        }
      }
    }
  }
  std::cout << support_differs << " of " << rows << " rows differ in support (" << truncated
            << " truncated rows)\n";
  EXPECT_GT(truncated, rows / 4);
  EXPECT_LE(support_differs * 1000, rows);
}

// Exact, on ties, NaNs and -infs, including rows of only NaN and -inf.
TEST(TensorSampling, ArgmaxLowestIdEqualsArgmax) {
  Rng rng(12);
  const int R = 400, V = 9;
  std::vector<float> x(R * V);
  for (float& e : x) {
    const double u = rng.Uniform();
    e = u < 0.15 ? NAN : u < 0.3 ? -INFINITY : u < 0.35 ? INFINITY : static_cast<float>(static_cast<int>(u * 8));
  }
  const float special[][V] = {{NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN},
                              {NAN, -INFINITY, NAN, -INFINITY, NAN, NAN, NAN, NAN, NAN},
                              {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY,
                               -INFINITY, -INFINITY, NAN}};
  for (int r = 0; r < 3; ++r) std::copy(special[r], special[r] + V, x.begin() + r * V);
  const at::Tensor got =
      ArgmaxLowestId(at::from_blob(x.data(), {R / 4, 4, V}, at::kFloat)).contiguous().view({R});
  for (int r = 0; r < R; ++r) {
    ASSERT_EQ(got[r].item<int64_t>(), Argmax(x.data() + r * V, V)) << "row " << r;
  }
  EXPECT_EQ(got[1].item<int64_t>(), 1);
}

TEST(TensorSampling, BadInputIsInvalidArgument) {
  at::Tensor probs;
  SamplingParams bad;
  bad.top_p = 0.0f;
  EXPECT_TRUE(ProcessedProbsTensor(at::zeros({2, 1, 4}), {SamplingParams(), bad}, &probs)
                  .IsInvalidArgument());
  EXPECT_TRUE(ProcessedProbsTensor(at::zeros({2, 1, 4}), {SamplingParams()}, &probs)
                  .IsInvalidArgument());
  EXPECT_TRUE(
      ProcessedProbsTensor(at::zeros({2, 4}), {SamplingParams(), SamplingParams()}, &probs)
          .IsInvalidArgument());
  EXPECT_FALSE(probs.defined());
}

// From logits to emitted tokens on tensors, against ProcessedDistribution + VerifyChain on the
// host with the same uniforms (temperature 0.8, top-p 0.9, top-k 20; mixed k; B = 16).
TEST(TensorSampling, LogitsToTokensMatchTheHostPath) {
  Rng rng(9);
  const int B = 16, K = 4, V = 48;
  int64_t sequences = 0, mismatches = 0;
  SamplingParams sp;
  sp.temperature = 0.8f;
  sp.top_p = 0.9f;
  sp.top_k = 20;
  for (int rep = 0; rep < 60; ++rep) {
    const std::vector<float> pl = RandomLogits(&rng, B, K + 1, V);
    const std::vector<float> ql = RandomLogits(&rng, B, K, V);
    at::Tensor P, Q;
    ASSERT_TRUE(ProcessedProbsTensor(
                    at::from_blob(const_cast<float*>(pl.data()), {B, K + 1, V}, at::kFloat),
                    std::vector<SamplingParams>(B, sp), &P)
                    .ok());
    ASSERT_TRUE(ProcessedProbsTensor(
                    at::from_blob(const_cast<float*>(ql.data()), {B, K, V}, at::kFloat),
                    std::vector<SamplingParams>(B, sp), &Q)
                    .ok());
    // Host rows, and drafts drawn from the host q.
    std::vector<float> hp(pl.size()), hq(ql.size()), row;
    for (size_t r = 0; r < pl.size() / V; ++r) {
      ProcessedDistribution(pl.data() + r * V, V, sp, &row);
      std::copy(row.begin(), row.end(), hp.begin() + r * V);
    }
    for (size_t r = 0; r < ql.size() / V; ++r) {
      ProcessedDistribution(ql.data() + r * V, V, sp, &row);
      std::copy(row.begin(), row.end(), hq.begin() + r * V);
    }
    std::vector<int> tokens(B * K), ks(B);
    std::vector<Rng> rngs;
    for (int b = 0; b < B; ++b) {
      ks[b] = static_cast<int>(rng.Uniform() * (K + 1));
      rngs.emplace_back(rep * 100 + b);
      for (int i = 0; i < K; ++i) tokens[b * K + i] = SampleFrom(hq.data() + (b * K + i) * V, V, &rng);
    }
    std::vector<Rng*> ptrs;
    for (Rng& r : rngs) ptrs.push_back(&r);
    at::Tensor packed;
    ASSERT_TRUE(VerifyChainTensors(P, Q, at::from_blob(tokens.data(), {B, K}, at::kInt).to(at::kLong),
                                   ChainControl(ks, K, ptrs), &packed)
                    .ok());
    ChainBatchOutcome got;
    ASSERT_TRUE(UnpackChainOutcomes(packed, &got).ok());
    for (int b = 0; b < B; ++b) {
      Rng host_rng(rep * 100 + b);
      ChainOutcome want;
      ASSERT_TRUE(VerifyChain(ks[b], V, tokens.data() + b * K, hq.data() + b * K * V,
                              hp.data() + b * (K + 1) * V, &host_rng, &want)
                      .ok());
      ++sequences;
      mismatches += got.outcomes[b].tokens != want.tokens;
    }
  }
  std::cout << mismatches << " of " << sequences << " sequences differ\n";
  EXPECT_LE(mismatches * 1000, sequences);
}

}  // namespace
}  // namespace spec
}  // namespace specloop
