// RecordBuilder's contract (buffer/record_builder.h): top-K in decreasing order with ties
// toward lower ids, tail mass = 1 - sum of the kept probabilities, prompt rows as k = 0 steps
// at their positions, logits and log-probs alike, and malformed input refused with nothing added.
#include "buffer/record_builder.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "common/base/half.h"

namespace specloop {
namespace {

RecordInfo Info(int top_k) {
  RecordInfo info;
  info.domain = "python";
  info.request_id = "req-1";
  info.worker_id = 3;
  info.draft_version = 9;
  info.target_id = "t";
  info.sampling.temperature = 0.7f;
  info.sampling.seed = 42;
  info.top_k = top_k;
  return info;
}

// log(sum(exp(x))) in double.
double LogSumExp(const float* x, int n) {
  double m = -INFINITY;
  for (int v = 0; v < n; ++v) m = std::max(m, static_cast<double>(x[v]));
  double z = 0;
  for (int v = 0; v < n; ++v) z += std::exp(x[v] - m);
  return m + std::log(z);
}

// Checks one position's entries of `s` against its row: ids in decreasing score, ties toward
// the lower id, log-probs within fp16 rounding, tail = 1 - kept mass (from the exact log-probs,
// and from the stored fp16 ones within their rounding).
void ExpectPosition(const SpecStep& s, int j, int K, const float* row, int vocab) {
  const double lse = LogSumExp(row, vocab);
  double kept_exact = 0, kept_stored = 0;
  for (int i = 0; i < K; ++i) {
    const int id = s.topk_ids[static_cast<size_t>(j) * K + i];
    ASSERT_GE(id, 0);
    ASSERT_LT(id, vocab);
    if (i > 0) {
      const int prev = s.topk_ids[static_cast<size_t>(j) * K + i - 1];
      EXPECT_TRUE(row[prev] > row[id] || (row[prev] == row[id] && prev < id))
          << "position " << j << " entry " << i;
    }
    const double lp = row[id] - lse;
    const float stored = HalfToFloat(s.topk_logprobs[static_cast<size_t>(j) * K + i]);
    EXPECT_NEAR(stored, lp, 1e-3 * (1 + std::fabs(lp)));
    kept_exact += std::exp(lp);
    kept_stored += std::exp(static_cast<double>(stored));
  }
  // No entry outside the kept ones scores above the last kept one.
  const float last = row[s.topk_ids[static_cast<size_t>(j) * K + K - 1]];
  int above = 0;
  for (int v = 0; v < vocab; ++v) above += row[v] > last;
  EXPECT_LT(above, K);
  EXPECT_NEAR(s.tail_mass[j], 1.0 - kept_exact, 1e-5);
  EXPECT_NEAR(s.tail_mass[j], 1.0 - kept_stored, 2e-3);
}

TEST(RecordBuilder, TiesGoToLowerIdsAndTheTailIsTheMassLeftOut) {
  // vocab 8, K = 3, k = 1: two rows. Row 0 ties at 2.0 (ids 1, 4, 6); row 1 all equal.
  const std::vector<float> rows = {0, 2, 1, -1, 2, 0.5f, 2, 0,
                                   3, 3, 3, 3, 3, 3, 3, 3};
  RecordBuilder b(Info(3), 2);
  ASSERT_TRUE(b.AddStep(2, {7}, 1, rows.data(), 2, 8).ok());
  Record r;
  ASSERT_TRUE(b.Finish({1, 2, 7, 5}, &r).ok());
  ASSERT_EQ(r.steps.size(), 1u);
  const SpecStep& s = r.steps[0];
  EXPECT_EQ(s.topk_ids, (std::vector<int32_t>{1, 4, 6, 0, 1, 2}));
  for (int j = 0; j < 2; ++j) ExpectPosition(s, j, 3, rows.data() + 8 * j, 8);
  EXPECT_NEAR(s.tail_mass[1], 5.0 / 8, 1e-6);
  EXPECT_EQ(s.start_pos, 2u);
  EXPECT_EQ(s.draft_tokens, (std::vector<int32_t>{7}));
  EXPECT_EQ(s.num_accepted, 1u);
}

TEST(RecordBuilder, RandomRowsKeepTheContract) {
  std::mt19937 gen(5);
  std::normal_distribution<float> score(0.0f, 3.0f);
  const int vocab = 300, K = 16, k = 4;
  std::vector<float> rows(static_cast<size_t>(k + 1) * vocab);
  for (float& x : rows) x = std::round(score(gen) * 2) / 2;  // many ties
  RecordBuilder b(Info(K), 5);
  ASSERT_TRUE(b.AddStep(5, {1, 2, 3, 4}, 2, rows.data(), k + 1, vocab).ok());
  Record r;
  ASSERT_TRUE(b.Finish({0, 1, 2, 3, 4, 1, 2, 9}, &r).ok());
  for (int j = 0; j <= k; ++j) ExpectPosition(r.steps[0], j, K, rows.data() + j * vocab, vocab);
}

// Logits and the log-probs computed from them (a per-row shift) give the same ids and tail, and
// log-probs equal to fp16 rounding.
TEST(RecordBuilder, LogitsAndLogProbsBuildTheSameStep) {
  std::mt19937 gen(8);
  std::normal_distribution<float> score(1.0f, 4.0f);
  const int vocab = 500, K = 8;
  std::vector<float> logits(vocab), logprobs(vocab);
  for (float& x : logits) x = score(gen);
  const double lse = LogSumExp(logits.data(), vocab);
  for (int v = 0; v < vocab; ++v) logprobs[v] = static_cast<float>(logits[v] - lse);
  SpecStep a, b;
  FillTopK(logits.data(), 1, vocab, K, &a);
  FillTopK(logprobs.data(), 1, vocab, K, &b);
  EXPECT_EQ(a.topk_ids, b.topk_ids);
  EXPECT_NEAR(a.tail_mass[0], b.tail_mass[0], 1e-5);
  for (int i = 0; i < K; ++i) {
    EXPECT_NEAR(HalfToFloat(a.topk_logprobs[i]), HalfToFloat(b.topk_logprobs[i]), 1e-2);
  }
}

TEST(RecordBuilder, PromptRowsAreKZeroStepsAtTheirPositions) {
  const int vocab = 6, K = 2;
  // Prompt of 4 tokens: rows for positions 1, 2, 3; position p's top token is p + 1.
  std::vector<float> rows(3 * vocab, -4.0f);
  for (int i = 0; i < 3; ++i) rows[i * vocab + i + 2] = 4.0f;
  RecordBuilder b(Info(K), 4);
  ASSERT_TRUE(b.AddPromptRows(1, rows.data(), 3, vocab).ok());
  const std::vector<float> step_rows(vocab, 0.0f);
  ASSERT_TRUE(b.AddStep(4, {}, 0, step_rows.data(), 1, vocab).ok());
  Record r;
  ASSERT_TRUE(b.Finish({1, 2, 3, 4, 5}, &r).ok());
  EXPECT_EQ(ValidateRecord(r), "");
  ASSERT_EQ(r.steps.size(), 4u);
  for (uint32_t i = 0; i < 3; ++i) {
    const SpecStep& s = r.steps[i];
    EXPECT_EQ(s.start_pos, i + 1);
    EXPECT_TRUE(s.draft_tokens.empty());
    EXPECT_EQ(s.num_accepted, 0u);
    ASSERT_EQ(s.topk_ids.size(), 2u);
    EXPECT_EQ(s.topk_ids[0], static_cast<int32_t>(i + 2));
    ExpectPosition(s, 0, K, rows.data() + i * vocab, vocab);
  }
  EXPECT_EQ(r.steps[3].start_pos, 4u);
}

TEST(RecordBuilder, StampsTheInfoAndCutsTheDomain) {
  RecordInfo info = Info(4);
  info.domain = std::string(300, 'd');
  RecordBuilder b(info, 2);
  Record r;
  ASSERT_TRUE(b.Finish({5, 6}, &r).ok());
  EXPECT_EQ(r.domain, std::string(255, 'd'));
  EXPECT_EQ(r.request_id, "req-1");
  EXPECT_EQ(r.worker_id, 3u);
  EXPECT_EQ(r.draft_version, 9u);
  EXPECT_EQ(r.target_id, "t");
  EXPECT_EQ(r.sampling.seed, 42u);
  EXPECT_EQ(r.sampling.temperature, 0.7f);
  EXPECT_EQ(r.top_k, 4u);
  EXPECT_EQ(r.prompt_len, 2u);
  EXPECT_EQ(r.time_us, 0u);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{5, 6}));
}

