// The held-out estimate scores each record under its own sampling, so the publish gate compares
// drafts on what serving accepts. Models are hand-built "bigram" Llamas (next-token logits a
// fixed table row of the last token), records are logged by real speculative decoding
// (synthetic_traffic.h).
#include "trainer/alpha_estimate.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "tests/common/test_models.h"
#include "trainer/distill_loss.h"
#include "trainer/processed_acceptance.h"
#include "trainer/publish_gate.h"
#include "trainer/synthetic_traffic.h"
#include "trainer/training_examples.h"

namespace specloop {
namespace trainer {
namespace {

constexpr int kVocab = 16;

// After token t the target ranks First(t) just above Second(t) (logits 2.0 and 1.8, the rest in
// [-1, 1]). The live draft is sure of First(t) (5.0, the rest 0); the candidate copies the
// target's row but swaps the near-tie: far closer to the target's distribution, and never its
// argmax.
int First(int t) { return (5 * t + 3) % kVocab; }
int Second(int t) { return (First(t) + 1 + t % 3) % kVocab; }

struct Tables {
  at::Tensor target, live, candidate;
};

Tables MakeTables() {
  at::manual_seed(21);
  Tables t;
  t.target = (at::rand({kVocab, kVocab}, at::kDouble) * 2 - 1);
  t.live = at::zeros({kVocab, kVocab}, at::kDouble);
  for (int i = 0; i < kVocab; ++i) {
    t.target[i][First(i)] = 2.0;
    t.target[i][Second(i)] = 1.8;
    t.live[i][First(i)] = 5.0;
  }
  t.candidate = t.target.clone();
  for (int i = 0; i < kVocab; ++i) {
    t.candidate[i][First(i)] = 1.8;
    t.candidate[i][Second(i)] = 2.0;
  }
  return t;
}

// Records of `prompts` prompts decoded by `target` verifying `draft` at `temperature`, K = 8
// of the 16 ids logged (so every position has a tail).
std::vector<Record> Traffic(const LlamaModel& target, const LlamaModel& draft, float temperature,
                            int prompts) {
  std::vector<Record> out;
  TrafficOptions o;
  o.k = 4;
  o.max_tokens = 40;
  o.top_k = 8;
  o.temperature = temperature;
  for (int i = 0; i < prompts; ++i) {
    o.seed = static_cast<uint64_t>(i);
    Record r;
    const Status s = DecodeToRecord(target, draft, {0, 1 + i % (kVocab - 1)}, "chat",
                                    "r" + std::to_string(i), o, &r);
    EXPECT_TRUE(s.ok()) << s.ToString();
    out.push_back(std::move(r));
  }
  return out;
}

AlphaEstimate Estimate(const LlamaModel& model, const std::vector<Record>& records) {
  AlphaEstimate e;
  const Status s = EstimateAlpha(model, records, 3, &e);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return e;
}

// The mean lower bound over the records' positions computed the plain way: one forward of all,
// then ProcessedAcceptance row by row (and, in *bucket, distill_loss.h's LoggedAcceptance at
// temperature 1, which ignores sampling).
double RowByRow(const LlamaModel& model, const std::vector<Record>& records, double* bucket) {
  std::vector<const Record*> ptrs;
  for (const Record& r : records) ptrs.push_back(&r);
  PositionBatch pb;
  BuildPositionBatch(ptrs, kVocab, model.config().max_model_len, Positions::kGenerated,
                     &pb);
  std::vector<KVCache> caches;
  caches.reserve(pb.inputs.size());
  std::vector<ForwardInput> in;
  for (size_t i = 0; i < pb.inputs.size(); ++i) {
    caches.push_back(model.NewCache(static_cast<int64_t>(pb.inputs[i].size())));
    in.push_back(ForwardInput{&caches.back(), pb.inputs[i], false, {}, pb.logit_rows[i]});
  }
  const at::Tensor logits = model.Forward(in).contiguous();
  *bucket = LoggedAcceptance(logits, pb.target_ids, pb.target_logprobs, pb.target_tail)
                .mean()
                .item<double>();
  const int K = static_cast<int>(pb.target_ids.size(1));
  double sum = 0;
  for (int64_t n = 0; n < pb.size(); ++n) {
    LoggedTarget t;
    t.ids = pb.target_ids.data_ptr<int64_t>() + n * K;
    t.logprobs = pb.target_logprobs.data_ptr<float>() + n * K;
    t.k = K;
    t.tail = pb.target_tail.data_ptr<float>()[n];
    sum += ProcessedAcceptance(logits.data_ptr<float>() + n * kVocab, kVocab, t,
                               records[pb.record_index[n]].sampling)
               .lower;
  }
  return sum / pb.size();
}

class SamplingAwareGate : public ::testing::Test {
 protected:
  void SetUp() override {
    tables_ = MakeTables();
    target_ = testing::BigramModel(tables_.target);
    live_ = testing::BigramModel(tables_.live);
    candidate_ = testing::BigramModel(tables_.candidate);
    ASSERT_TRUE(target_ && live_ && candidate_);
  }
  Tables tables_;
  std::unique_ptr<LlamaModel> target_, live_, candidate_;
};

// The bigram models compute what they are built to.
TEST_F(SamplingAwareGate, BigramModelsReadTheirTables) {
  KVCache cache = target_->NewCache(4);
  const at::Tensor logits = target_->Forward({ForwardInput{&cache, {0, 3, 7}, /*all_logits=*/true, {}, {}}});
  ASSERT_EQ(logits.size(0), 3);
  EXPECT_TRUE(at::allclose(logits[1].to(at::kDouble), tables_.target[3], 1e-4, 1e-4));
  EXPECT_TRUE(at::allclose(logits[2].to(at::kDouble), tables_.target[7], 1e-4, 1e-4));
}

// On greedy traffic the candidate never proposes the target's argmax: serving would accept
// none of its tokens, and the gate refuses it although it overlaps the target's temperature-1
// distribution far better. The same positions scored at temperature 1 (the estimate before it
// saw sampling) would have published it; so does sampled traffic.
TEST_F(SamplingAwareGate, RefusesACandidateThatGainsRawOverlapButLosesGreedyAgreement) {
  const std::vector<Record> greedy = Traffic(*target_, *live_, 0.0f, 8);
  AlphaEstimate live = Estimate(*live_, greedy), candidate = Estimate(*candidate_, greedy);
  ASSERT_GE(candidate.overall.positions, 200);
  ASSERT_EQ(live.regimes.size(), 1u);
  ASSERT_TRUE(live.regimes.count("greedy"));
  EXPECT_EQ(live.regimes["greedy"].positions, live.overall.positions);
  EXPECT_DOUBLE_EQ(live.overall.logged, 1.0);       // the live draft's argmax is the target's
  EXPECT_DOUBLE_EQ(candidate.overall.logged, 0.0);  // the candidate's never is
  const GateDecision refused = DecideGate(GateOptions(), live, candidate);
  std::cout << "greedy: " << refused.reason << ": " << refused.detail << "\n";
  EXPECT_FALSE(refused.publish) << refused.detail;
  EXPECT_EQ(refused.reason, "domain_regression") << refused.detail;

  // The same records scored at temperature 1.
  std::vector<Record> raw = greedy;
  for (Record& r : raw) r.sampling = SamplingParams();
  const int64_t positions = live.overall.positions;
  live = Estimate(*live_, raw);
  candidate = Estimate(*candidate_, raw);
  EXPECT_EQ(candidate.overall.positions, positions);
  ASSERT_TRUE(candidate.regimes.count("sampled"));
  EXPECT_FALSE(candidate.regimes.count("greedy"));
  EXPECT_GT(candidate.overall.logged, live.overall.logged + 0.3)
      << live.overall.logged << " -> " << candidate.overall.logged;
  GateDecision d = DecideGate(GateOptions(), live, candidate);
  EXPECT_TRUE(d.publish) << d.reason << ": " << d.detail;
  std::cout << "scored at temperature 1: " << d.reason << ": " << d.detail << "\n";

  // Traffic sampled at temperature 1 (its own tokens and seeds).
  const std::vector<Record> sampled = Traffic(*target_, *live_, 1.0f, 8);
  live = Estimate(*live_, sampled);
  candidate = Estimate(*candidate_, sampled);
  d = DecideGate(GateOptions(), live, candidate);
  EXPECT_TRUE(d.publish) << d.reason << ": " << d.detail;
  std::cout << "sampled traffic: " << d.reason << ": " << d.detail << "\n";
}

// Mixed traffic: each record is scored under its own sampling and counted in its regime; the
// overall value is the mean over both. A record whose sampling is invalid is not scored.
TEST_F(SamplingAwareGate, EachRecordIsScoredUnderItsOwnSampling) {
  std::vector<Record> records = Traffic(*target_, *live_, 0.0f, 4);
  for (Record& r : Traffic(*target_, *live_, 1.0f, 4)) records.push_back(std::move(r));
  std::vector<RecordAlpha> values;
  ASSERT_TRUE(EstimateRecords(*candidate_, records, 3, &values).ok());
  ASSERT_EQ(values.size(), records.size());
  double sums[2] = {0, 0};
  int64_t counts[2] = {0, 0};
  for (size_t i = 0; i < records.size(); ++i) {
    const bool greedy = i < 4;
    EXPECT_EQ(values[i].regime, greedy ? "greedy" : "sampled");
    ASSERT_FALSE(values[i].logged.empty()) << i;
    for (size_t n = 0; n < values[i].logged.size(); ++n) {
      EXPECT_LE(values[i].logged[n], values[i].coarsened[n] + 1e-9);
      if (greedy) {
        EXPECT_EQ(values[i].logged[n], 0.0);  // never the target's argmax
      } else {
        EXPECT_GT(values[i].logged[n], 0.5);  // a close copy of the target's row
      }
      sums[greedy ? 0 : 1] += values[i].logged[n];
      ++counts[greedy ? 0 : 1];
    }
  }
  const AlphaEstimate e = Estimate(*candidate_, records);
  EXPECT_EQ(e.regimes.at("greedy").positions, counts[0]);
  EXPECT_EQ(e.regimes.at("sampled").positions, counts[1]);
  EXPECT_NEAR(e.regimes.at("sampled").logged, sums[1] / counts[1], 1e-12);
  EXPECT_NEAR(e.overall.logged, (sums[0] + sums[1]) / (counts[0] + counts[1]), 1e-12);

  // Top-p and a lower temperature change the sampled records' values, not the greedy ones'.
  std::vector<Record> cooler = records;
  for (size_t i = 4; i < cooler.size(); ++i) {
    cooler[i].sampling.temperature = 0.5f;
    cooler[i].sampling.top_p = 0.8f;
  }
  const AlphaEstimate c = Estimate(*candidate_, cooler);
  EXPECT_EQ(c.regimes.at("greedy").logged, e.regimes.at("greedy").logged);
  EXPECT_GT(std::abs(c.regimes.at("sampled").logged - e.regimes.at("sampled").logged), 0.01);

  // EstimateRecords in batches agrees with ProcessedAcceptance on one forward of all the
  // records, and at temperature 1 with the temperature-1 bucket estimate of distill_loss.h.
  const std::vector<Record> t1(records.begin() + 4, records.end());
  double bucket = 0;
  const double row_by_row = RowByRow(*candidate_, t1, &bucket);
  EXPECT_NEAR(Estimate(*candidate_, t1).overall.logged, row_by_row, 1e-6);
  EXPECT_NEAR(bucket, row_by_row, 1e-6);
  for (const SamplingParams& s : {SamplingParams{0.6f, 0, 1.0f, 0}, SamplingParams{1.4f, 0, 0.7f, 0}}) {
    std::vector<Record> other = t1;
    for (Record& r : other) r.sampling = s;
    EXPECT_NEAR(Estimate(*candidate_, other).overall.logged, RowByRow(*candidate_, other, &bucket),
                1e-6);
    EXPECT_GT(std::abs(Estimate(*candidate_, other).overall.logged - row_by_row), 0.01);
  }

  records[5].sampling.top_p = 0.0f;  // invalid
  ASSERT_TRUE(EstimateRecords(*candidate_, records, 3, &values).ok());
  EXPECT_TRUE(values[5].logged.empty());
  EXPECT_FALSE(values[4].logged.empty());
  EXPECT_FALSE(values[6].logged.empty());
}

}  // namespace
}  // namespace trainer
}  // namespace specloop
