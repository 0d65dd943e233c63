#include "trainer/training_examples.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <utility>
#include <vector>

#include "common/base/half.h"
#include "trainer/distill_loss.h"

namespace specloop {
namespace trainer {
namespace {

Record WithTokens(size_t n) {
  Record r;
  r.tokens.assign(n, 1);
  return r;
}

std::vector<size_t> Sizes(const std::vector<std::vector<const Record*>>& groups) {
  std::vector<size_t> out;
  for (const auto& g : groups) {
    size_t tokens = 0;
    for (const Record* r : g) tokens += r->tokens.size();
    out.push_back(tokens);
  }
  return out;
}

// A step with one row whose top entry is `id` (K = 2: id and id + 1, the rest in the tail).
SpecStep OneRow(uint32_t pos, int32_t id) {
  SpecStep st;
  st.start_pos = pos;
  st.topk_ids = {id, id + 1};
  st.topk_logprobs = {FloatToHalf(-0.5f), FloatToHalf(-2.0f)};
  st.tail_mass = {0.2f};
  return st;
}

std::vector<int64_t> TopIds(const PositionBatch& b) {
  const at::Tensor first = b.target_ids.select(1, 0).contiguous();
  return std::vector<int64_t>(first.data_ptr<int64_t>(), first.data_ptr<int64_t>() + first.numel());
}

// Serving logs the target's rows at prompt positions too (steps at start_pos < prompt_len):
// training takes them, evaluation (Positions::kGenerated) only what the target generated.
TEST(BuildPositionBatch, PromptRowsAreTrainedOnButNotEvaluated) {
  Record r;
  r.prompt_len = 4;
  r.tokens = {1, 5, 6, 7, 8, 9};
  r.top_k = 2;
  for (uint32_t p = 1; p < 4; ++p) r.steps.push_back(OneRow(p, 10 + p));
  r.steps.push_back(OneRow(4, 20));  // the first generated token
  SpecStep two = OneRow(5, 30);      // k = 1, rejected: row 0 only
  two.draft_tokens = {3};
  two.topk_ids.insert(two.topk_ids.end(), {31, 32});
  two.topk_logprobs.insert(two.topk_logprobs.end(), {FloatToHalf(-0.1f), FloatToHalf(-3.0f)});
  two.tail_mass.push_back(0.1f);
  r.steps.push_back(two);
  const std::vector<const Record*> ptrs = {&r};

  PositionBatch all, generated;
  BuildPositionBatch(ptrs, 64, 1024, Positions::kAll, &all);
  BuildPositionBatch(ptrs, 64, 1024, Positions::kGenerated, &generated);
  ASSERT_EQ(all.size(), 5);
  EXPECT_EQ(all.logit_rows, (std::vector<std::vector<int64_t>>{{0, 1, 2, 3, 4}}));
  EXPECT_EQ(all.inputs[0], (std::vector<int64_t>{1, 5, 6, 7, 8}));
  EXPECT_EQ(TopIds(all), (std::vector<int64_t>{11, 12, 13, 20, 30}));
  ASSERT_EQ(generated.size(), 2);
  EXPECT_EQ(generated.logit_rows, (std::vector<std::vector<int64_t>>{{3, 4}}));
  EXPECT_EQ(TopIds(generated), (std::vector<int64_t>{20, 30}));
}

TEST(SplitForForward, BoundsTheTokensOfEveryGroupAndKeepsOrder) {
  std::vector<Record> records;
  for (size_t n : {100, 200, 300, 50, 900, 10, 10, 500, 12}) records.push_back(WithTokens(n));
  std::vector<const Record*> ptrs;
  for (const Record& r : records) ptrs.push_back(&r);
  const auto groups = SplitForForward(ptrs, 0, 512);
  // 900 > 512 goes alone; no other group passes 512 (500 + 12 fills one exactly).
  EXPECT_EQ(Sizes(groups), (std::vector<size_t>{300, 350, 900, 20, 512}));
  std::vector<const Record*> flat;
  for (const auto& g : groups) {
    ASSERT_FALSE(g.empty());
    flat.insert(flat.end(), g.begin(), g.end());
  }
  EXPECT_EQ(flat, ptrs);
}

TEST(SplitForForward, BoundsRecordsPerGroupToo) {
  std::vector<Record> records(7, WithTokens(10));
  std::vector<const Record*> ptrs;
  for (const Record& r : records) ptrs.push_back(&r);
  const auto groups = SplitForForward(ptrs, 3, kMaxForwardTokens);
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(groups[0].size(), 3u);
  EXPECT_EQ(groups[1].size(), 3u);
  EXPECT_EQ(groups[2].size(), 1u);
  EXPECT_TRUE(SplitForForward({}, 3, kMaxForwardTokens).empty());
}

// Trainer::TrainStep runs a step as groups, each group's mean loss weighted by its share of
// the positions, gradients accumulating: the same loss and gradient as one pass over all.
TEST(SplitForForward, WeightedGroupLossesEqualTheLossOfOnePass) {
  at::manual_seed(7);
  const int64_t N = 12, V = 32, K = 4;
  const at::Tensor logits = at::randn({N, V}, at::kDouble);
  const at::Tensor ids = at::randperm(V, at::kLong).narrow(0, 0, K).repeat({N, 1});
  const at::Tensor lps = at::log_softmax(at::randn({N, K}, at::kDouble), 1) - 0.1;
  const at::Tensor tail = at::full({N}, 1 - std::exp(-0.1), at::kDouble);
  const ObjectiveSpec spec{Objective::kJsd, 0.5};

  at::Tensor whole = logits.clone().requires_grad_(true);
  at::Tensor one = DistillLoss(spec, whole, ids, lps, tail, at::Tensor());
  one.backward();

  at::Tensor parts = logits.clone().requires_grad_(true);
  double sum = 0;
  for (auto [from, n] : {std::pair<int64_t, int64_t>{0, 5}, {5, 7}}) {
    at::Tensor l = DistillLoss(spec, parts.narrow(0, from, n), ids.narrow(0, from, n),
                               lps.narrow(0, from, n), tail.narrow(0, from, n), at::Tensor()) *
                   (static_cast<double>(n) / N);
    l.backward();
    sum += l.item<double>();
  }
  EXPECT_NEAR(sum, one.item<double>(), 1e-12);
  EXPECT_TRUE(at::allclose(parts.grad(), whole.grad(), 1e-10, 1e-12));
}

}  // namespace
}  // namespace trainer
}  // namespace specloop
