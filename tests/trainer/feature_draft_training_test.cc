// Feature-draft (EAGLE-3 head) training: the full-distribution losses and the sub-vocabulary
// acceptance, the alignment of features and targets (against independent prefix forwards), the
// evaluation rows against what FeatureDraftProposer drafts, gradients reaching only the head's
// parameters, the loss falling on a fixed set, a target whose next token is a fixed function of
// the current one (learnt to ~1 only with the right target rows), and training on target-6m's
// greedy records raising held-out alpha.
#include "trainer/feature_draft_training.h"

#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <numeric>

#include "common/base/half.h"
#include "common/engine/feature_draft_proposer.h"
#include "common/base/rng.h"
#include "tests/common/test_models.h"
#include "tests/testing/temp_dir.h"
#include "trainer/processed_acceptance.h"
#include "trainer/synthetic_traffic.h"

namespace specloop {
namespace trainer {
namespace {

using testing::SharedDir;


std::unique_ptr<Eagle3Head> InitHead(const LlamaModel& target, int draft_vocab = 0,
                                     uint64_t seed = 1) {
  Eagle3Head::InitOptions o;
  o.draft_vocab_size = draft_vocab;
  o.seed = seed;
  if (draft_vocab > 0) {  // a draft vocabulary of every third id and more: not a prefix
    o.token_counts.assign(target.config().vocab_size, 0);
    for (int i = 0; i < target.config().vocab_size; i += 3) o.token_counts[i] = 1;
  }
  std::unique_ptr<Eagle3Head> head;
  const Status s = Eagle3Head::InitFromTarget(target, o, &head);
  if (!s.ok()) throw std::runtime_error(s.ToString());
  return head;
}

// A record of `tokens` whose steps start at prompt_len and every k + 1 tokens after, each
// drafting the record's own next k tokens, all accepted, logging the target's top-K (K = 8)
// of a forward over the whole record.
Record LogRecord(const LlamaModel& target, const std::vector<int>& tokens, uint32_t prompt_len,
                 int k, const SamplingParams& sampling, const std::string& domain) {
  Record r;
  r.domain = domain;
  r.sampling = sampling;
  r.prompt_len = prompt_len;
  r.tokens.assign(tokens.begin(), tokens.end());
  r.top_k = 8;
  at::Tensor lp;
  {
    c10::InferenceMode guard;
    KVCache cache = target.NewCache(tokens.size());
    lp = at::log_softmax(
        target.Forward({ForwardInput{&cache, {tokens.begin(), tokens.end()}, true, {}, {}}}), -1);
  }
  const int64_t N = static_cast<int64_t>(tokens.size());
  for (int64_t s = prompt_len; s + k < N; s += k + 1) {
    SpecStep st;
    st.start_pos = static_cast<uint32_t>(s);
    st.draft_tokens.assign(tokens.begin() + s, tokens.begin() + s + k);
    st.num_accepted = static_cast<uint32_t>(k);
    for (int j = 0; j <= k; ++j) {  // row j predicts tokens[s + j]: the target's row s + j - 1
      auto [vals, ids] = lp[s + j - 1].topk(r.top_k);
      for (int i = 0; i < static_cast<int>(r.top_k); ++i) {
        st.topk_ids.push_back(static_cast<int32_t>(ids[i].item<int64_t>()));
        st.topk_logprobs.push_back(FloatToHalf(vals[i].item<float>()));
      }
      st.tail_mass.push_back(std::max(0.0f, 1.0f - vals.exp().sum().item<float>()));
    }
    r.steps.push_back(std::move(st));
  }
  return r;
}

std::vector<int> RandomTokens(Rng* rng, int n, int vocab) {
  std::vector<int> t(n);
  for (int& x : t) x = static_cast<int>(rng->Next() % vocab);
  return t;
}

std::vector<const Record*> Ptrs(const std::vector<Record>& records) {
  std::vector<const Record*> p;
  for (const Record& r : records) p.push_back(&r);
  return p;
}

double MeanAlpha(const LlamaModel& target, const Eagle3Head& head,
                 const std::vector<Record>& records) {
  std::vector<RecordAlpha> values;
  const Status s = EstimateHeadRecords(target, head, records, 8, &values);
  EXPECT_TRUE(s.ok()) << s.ToString();
  AlphaAccumulator acc;
  for (const RecordAlpha& r : values) acc.Add(r);
  return acc.Estimate().overall.logged;
}

AdamW MakeOptimizer(Eagle3Head* head, double lr) {
  std::vector<at::Tensor> params = head->Parameters();
  for (at::Tensor& p : params) p.requires_grad_(true);
  AdamWOptions o;
  o.lr = lr;
  return AdamW(params, o);
}

TEST(FullDistillLoss, IsTheCoarsenedLossWithEveryIdLogged) {
  at::manual_seed(3);
  const int64_t N = 5, V = 11;
  const at::Tensor draft = at::randn({N, V}, at::kDouble);
  const at::Tensor target = at::log_softmax(at::randn({N, V}, at::kDouble) * 2, 1);
  const at::Tensor ids = at::arange(V, at::kLong).repeat({N, 1});
  for (const char* name : {"fkl", "rkl", "jsd:0.3", "tvd"}) {
    ObjectiveSpec spec;
    ASSERT_TRUE(ObjectiveSpec::Parse(name, &spec).ok());
    const at::Tensor full = FullDistillLossPerPosition(spec, draft, target);
    const at::Tensor coarse = DistillLossPerPosition(spec, draft, ids, target, at::zeros({N}));
    EXPECT_TRUE(at::allclose(full, coarse, 1e-9, 1e-12)) << name;
    EXPECT_GT(full.min().item<double>(), 0.0) << name;
  }
  // Unnormalized target log-probs are renormalized; a perfect draft has loss 0.
  ObjectiveSpec fkl;
  const at::Tensor same = FullDistillLossPerPosition(fkl, target, target + 3.0);
  EXPECT_LT(same.abs().max().item<double>(), 1e-9);
}

TEST(ProcessedAcceptance, DraftVocabularyIsZeroElsewhere) {
  const int V = 12;
  const std::vector<int> map = {1, 4, 5, 9};  // draft ids -> target ids
  const std::vector<float> draft = {0.3f, 1.2f, -0.4f, 0.9f};
  // The same draft over the whole vocabulary: ids outside the draft vocabulary far below.
  std::vector<float> full(V, -1e4f);
  for (size_t d = 0; d < map.size(); ++d) full[map[d]] = draft[d];
  const std::vector<int64_t> ids = {4, 9, 0, 5};
  const std::vector<float> lps = {-0.7f, -1.3f, -2.0f, -2.6f};
  LoggedTarget t;
  t.ids = ids.data();
  t.logprobs = lps.data();
  t.k = 4;
  t.tail = 1.0 - (std::exp(-0.7) + std::exp(-1.3) + std::exp(-2.0) + std::exp(-2.6));
  for (float temperature : {0.0f, 0.7f, 1.0f}) {
    for (int top_k : {0, 2}) {
      SamplingParams s;
      s.temperature = temperature;
      s.top_k = top_k;
      const AcceptanceBounds sub = ProcessedAcceptance(draft.data(), 4, map.data(), V, t, s);
      const AcceptanceBounds whole = ProcessedAcceptance(full.data(), V, t, s);
      EXPECT_NEAR(sub.lower, whole.lower, 1e-6) << temperature << " " << top_k;
      EXPECT_NEAR(sub.upper, whole.upper, 1e-6) << temperature << " " << top_k;
      EXPECT_GT(sub.lower, 0.0);
    }
  }
}

// Features row t are the target's inputs to the aux layers at position t, and the loss of step j
// at row t is against the target's distribution after tokens[0 .. t + j + 1]: both checked
// against forwards over each prefix alone.
TEST(FeatureDraftTraining, FeaturesAndTargetRowsMatchPrefixForwards) {
  const auto target = testing::RandomModel(testing::TinyFourLayerConfig(), 5);
  const auto head = InitHead(*target, /*draft_vocab=*/40);
  Rng rng(9);
  Record r;
  r.domain = "x";
  const std::vector<int> tokens = RandomTokens(&rng, 14, 97);
  r.tokens.assign(tokens.begin(), tokens.end());
  std::vector<FeatureExample> ex;
  ASSERT_TRUE(BuildFeatureExamples(*target, *head, {&r}, true, &ex).ok());
  ASSERT_EQ(ex.size(), 1u);
  const int64_t N = 14, T = N - 1;
  ASSERT_EQ(ex[0].rows(), T);
  ASSERT_EQ(ex[0].target_logprobs.size(1), 40);
  const at::Tensor draft_ids = at::tensor(
      std::vector<int64_t>(head->draft_to_target().begin(), head->draft_to_target().end()));
  // The prefix forwards.
  std::vector<at::Tensor> features(N), logprobs(N);
  for (int64_t p = 0; p < N; ++p) {
    at::NoGradGuard no_grad;
    KVCache cache = target->NewCache(p + 1);
    at::Tensor hidden;
    const at::Tensor logits = target->Forward(
        {ForwardInput{&cache, {tokens.begin(), tokens.begin() + p + 1}, false, {}, {}}},
        head->config().aux_layers, &hidden);
    features[p] = hidden[p];
    logprobs[p] = at::log_softmax(logits[0].index_select(0, draft_ids), 0);
  }
  for (int64_t t = 0; t < T; ++t) {
    EXPECT_TRUE(at::allclose(ex[0].features[t], features[t], 1e-4, 1e-5)) << t;
  }
  UnrollOptions o;
  o.steps = 3;
  ASSERT_TRUE(ObjectiveSpec::Parse("fkl", &o.objective).ok());
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> sums = StepLossSums(*head, ex[0], o);
  const std::vector<at::Tensor> logits = UnrollHead(*head, ex[0], 3);
  ASSERT_EQ(sums.size(), 3u);
  for (int j = 0; j < 3; ++j) {
    double expected = 0;
    for (int64_t t = 0; t + j + 1 <= N - 1; ++t) {
      expected += FullDistillLossPerPosition(o.objective, logits[j][t].unsqueeze(0),
                                             logprobs[t + j + 1].unsqueeze(0))
                      .item<double>();
    }
    EXPECT_NEAR(sums[j].item<double>(), expected, 1e-4 * std::max(1.0, expected)) << j;
  }
}

// Evaluation reads the rows FeatureDraftProposer drafts from: q of draft j at a block starting
// at start_pos is the evaluation's logits row for (start_pos, j).
TEST(FeatureDraftTraining, EvaluationRowsAreWhatTheProposerDrafts) {
  const auto target = testing::RandomModel(testing::TinyFourLayerConfig(), 11);
  const auto init = InitHead(*target, /*draft_vocab=*/50, 4);
  testing::TempDir dir;
  ASSERT_TRUE(init->Save(dir.path()).ok());
  std::unique_ptr<Eagle3Head> head;  // loaded: the packed inference path serving runs
  ASSERT_TRUE(Eagle3Head::Load(dir.path(), *target, LoadOptions(), &head).ok());
  Rng rng(21);
  for (int L : {2, 3, 12}) {
    const std::vector<int> context = RandomTokens(&rng, L, 97);
    SamplingParams sampling;
    sampling.temperature = 1.0f;
    sampling.seed = 5 + L;
    FeatureDraftProposer proposer(head.get(), sampling);
    at::Tensor hidden;
    {
      c10::InferenceMode guard;
      KVCache cache = target->NewCache(L);
      target->Forward({ForwardInput{&cache, {context.begin(), context.end()}, false, {}, {}}},
                      head->config().aux_layers, &hidden);
    }
    proposer.AddFeatures(0, hidden.narrow(0, 0, L - 1));
    DraftBlock block;
    proposer.Propose(context, 4, &block);
    ASSERT_EQ(block.tokens.size(), 4u) << L;
    // The drafts, accepted, make the record; its one step starts at L.
    std::vector<int> tokens = context;
    tokens.insert(tokens.end(), block.tokens.begin(), block.tokens.end());
    // One step at L drafting the next 3 tokens: rows j = 0..3 predict tokens[L + j].
    Record full = LogRecord(*target, tokens, L, 3, sampling, "x");
    ASSERT_EQ(full.steps.size(), 1u);
    PositionBatch pb;
    at::Tensor logits;
    ASSERT_TRUE(HeadLogitsAtLoggedPositions(*target, *head, {&full}, &pb, &logits).ok());
    ASSERT_EQ(pb.size(), 4) << L;  // rows j = 0..3 of the step at L
    const int V = 97;
    for (int64_t n = 0; n < pb.size(); ++n) {
      const int j = pb.draft_index[n];
      EXPECT_EQ(pb.predicted[n], L + j);
      const at::Tensor q = at::softmax(logits[n], 0);
      for (int d = 0; d < head->draft_vocab_size(); ++d) {
        EXPECT_NEAR(q[d].item<float>(), block.probs[j * V + head->ToTarget(d)], 2e-5)
            << "L " << L << " draft " << j << " id " << d;
      }
    }
  }
}

// The loss backpropagates into the head's Parameters() and nothing else: the target's weights,
// made to require gradients here so that any path from the loss into the target's forward (the
// features) would show, get none, except the embedding, which the head reads as its own input
// (Eagle3Head: frozen because the trainer's target never requires gradients, as checked last).
TEST(FeatureDraftTraining, GradientsReachOnlyTheHeadsParameters) {
  const auto target = testing::RandomModel(testing::TinyFourLayerConfig(), 6);
  auto head = InitHead(*target);
  for (at::Tensor& w : target->Parameters()) w.requires_grad_(true);
  std::vector<at::Tensor> params = head->Parameters();
  for (at::Tensor& p : params) p.requires_grad_(true);
  Rng rng(2);
  std::vector<Record> records;
  for (int i = 0; i < 3; ++i) {
    Record r;
    r.domain = "x";
    const std::vector<int> t = RandomTokens(&rng, 9 + i, 97);
    r.tokens.assign(t.begin(), t.end());
    records.push_back(r);
  }
  double loss = 0;
  std::vector<std::string> domains;
  UnrollOptions o;
  const Status s = AccumulateHeadGradients(*target, *head, Ptrs(records), o, &loss, &domains);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_GT(loss, 0.0);
  EXPECT_EQ(domains.size(), 8u + 9u + 10u);  // step-0 rows: N - 1 per record
  for (const at::Tensor& p : params) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_TRUE(at::isfinite(p.grad()).all().item<bool>());
    EXPECT_GT(p.grad().abs().sum().item<double>(), 0.0);
  }
  for (const at::Tensor& w : target->Parameters()) {
    if (!w.is_same(target->embedding())) {
      EXPECT_FALSE(w.grad().defined()) << w.sizes();
    }
  }
  // As the trainer holds it (weights as loaded): the embedding gets nothing either.
  const auto plain = testing::RandomModel(testing::TinyFourLayerConfig(), 6);
  auto head2 = InitHead(*plain);
  for (at::Tensor& p : head2->Parameters()) p.requires_grad_(true);
  ASSERT_TRUE(AccumulateHeadGradients(*plain, *head2, Ptrs(records), o, &loss, nullptr).ok());
  EXPECT_FALSE(plain->embedding().requires_grad());
  EXPECT_FALSE(plain->embedding().grad().defined());
}

TEST(FeatureDraftTraining, LossFallsOnAFixedSet) {
  const auto target = testing::RandomModel(testing::TinyFourLayerConfig(), 7);
  auto head = InitHead(*target);
  AdamW opt = MakeOptimizer(head.get(), 3e-3);
  Rng rng(4);
  std::vector<Record> records;
  for (int i = 0; i < 4; ++i) {
    Record r;
    r.domain = "x";
    const std::vector<int> t = RandomTokens(&rng, 16, 97);
    r.tokens.assign(t.begin(), t.end());
    records.push_back(r);
  }
  UnrollOptions o;
  double first = 0, last = 0;
  for (int step = 0; step < 40; ++step) {
    double loss = 0;
    ASSERT_TRUE(HeadTrainStep(*target, *head, &opt, Ptrs(records), o, 1.0, &loss).ok());
    if (step == 0) first = loss;
    last = loss;
  }
  std::cout << "loss " << first << " -> " << last << "\n";
  EXPECT_LT(last, 0.7 * first);
}

// A target whose next token is f(x) = (5x + 3) mod 97 of the current token x, whatever came
// before: its layers add nothing (o_proj, down_proj zero) and lm_head row f(x) is the
// direction of x's embedding, so the target's distribution at a position peaks (~0.99) on f of
// its token. On records of random tokens the head's step j must predict f(tokens[t + j + 1]):
// the token it reads, through its attention. Trained against the target row one position too
// early (the distribution of f(tokens[t + j])) it would learn to predict from the features,
// and one position too late (f of a random token it never sees) nothing: either way its
// held-out greedy acceptance would stay near chance (~0.01) instead of ~1 (so measured with
// either shift put into StepLossSums: 0.006 and 0.09 after the same 300 steps; 0.99 without).
std::unique_ptr<LlamaModel> FunctionTarget() {
  const ModelConfig c = testing::TinyFourLayerConfig();
  TensorMap w = testing::RandomLlamaWeights(c, 13);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    w[p + "self_attn.o_proj.weight"].zero_();
    w[p + "mlp.down_proj.weight"].zero_();
  }
  const int64_t V = c.vocab_size, h = c.hidden_size;
  const at::Tensor e = w["model.embed_tokens.weight"];
  const at::Tensor unit = e / e.norm(2, 1, true);  // [V, h]
  at::Tensor lm = at::zeros({V, h});
  for (int64_t x = 0; x < V; ++x) lm[(5 * x + 3) % V] = unit[x] * (20.0 / std::sqrt(double(h)));
  w["lm_head.weight"] = lm;
  w["model.norm.weight"] = at::ones({h});
  std::unique_ptr<LlamaModel> m;
  const Status s = LlamaModel::FromTensors(c, w, LoadOptions(), &m);
  if (!s.ok()) throw std::runtime_error(s.ToString());
  return m;
}

TEST(FeatureDraftTraining, LearnsTheTargetsNextTokenFunctionWithTheRightRows) {
  const auto target = FunctionTarget();
  auto head = InitHead(*target);
  Rng rng(17);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  // Enough records that the head learns the function rather than the records (on 32 it reached
  // 0.6 held out while its training loss fell to 0.01).
  std::vector<Record> train, heldout;
  for (int i = 0; i < 308; ++i) {
    const Record r = LogRecord(*target, RandomTokens(&rng, 24, 97), 4, 3, greedy, "x");
    (i < 300 ? train : heldout).push_back(r);
  }
  const double before = MeanAlpha(*target, *head, heldout);
  AdamW opt = MakeOptimizer(head.get(), 1e-2);
  // Four unrolled steps: every step here teaches the same function, and with four the head
  // learns it in ~200 steps (with three: 0.73 at 300, 0.98 at 500).
  UnrollOptions o;
  o.steps = 4;
  for (int step = 0; step < 300; ++step) {
    std::vector<const Record*> batch;
    for (int b = 0; b < 4; ++b) batch.push_back(&train[(4 * step + b) % train.size()]);
    double loss = 0;
    ASSERT_TRUE(HeadTrainStep(*target, *head, &opt, batch, o, 1.0, &loss).ok());
  }
  const double after = MeanAlpha(*target, *head, heldout);
  std::cout << "held-out greedy alpha " << before << " -> " << after << "\n";
  EXPECT_LT(before, 0.2);
  EXPECT_GT(after, 0.9);
}

// The real target-6m: a head grown from it, trained on the greedy records of python prompts
// (target-6m verifying draft-prose-1m), drafts held-out python better.
TEST(FeatureDraftTraining, TrainingOnTarget6mRaisesHeldOutAlpha) {
  const std::string models = SharedDir() + "/models";
  std::unique_ptr<LlamaModel> target, draft;
  ASSERT_TRUE(LlamaModel::Load(models + "/target-6m", {}, &target).ok());
  ASSERT_TRUE(LlamaModel::Load(models + "/draft-prose-1m", {}, &draft).ok());
  std::vector<std::vector<int>> prompts;
  ASSERT_TRUE(LoadDomainPrompts(SharedDir(), "python", models + "/target-6m", 40, 48, &prompts).ok());
  ASSERT_GE(prompts.size(), 32u);
  std::vector<Record> train, heldout;
  TrafficOptions to;
  to.temperature = 0.0f;
  to.max_tokens = 32;
  to.max_prompt_tokens = 48;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Record r;
    ASSERT_TRUE(DecodeToRecord(*target, *draft, prompts[i], "python", std::to_string(i), to, &r).ok());
    (i % 5 == 4 ? heldout : train).push_back(std::move(r));
  }
  // A draft vocabulary of the 1024 ids most frequent in the training records (a quarter of the
  // target's: a quarter of the lm_head's time).
  Eagle3Head::InitOptions io;
  io.draft_vocab_size = 1024;
  io.token_counts.assign(target->config().vocab_size, 0);
  for (const Record& r : train) {
    for (int32_t id : r.tokens) ++io.token_counts[id];
  }
  std::unique_ptr<Eagle3Head> head;
  ASSERT_TRUE(Eagle3Head::InitFromTarget(*target, io, &head).ok());
  const double before = MeanAlpha(*target, *head, heldout);
  AdamW opt = MakeOptimizer(head.get(), 1e-3);
  UnrollOptions o;
  for (int step = 0; step < 100; ++step) {
    std::vector<const Record*> batch;
    for (int b = 0; b < 4; ++b) batch.push_back(&train[(4 * step + b) % train.size()]);
    double loss = 0;
    ASSERT_TRUE(HeadTrainStep(*target, *head, &opt, batch, o, 1.0, &loss).ok());
  }
  const double after = MeanAlpha(*target, *head, heldout);
  std::cout << "target-6m python held-out greedy alpha " << before << " -> " << after << "\n";
  EXPECT_GT(after, before + 0.1);
}

}  // namespace
}  // namespace trainer
}  // namespace specloop
