// Head warm-up (trainer/head_warmup.h): the examples taken from the sampling forwards are the
// ones BuildFeatureExamples builds over the same tokens; the sampled text depends on the seed
// and not on the batch; the same options give the same head; bad options are refused; and on
// target-6m a warmed-up head drafts held-out python and prose far better than the bare init.
#include "trainer/head_warmup.h"

#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>

#include "common/engine/feature_draft_proposer.h"
#include "common/engine/speculative_decoder.h"
#include "tests/common/test_models.h"
#include "tests/testing/temp_dir.h"
#include "trainer/synthetic_traffic.h"

namespace specloop {
namespace trainer {
namespace {

using testing::SharedDir;


std::unique_ptr<Eagle3Head> InitHead(const LlamaModel& target, int draft_vocab = 0) {
  Eagle3Head::InitOptions o;
  o.draft_vocab_size = draft_vocab;
  if (draft_vocab > 0) {  // every third id and more: not a prefix of the vocabulary
    o.token_counts.assign(target.config().vocab_size, 0);
    for (int i = 0; i < target.config().vocab_size; i += 3) o.token_counts[i] = 1;
  }
  std::unique_ptr<Eagle3Head> head;
  const Status s = Eagle3Head::InitFromTarget(target, o, &head);
  if (!s.ok()) throw std::runtime_error(s.ToString());
  return head;
}

HeadWarmupOptions SmallOptions() {
  HeadWarmupOptions o;
  o.tokens = 200;
  o.batch_sequences = 3;
  o.batch_records = 4;
  o.sequence_tokens = 24;
  o.prefix_tokens = 2;
  return o;
}

TEST(HeadWarmup, SampledExamplesAreWhatBuildFeatureExamplesBuilds) {
  const auto target = testing::RandomModel(testing::TinyFourLayerConfig(), 5);
  for (const int draft_vocab : {0, 40}) {
    const auto head = InitHead(*target, draft_vocab);
    std::vector<FeatureExample> sampled;
    ASSERT_TRUE(SampleWarmupExamples(*target, *head, SmallOptions(), 0, {20, 9, 3}, &sampled).ok());
    ASSERT_EQ(sampled.size(), 3u);
    std::vector<Record> records(sampled.size());
    std::vector<const Record*> ptrs;
    for (size_t i = 0; i < sampled.size(); ++i) {
      records[i].domain = "warmup";
      records[i].tokens.assign(sampled[i].tokens.begin(), sampled[i].tokens.end());
      ptrs.push_back(&records[i]);
    }
    std::vector<FeatureExample> built;
    ASSERT_TRUE(BuildFeatureExamples(*target, *head, ptrs, true, &built).ok());
    for (size_t i = 0; i < sampled.size(); ++i) {
      const FeatureExample& s = sampled[i];
      EXPECT_EQ(s.domain, "warmup");
      EXPECT_EQ(s.tokens[0], target->config().bos_token_id);
      EXPECT_LE(s.tokens.size(), std::vector<size_t>({20, 9, 3})[i]);
      ASSERT_EQ(s.rows(), built[i].rows()) << i;
      ASSERT_EQ(s.target_logprobs.sizes(), built[i].target_logprobs.sizes()) << i;
      EXPECT_EQ(s.target_logprobs.size(1), draft_vocab ? draft_vocab : 97);
      EXPECT_FALSE(s.features.is_inference());
      EXPECT_TRUE(at::allclose(s.features, built[i].features, 1e-4, 1e-5)) << i;
      EXPECT_TRUE(at::allclose(s.target_logprobs, built[i].target_logprobs, 1e-4, 1e-5)) << i;
    }
  }
}

TEST(HeadWarmup, TextDependsOnTheSeedNotOnTheBatch) {
  const auto target = testing::RandomModel(testing::TinyFourLayerConfig(), 5);
  const auto head = InitHead(*target);
  HeadWarmupOptions o = SmallOptions();
  std::vector<FeatureExample> all, one, other_seed;
  ASSERT_TRUE(SampleWarmupExamples(*target, *head, o, 0, {24, 24, 24}, &all).ok());
  ASSERT_TRUE(SampleWarmupExamples(*target, *head, o, 1, {24}, &one).ok());
  EXPECT_EQ(one[0].tokens, all[1].tokens);  // sequence 1, alone or beside others
  EXPECT_NE(all[0].tokens, all[1].tokens);
  o.seed = 2;
  ASSERT_TRUE(SampleWarmupExamples(*target, *head, o, 1, {24}, &other_seed).ok());
  EXPECT_NE(other_seed[0].tokens, one[0].tokens);
}

// A config with no BOS id in the vocabulary: sequences start from a draft id instead.
TEST(HeadWarmup, ATargetWithoutBosStartsFromADraftId) {
  ModelConfig c = testing::TinyFourLayerConfig();
  c.bos_token_id = -1;
  c.add_bos_token = false;
  const auto target = testing::RandomModel(c, 5);
  const auto head = InitHead(*target, 40);
  std::vector<FeatureExample> out;
  ASSERT_TRUE(SampleWarmupExamples(*target, *head, SmallOptions(), 0, {10, 10, 10}, &out).ok());
  const std::vector<int>& ids = head->draft_to_target();
  for (const FeatureExample& ex : out) {
    EXPECT_NE(std::find(ids.begin(), ids.end(), ex.tokens[0]), ids.end()) << ex.tokens[0];
    EXPECT_GT(ex.rows(), 0);
  }
}

std::vector<at::Tensor> Weights(const Eagle3Head& head) {
  std::vector<at::Tensor> w;
  for (const auto& [name, t] : head.NamedWeights()) w.push_back(t.clone());
  return w;
}

bool Same(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!at::equal(a[i], b[i])) return false;
  }
  return true;
}

TEST(HeadWarmup, SameOptionsGiveTheSameHead) {
  const auto target = testing::RandomModel(testing::TinyFourLayerConfig(), 5);
  const HeadWarmupOptions o = SmallOptions();
  std::vector<std::vector<at::Tensor>> heads;
  for (uint64_t seed : {1, 1, 2}) {
    const auto head = InitHead(*target, 40);
    const std::vector<at::Tensor> before = Weights(*head);
    HeadWarmupOptions s = o;
    s.seed = seed;
    HeadWarmupReport report;
    int calls = 0;
    ASSERT_TRUE(WarmUpHead(*target, head.get(), s, &report,
                           [&](const HeadWarmupReport&) { ++calls; }).ok());
    EXPECT_GE(report.tokens, o.tokens - 2);  // the budget, less a remainder under 3 tokens
    EXPECT_LE(report.tokens, o.tokens);
    // batch_records (4) >= batch_sequences (3): one optimizer step per batch of sequences.
    EXPECT_GT(calls, 1);
    EXPECT_EQ(report.steps, calls);
    EXPECT_GT(report.first_loss, 0);
    EXPECT_FALSE(Same(before, Weights(*head)));
    for (const at::Tensor& p : head->Parameters()) EXPECT_FALSE(p.requires_grad());
    heads.push_back(Weights(*head));
  }
  EXPECT_TRUE(Same(heads[0], heads[1]));
  EXPECT_FALSE(Same(heads[0], heads[2]));
}

TEST(HeadWarmup, ZeroTokensLeavesTheHeadAlone) {
  const auto target = testing::RandomModel(testing::TinyFourLayerConfig(), 5);
  const auto head = InitHead(*target);
  const std::vector<at::Tensor> before = Weights(*head);
  HeadWarmupOptions o = SmallOptions();
  o.tokens = 0;
  HeadWarmupReport report;
  ASSERT_TRUE(WarmUpHead(*target, head.get(), o, &report).ok());
  EXPECT_EQ(report.tokens, 0);
  EXPECT_TRUE(Same(before, Weights(*head)));
}

TEST(HeadWarmup, RefusesBadOptions) {
  const auto target = testing::RandomModel(testing::TinyFourLayerConfig(), 5);
  const auto head = InitHead(*target);
  auto refused = [&](auto edit, const std::string& what) {
    HeadWarmupOptions o = SmallOptions();
    edit(&o);
    const Status s = WarmUpHead(*target, head.get(), o, nullptr);
    EXPECT_TRUE(s.IsInvalidArgument()) << what << ": " << s.ToString();
    EXPECT_NE(s.ToString().find(what), std::string::npos) << s.ToString();
  };
  refused([](HeadWarmupOptions* o) { o->tokens = -1; }, "tokens");
  refused([](HeadWarmupOptions* o) { o->batch_sequences = 0; }, "batch_sequences");
  refused([](HeadWarmupOptions* o) { o->batch_records = 0; }, "batch_records");
  refused([](HeadWarmupOptions* o) { o->temperature = 0; }, "temperature");
  refused([](HeadWarmupOptions* o) { o->lr_width = 0; }, "lr_width");
  refused([](HeadWarmupOptions* o) { o->sequence_tokens = 4; }, "2 more");  // 1 + 2 + 2 > 4
  std::vector<FeatureExample> out;
  EXPECT_TRUE(SampleWarmupExamples(*target, *head, SmallOptions(), 0, {2}, &out)
                  .IsInvalidArgument());
  EXPECT_TRUE(SampleWarmupExamples(*target, *head, SmallOptions(), 0, {1000}, &out)
                  .IsInvalidArgument());
}

// Per-token acceptance (accepted / tested) of `head` drafting k = 4 greedily on the first 6
// prompts of python and of prose (cut to 64 tokens), 32 tokens each: text the warm-up never saw.
double HeldOutAlpha(const LlamaModel& target, const Eagle3Head& head) {
  c10::InferenceMode guard;
  SpeculativeStats all;
  for (const char* domain : {"python", "prose"}) {
    std::vector<std::vector<int>> prompts;
    const Status s = LoadDomainPrompts(SharedDir(), domain, SharedDir() + "/models/target-6m", 6,
                                       64, &prompts);
    EXPECT_TRUE(s.ok()) << s.ToString();
    for (const auto& prompt : prompts) {
      SpeculativeOptions o;
      o.k = 4;
      o.generate.max_tokens = 32;
      o.generate.stop_at_eos = false;
      o.generate.sampling.temperature = 0.0f;
      FeatureDraftProposer proposer(&head, o.generate.sampling);
      SpeculativeStats stats;
      GenerateSpeculative(target, &proposer, prompt, o, &stats);
      all.Add(stats);
    }
  }
  return all.acceptance_rate();
}

TEST(HeadWarmup, RaisesHeldOutAcceptanceOnTarget6m) {
  std::unique_ptr<LlamaModel> target;
  ASSERT_TRUE(LlamaModel::Load(SharedDir() + "/models/target-6m", {}, &target).ok());
  std::unique_ptr<Eagle3Head> head;
  ASSERT_TRUE(Eagle3Head::InitFromTarget(*target, {}, &head).ok());
  const double before = HeldOutAlpha(*target, *head);
  HeadWarmupOptions o;  // the defaults, on a small budget
  o.tokens = 8192;
  HeadWarmupReport report;
  ASSERT_TRUE(WarmUpHead(*target, head.get(), o, &report).ok());
  const double after = HeldOutAlpha(*target, *head);
  std::cout << "target-6m held-out greedy alpha (python + prose, k = 4): bare init " << before
            << ", after warm-up on " << report.tokens << " sampled tokens " << after << " ("
            << report.sample_seconds << " s sampling, " << report.train_seconds
            << " s training; loss " << report.first_loss << " -> " << report.last_loss << ")\n";
  EXPECT_LT(report.last_loss, report.first_loss);
  EXPECT_GT(after, before + 0.05);
  EXPECT_GT(after, 2 * before);
}

}  // namespace
}  // namespace trainer
}  // namespace specloop