// K larger than the vocabulary: the extra entries are id 0 at -inf, and nothing is left out.
TEST(RecordBuilder, KBeyondTheVocabularyPadsWithMinusInfinity) {
  const std::vector<float> row = {1.0f, 2.0f, 0.0f};
  SpecStep s;
  FillTopK(row.data(), 1, 3, 5, &s);
  EXPECT_EQ(s.topk_ids, (std::vector<int32_t>{1, 0, 2, 0, 0}));
  EXPECT_TRUE(std::isinf(HalfToFloat(s.topk_logprobs[3])) && HalfToFloat(s.topk_logprobs[3]) < 0);
  EXPECT_NEAR(s.tail_mass[0], 0.0, 1e-6);
}

TEST(RecordBuilder, RefusesMalformedInputAndAddsNothing) {
  const std::vector<float> rows(4 * 5, 0.0f);
  RecordBuilder b(Info(2), 3);
  EXPECT_TRUE(b.AddStep(3, {1, 2}, 3, rows.data(), 3, 5).IsInvalidArgument());  // accepted > k
  EXPECT_TRUE(b.AddStep(3, {1, 2}, 1, rows.data(), 2, 5).IsInvalidArgument());  // rows != k+1
  EXPECT_TRUE(b.AddStep(3, {1, 2}, 1, rows.data(), 3, 0).IsInvalidArgument());  // no vocabulary
  EXPECT_TRUE(b.AddPromptRows(0, rows.data(), 1, 5).IsInvalidArgument());  // position 0
  EXPECT_TRUE(b.AddPromptRows(2, rows.data(), 2, 5).IsInvalidArgument());  // past the prompt
  EXPECT_EQ(b.num_steps(), 0u);
  ASSERT_TRUE(b.AddPromptRows(1, rows.data(), 2, 5).ok());  // positions 1, 2
  EXPECT_EQ(b.num_steps(), 2u);
  Record r;
  r.request_id = "untouched";
  EXPECT_TRUE(b.Finish({1, 2}, &r).IsInvalidArgument());  // shorter than the prompt
  EXPECT_EQ(r.request_id, "untouched");
  ASSERT_TRUE(b.Finish({1, 2, 3}, &r).ok());
  EXPECT_EQ(r.steps.size(), 2u);

  RecordBuilder zero(Info(0), 1);
  EXPECT_TRUE(zero.AddStep(1, {}, 0, rows.data(), 1, 5).IsInvalidArgument());  // K = 0
}

