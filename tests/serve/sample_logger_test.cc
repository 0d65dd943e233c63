#include "serve/sample_logger.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "buffer/half.h"
#include "tests/serve/buffer_records.h"
#include "tests/serve/test_util.h"

namespace specloop {
namespace {

TEST(FillTopK, KeepsTheLargestLogProbsInOrderAndTheTailMass) {
  // Two rows over 6 tokens, K = 3.
  const std::vector<float> rows = {0, 1, 2, 3, 2, 0,  // ties at 2: lower id first
                                   5, 5, 5, 5, 5, 5};
  SpecStep step;
  FillTopK(rows.data(), 2, 6, 3, &step);
  ASSERT_EQ(step.topk_ids.size(), 6u);
  ASSERT_EQ(step.topk_logprobs.size(), 6u);
  ASSERT_EQ(step.tail_mass.size(), 2u);
  EXPECT_EQ(std::vector<int32_t>(step.topk_ids.begin(), step.topk_ids.begin() + 3),
            (std::vector<int32_t>{3, 2, 4}));
  double z = 0;
  for (int v = 0; v < 6; ++v) z += std::exp(rows[v]);
  for (int i = 0; i < 3; ++i) {
    const double want = rows[step.topk_ids[i]] - std::log(z);
    EXPECT_NEAR(HalfToFloat(step.topk_logprobs[i]), want, 2e-3);
  }
  const double kept = (std::exp(3.0) + 2 * std::exp(2.0)) / z;
  EXPECT_NEAR(step.tail_mass[0], 1.0 - kept, 1e-5);
  // Uniform row: ids 0, 1, 2, each log(1/6), tail 1/2.
  EXPECT_EQ(std::vector<int32_t>(step.topk_ids.begin() + 3, step.topk_ids.end()),
            (std::vector<int32_t>{0, 1, 2}));
  EXPECT_NEAR(HalfToFloat(step.topk_logprobs[4]), std::log(1.0 / 6), 2e-3);
  EXPECT_NEAR(step.tail_mass[1], 0.5, 1e-5);
}

// Against a full sort and a double-precision log-sum-exp, on rows shaped like logits (a few
// large entries over a broad base), flat rows (every entry tied: the threshold admits all),
// rows with -inf entries, and vocabularies that K does not divide.
TEST(FillTopK, EqualsAFullSortOnRandomRows) {
  std::mt19937 gen(11);
  std::normal_distribution<float> base(0.0f, 2.0f);
  std::uniform_int_distribution<int> coin(0, 9);
  struct Case { int vocab, k; };
  for (const Case c : {Case{4096, 64}, Case{1000, 64}, Case{130, 64}, Case{64, 64}, Case{5, 8},
                       Case{4097, 7}}) {
    const int num_rows = 6;
    std::vector<float> rows(static_cast<size_t>(num_rows) * c.vocab);
    for (int j = 0; j < num_rows; ++j) {
      float* x = rows.data() + static_cast<size_t>(j) * c.vocab;
      for (int v = 0; v < c.vocab; ++v) {
        switch (j) {
          case 0: x[v] = 1.5f; break;                                      // all tied
          case 1: x[v] = std::round(base(gen));  break;                    // many ties
          case 2: x[v] = coin(gen) == 0 ? -INFINITY : base(gen); break;    // -inf entries
          default: x[v] = base(gen) + (coin(gen) == 0 ? 8.0f : 0.0f);     // peaked
        }
      }
    }
    SpecStep step;
    FillTopK(rows.data(), num_rows, c.vocab, c.k, &step);
    const int K = std::min(c.k, c.vocab);
    for (int j = 0; j < num_rows; ++j) {
      const float* x = rows.data() + static_cast<size_t>(j) * c.vocab;
      std::vector<int> order(c.vocab);
      for (int v = 0; v < c.vocab; ++v) order[v] = v;
      std::sort(order.begin(), order.end(),
                [x](int a, int b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
      double m = x[order[0]], z = 0;
      for (int v = 0; v < c.vocab; ++v) z += std::exp(static_cast<double>(x[v]) - m);
      const double lse = m + std::log(z);
      double kept = 0;
      for (int i = 0; i < K; ++i) {
        const size_t at = static_cast<size_t>(j) * c.k + i;
        ASSERT_EQ(step.topk_ids[at], order[i]) << "vocab " << c.vocab << " row " << j << " i " << i;
        const double lp = x[order[i]] - lse;
        kept += std::exp(lp);
        const float got = HalfToFloat(step.topk_logprobs[at]);
        if (std::isinf(lp)) {
          EXPECT_TRUE(std::isinf(got) && got < 0);
        } else {
          EXPECT_NEAR(got, lp, 2e-3 + 1e-3 * std::fabs(lp));
        }
      }
      EXPECT_NEAR(step.tail_mass[j], std::clamp(1.0 - kept, 0.0, 1.0), 2e-5);
    }
  }
}

// A broken model's NaN logits give NaN log-probs, not a crash (the comparator sees no NaN).
TEST(FillTopK, SurvivesNaNLogits) {
  std::vector<float> rows(256, NAN);
  rows[3] = 1.0f;
  SpecStep step;
  FillTopK(rows.data(), 1, 256, 64, &step);
  EXPECT_EQ(step.topk_ids[0], 3);
  EXPECT_EQ(step.topk_ids.size(), 64u);
}

TEST(SampleLogger, WritesOneRecordPerRequestWithEveryStep) {
  serve_test::TempDir dir;
  std::unique_ptr<ReplayLogger> logger;
  ASSERT_TRUE(ReplayLogger::Open(BufferOptions(), LoggerOptions(), dir.path(), &logger).ok());
  {
    SampleLoggerOptions o;
    o.top_k = 4;
    o.worker_id = 7;
    o.target_id = "t-1";
    SampleLogger sl(logger.get(), o);
    SamplingParams sp;
    sp.temperature = 0;
    auto trace = sl.Begin("prose", "cmpl-1", 3, sp, {1, 10, 11});
    // Step 1: k = 2 at start_pos 3, one accepted; rows [3, 8].
    at::Tensor rows = at::randn({3, 8});
    sl.AddStep(trace, 3, {20, 21}, 1, rows);
    // Step 2: k = 0 (plain) at start_pos 5.
    sl.AddStep(trace, 5, {}, 0, at::randn({1, 8}));
    sl.Finish(trace, {1, 10, 11, 20, 30, 31});
  }  // drains
  ASSERT_TRUE(logger->Close().ok());
  EXPECT_EQ(logger->stats().records_written.load(), 1u);

  const std::vector<Record> got = serve_test::ReadRecords(dir.path());
  ASSERT_EQ(got.size(), 1u);
  const Record& r = got[0];
  EXPECT_EQ(r.domain, "prose");
  EXPECT_EQ(r.request_id, "cmpl-1");
  EXPECT_EQ(r.worker_id, 7u);
  EXPECT_EQ(r.draft_version, 3u);
  EXPECT_EQ(r.target_id, "t-1");
  EXPECT_EQ(r.prompt_len, 3u);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{1, 10, 11, 20, 30, 31}));
  EXPECT_EQ(r.top_k, 4u);
  ASSERT_EQ(r.steps.size(), 2u);
  EXPECT_EQ(r.steps[0].start_pos, 3u);
  EXPECT_EQ(r.steps[0].draft_tokens, (std::vector<int32_t>{20, 21}));
  EXPECT_EQ(r.steps[0].num_accepted, 1u);
  EXPECT_EQ(r.steps[0].topk_ids.size(), 12u);
  EXPECT_EQ(r.steps[1].tail_mass.size(), 1u);
  EXPECT_EQ(ValidateRecord(r), "");
}

TEST(SampleLogger, DropsStepsPastTheBacklogInsteadOfBlocking) {
  serve_test::TempDir dir;
  std::unique_ptr<ReplayLogger> logger;
  ASSERT_TRUE(ReplayLogger::Open(BufferOptions(), LoggerOptions(), dir.path(), &logger).ok());
  SampleLoggerOptions o;
  o.max_pending_steps = 4;
  o.top_k = 64;
  auto sl = std::make_unique<SampleLogger>(logger.get(), o);
  auto trace = sl->Begin("c", "cmpl-2", 0, SamplingParams(), {1});
  at::Tensor rows = at::randn({9, 4096});
  for (int i = 0; i < 2000; ++i) sl->AddStep(trace, 1, {1, 2, 3, 4, 5, 6, 7, 8}, 8, rows);
  EXPECT_GT(sl->steps_dropped(), 0u);
  sl->Finish(trace, {1});
  sl.reset();
  ASSERT_TRUE(logger->Close().ok());
}

// A prompt chunk's rows become one k = 0 step per position, in order, and count against the
// backlog as that many steps: a chunk larger than the room left is dropped whole and counted.
TEST(SampleLogger, PromptRowsAreStepsOfTheirPositionsAndCountAgainstTheBacklog) {
  serve_test::TempDir dir;
  std::unique_ptr<ReplayLogger> logger;
  ASSERT_TRUE(ReplayLogger::Open(BufferOptions(), LoggerOptions(), dir.path(), &logger).ok());
  {
    SampleLoggerOptions o;
    o.top_k = 4;
    o.max_pending_steps = 8;
    SampleLogger sl(logger.get(), o);
    auto trace = sl.Begin("c", "cmpl-3", 0, SamplingParams(), {1, 10, 11, 12, 13});
    at::Tensor rows = at::full({3, 8}, -5.0f);
    for (int i = 0; i < 3; ++i) rows[i][i + 1] = 5.0f;  // position i + 2's top token: i + 1
    sl.AddPromptRows(trace, 2, rows);
    sl.AddPromptRows(trace, 5, at::zeros({9, 8}));  // more than the backlog holds
    EXPECT_EQ(sl.steps_dropped(), 9u);
    sl.AddStep(trace, 5, {}, 0, at::randn({1, 8}));
    sl.Finish(trace, {1, 10, 11, 12, 13, 20});
  }
  ASSERT_TRUE(logger->Close().ok());
  const std::vector<Record> got = serve_test::ReadRecords(dir.path());
  ASSERT_EQ(got.size(), 1u);
  const Record& r = got[0];
  EXPECT_EQ(ValidateRecord(r), "");
  ASSERT_EQ(r.steps.size(), 4u);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(r.steps[i].start_pos, i + 2);
    EXPECT_TRUE(r.steps[i].draft_tokens.empty());
    EXPECT_EQ(r.steps[i].topk_ids.size(), 4u);
    EXPECT_EQ(r.steps[i].topk_ids[0], static_cast<int32_t>(i + 1));
  }
  EXPECT_EQ(r.steps[3].start_pos, 5u);
}

}  // namespace
}  // namespace specloop
