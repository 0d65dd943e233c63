// The logging top-K on tensors (common/spec/tensor_topk.h) against buffer/record_builder.h's
// FillTopK, the host path a replay record is built with.
#include "common/spec/tensor_topk.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "buffer/record_builder.h"
#include "common/base/half.h"
#include "common/base/rng.h"

namespace specloop {
namespace spec {
namespace {

// Rows of small integers (many ties), some NaNs and -infs, and rows of spread-out values.
std::vector<float> RandomRows(Rng* rng, int rows, int V) {
  std::vector<float> x(static_cast<size_t>(rows) * V);
  for (int r = 0; r < rows; ++r) {
    const bool ties = r % 2 == 0;
    for (int v = 0; v < V; ++v) {
      const double u = rng->Uniform();
      float& e = x[static_cast<size_t>(r) * V + v];
      e = ties ? static_cast<float>(static_cast<int>(u * 5)) : static_cast<float>(8 * u - 4);
      if (rng->Uniform() < 0.01) e = -INFINITY;
    }
  }
  return x;
}

void ExpectSameAsFillTopK(const std::vector<float>& x, int rows, int V, int top_k) {
  SpecStep want;
  FillTopK(x.data(), rows, V, top_k, &want);
  TopKTensors got;
  const at::Tensor t = at::from_blob(const_cast<float*>(x.data()), {rows, V}, at::kFloat);
  ASSERT_TRUE(TopKLogProbs(t, top_k, &got).ok());
  ASSERT_EQ(got.ids.sizes(), (at::IntArrayRef{rows, top_k}));
  const at::Tensor ids = got.ids.contiguous(), lp = got.logprobs.contiguous();
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < top_k; ++i) {
      const size_t at = static_cast<size_t>(r) * top_k + i;
      ASSERT_EQ(ids.data_ptr<int64_t>()[at], want.topk_ids[at]) << "row " << r << " rank " << i;
      const float w = HalfToFloat(want.topk_logprobs[at]);
      const float g = lp.data_ptr<float>()[at];
      if (std::isinf(w)) {
        EXPECT_EQ(g, w);
      } else {  // the record keeps half precision: 2^-11 relative
        EXPECT_NEAR(g, w, 1e-3 * std::fabs(w) + 1e-4) << "row " << r << " rank " << i;
      }
    }
    EXPECT_NEAR(got.tail_mass[r].item<float>(), want.tail_mass[r], 1e-5) << "row " << r;
  }
}

TEST(TensorTopK, SameIdsAndLogProbsAsFillTopKWithTies) {
  Rng rng(5);
  for (const int V : {7, 64, 512}) {
    for (const int top_k : {1, 5, 64}) {
      const std::vector<float> x = RandomRows(&rng, 6, V);
      ExpectSameAsFillTopK(x, 6, V, top_k);
    }
  }
}

TEST(TensorTopK, PadsPastTheVocabulary) {
  Rng rng(6);
  const std::vector<float> x = RandomRows(&rng, 3, 5);
  ExpectSameAsFillTopK(x, 3, 5, 8);
  TopKTensors got;
  ASSERT_TRUE(TopKLogProbs(at::from_blob(const_cast<float*>(x.data()), {3, 5}, at::kFloat), 8,
                           &got)
                  .ok());
  EXPECT_EQ(got.ids[0][7].item<int64_t>(), 0);
  EXPECT_EQ(got.logprobs[0][7].item<float>(), -INFINITY);
}

TEST(TensorTopK, NaNRanksLast) {
  const std::vector<float> x = {NAN, 1.0f, NAN, 0.5f, -2.0f};
  TopKTensors got;
  ASSERT_TRUE(TopKLogProbs(at::tensor(x).view({1, 5}), 5, &got).ok());
  const std::vector<int64_t> want_ids = {1, 3, 4, 0, 2};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(got.ids[0][i].item<int64_t>(), want_ids[i]) << i;
  EXPECT_TRUE(std::isnan(got.logprobs[0][3].item<float>()));
  EXPECT_TRUE(std::isfinite(got.logprobs[0][0].item<float>()));
}

TEST(TensorTopK, BadInputIsInvalidArgument) {
  TopKTensors got;
  EXPECT_TRUE(TopKLogProbs(at::zeros({2, 3}), 0, &got).IsInvalidArgument());
  EXPECT_TRUE(TopKLogProbs(at::zeros({2, 3, 4}), 2, &got).IsInvalidArgument());
  EXPECT_TRUE(TopKLogProbs(at::zeros({2, 3}, at::kLong), 2, &got).IsInvalidArgument());
  EXPECT_FALSE(got.ids.defined());
}

}  // namespace
}  // namespace spec
}  // namespace specloop