// A step from a top-K taken elsewhere (the model's device): the values as given, log-probs
// rounded to fp16, tails clamped to [0, 1]; a K other than the record's, accepted > k or rows
// != k + 1 refused with nothing added.
TEST(RecordBuilder, AStepFromATakenTopKKeepsItsValues) {
  const std::vector<int64_t> ids = {4, 1, 0, 2, 3, 1};
  const std::vector<float> lp = {-0.5f, -1.25f, -2.0f, -0.1f, -3.0f, -3.5f};
  const std::vector<float> tail = {0.25f, 1.5f};
  RecordBuilder b(Info(3), 3);
  EXPECT_TRUE(b.AddStepTopK(3, {7}, 1, ids.data(), lp.data(), tail.data(), 2, 2)
                  .IsInvalidArgument());  // K 2 in a record of K 3
  EXPECT_TRUE(b.AddStepTopK(3, {7}, 2, ids.data(), lp.data(), tail.data(), 2, 3)
                  .IsInvalidArgument());  // accepted > k
  EXPECT_TRUE(b.AddStepTopK(3, {7, 8}, 1, ids.data(), lp.data(), tail.data(), 2, 3)
                  .IsInvalidArgument());  // rows != k + 1
  EXPECT_EQ(b.num_steps(), 0u);
  ASSERT_TRUE(b.AddStepTopK(3, {7}, 1, ids.data(), lp.data(), tail.data(), 2, 3).ok());
  Record r;
  ASSERT_TRUE(b.Finish({1, 2, 3, 7, 9}, &r).ok());
  ASSERT_EQ(r.steps.size(), 1u);
  const SpecStep& s = r.steps[0];
  EXPECT_EQ(s.start_pos, 3u);
  EXPECT_EQ(s.draft_tokens, (std::vector<int32_t>{7}));
  EXPECT_EQ(s.num_accepted, 1u);
  EXPECT_EQ(s.topk_ids, (std::vector<int32_t>{4, 1, 0, 2, 3, 1}));
  for (size_t i = 0; i < lp.size(); ++i) EXPECT_EQ(s.topk_logprobs[i], FloatToHalf(lp[i])) << i;
  EXPECT_EQ(s.tail_mass, (std::vector<float>{0.25f, 1.0f}));
}

// FillTopK, the selection every record step goes through (moved from serve/sample_logger).
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

}  // namespace
}  // namespace specloop
