// EAGLE-3 feature drafts: the head (common/model/eagle3_head.h) and its proposer through the
// whole decode step. Exactness: greedy speculative output equals plain greedy output on the
// fixture target, and the law of sampled tokens equals the target's (G-tests, batched decode
// steps, with a wrong-verifier companion that the same statistic must reject).
#include "common/engine/feature_draft_proposer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <map>

#include <nlohmann/json.hpp>

#include <c10/core/InferenceMode.h>

#include "common/engine/decode_step.h"
#include "common/engine/generate.h"
#include "common/engine/speculative_decoder.h"
#include "common/model/eagle3_head.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/common/test_models.h"
#include "tests/spec/exact_law.h"
#include "tests/spec/stat_util.h"

namespace specloop {
namespace {

using spec_test::AcceptWithQOverP;
using spec_test::ExactSequenceLaw;
using spec_test::GTest;
using spec_test::kSignificance;

std::unique_ptr<LlamaModel> Load(const std::string& name) {
  std::unique_ptr<LlamaModel> m;
  Status s = LlamaModel::Load(testing::SharedDir() + "/models/" + name, LoadOptions(), &m);
  if (!s.ok()) throw std::runtime_error(s.ToString());
  return m;
}

std::unique_ptr<Eagle3Head> Init(const LlamaModel& target, Eagle3Head::InitOptions o = {}) {
  std::unique_ptr<Eagle3Head> head;
  Status s = Eagle3Head::InitFromTarget(target, o, &head);
  if (!s.ok()) throw std::runtime_error(s.ToString());
  return head;
}

// A tiny random target of 4 layers (features: the inputs of layers 1, 2, 3).
ModelConfig TinyTarget(int vocab) {
  ModelConfig c = testing::TinyFourLayerConfig();
  c.vocab_size = vocab;
  return c;
}

// A head whose every tensor is perturbed (the initial head computes the target's last layer;
// noise makes q differ from p everywhere, so that rejections and recoveries happen).
std::unique_ptr<Eagle3Head> NoisyHead(const LlamaModel& target, int draft_vocab,
                                      std::vector<int64_t> counts, uint64_t seed) {
  Eagle3Head::InitOptions o;
  o.aux_layers = {1, 2, 3};
  o.draft_vocab_size = draft_vocab;
  o.token_counts = std::move(counts);
  auto head = Init(target, o);
  at::manual_seed(seed);
  TensorMap w;
  for (const auto& [name, t] : head->NamedWeights()) {
    w[name] = t.is_floating_point() ? t + at::randn(t.sizes()) * 0.3 : t;
  }
  std::unique_ptr<Eagle3Head> noisy;
  Status s = Eagle3Head::FromTensors(head->config(), w, target, LoadOptions(), &noisy);
  if (!s.ok()) throw std::runtime_error(s.ToString());
  return noisy;
}

// One decode step's slot of a sequence drafting from the head.
struct FeatureSequence {
  FeatureSequence(const LlamaModel* target, const Eagle3Head* head, const std::vector<int>& prompt,
                  const GenerateOptions& g, int k)
      : proposer(head, g.sampling), decoder(target, &proposer, prompt, g) {
    slot.decoder = &decoder;
    slot.proposer = &proposer;
    slot.feature_proposer = &proposer;
    slot.fixed_k = k;
  }
  FeatureDraftProposer proposer;
  SpeculativeDecoder decoder;
  DecodeSlot slot;
};

// Steps every sequence to its end in batched decode steps; returns the steps of each kind.
std::map<BlockKind, int> RunToEnd(const LlamaModel& target,
                                  std::vector<std::unique_ptr<FeatureSequence>>* seqs) {
  std::map<BlockKind, int> kinds;
  for (;;) {
    std::vector<DecodeSlot*> slots;
    for (auto& s : *seqs) {
      if (!s->decoder.finished()) slots.push_back(&s->slot);
    }
    if (slots.empty()) return kinds;
    DecodeStep(target, nullptr, slots);
    for (DecodeSlot* slot : slots) {
      EXPECT_TRUE(slot->error.empty()) << slot->error;
      if (!slot->error.empty()) return kinds;
      kinds[slot->kind]++;
    }
  }
}

TEST(Eagle3Head, SavesAndLoadsBackBitIdentically) {
  c10::InferenceMode guard;
  auto target = testing::RandomModel(TinyTarget(97), 7);
  std::vector<int64_t> counts(97, 0);
  for (int i = 0; i < 97; ++i) counts[i] = (i * 37) % 97;
  auto head = NoisyHead(*target, 60, counts, 3);
  testing::TempDir dir;
  ASSERT_TRUE(head->Save(dir.path()).ok());
  std::unique_ptr<Eagle3Head> back;
  Status s = Eagle3Head::Load(dir.path(), *target, LoadOptions(), &back);
  ASSERT_TRUE(s.ok()) << s.ToString();
  const auto a = head->NamedWeights(), b = back->NamedWeights();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(at::equal(a[i].second, b[i].second)) << a[i].first;
  }
  EXPECT_EQ(back->config().aux_layers, (std::vector<int>{1, 2, 3}));
  // The draft vocabulary: the 60 most frequent ids, ascending.
  ASSERT_EQ(back->draft_to_target().size(), 60u);
  for (int d = 0; d < 60; ++d) {
    EXPECT_GE(counts[back->ToTarget(d)], 97 - 60) << d;
    if (d > 0) EXPECT_LT(back->ToTarget(d - 1), back->ToTarget(d));
  }
}

TEST(Eagle3Head, RefusesWhatItCannotRunNamingIt) {
  c10::InferenceMode guard;
  auto target = testing::RandomModel(TinyTarget(97), 7);
  auto head = NoisyHead(*target, 97, {}, 3);
  TensorMap w;
  for (const auto& [name, t] : head->NamedWeights()) w[name] = t;
  auto refused = [&](const TensorMap& tensors, Eagle3Config c, const std::string& what) {
    std::unique_ptr<Eagle3Head> out;
    Status s = Eagle3Head::FromTensors(c, tensors, *target, LoadOptions(), &out);
    EXPECT_FALSE(s.ok()) << what;
    EXPECT_NE(s.ToString().find(what), std::string::npos) << s.ToString();
  };
  TensorMap missing = w;
  missing.erase("midlayer.hidden_norm.weight");
  refused(missing, head->config(), "midlayer.hidden_norm.weight");
  TensorMap extra = w;
  extra["midlayer.self_attn.q_proj.bias"] = at::zeros({32});
  refused(extra, head->config(), "midlayer.self_attn.q_proj.bias");
  TensorMap wrong = w;
  wrong["fc.weight"] = at::zeros({32, 64});
  refused(wrong, head->config(), "fc.weight");
  Eagle3Config deep = head->config();
  deep.aux_layers = {1, 2, 4};
  refused(w, deep, "layer 4");
  Eagle3Config smaller = head->config();
  smaller.draft_vocab_size = 50;  // no d2t / t2d for it
  TensorMap cut = w;
  cut["lm_head.weight"] = w["lm_head.weight"].narrow(0, 0, 50);
  refused(cut, smaller, "d2t");
  cut["d2t"] = at::zeros({50}, at::kLong);  // draft id d -> target id d
  cut["t2d"] = at::zeros({97}, at::kBool);  // ... but t2d marks none of them
  refused(cut, smaller, "t2d");
}

// The training forward (training-time test) computes what drafting computes: step j's logits
// at row t are those of the head's chain drafted after position t, fed the same tokens.
TEST(Eagle3Head, UnrolledTrainingForwardEqualsDrafting) {
  c10::InferenceMode guard;
  auto target = testing::RandomModel(TinyTarget(97), 7);
  auto head = NoisyHead(*target, 97, {}, 5);
  const std::vector<int64_t> tokens = {1, 5, 9, 33, 2, 70, 41, 8, 16, 23, 4, 90};
  const int steps = 3, T = static_cast<int>(tokens.size()) - steps;
  KVCache tc = target->NewCache();
  at::Tensor features;
  target->Forward({{&tc, tokens, true}}, head->config().aux_layers, &features);
  const auto unrolled = head->ForwardUnrolled(features.narrow(0, 0, T), tokens, steps);
  ASSERT_EQ(unrolled.size(), 3u);
  for (int t : {0, 3, T - 1}) {
    // Drafting after position t: the features of 0..t, then the head's own hidden states.
    Eagle3Head::Cache cache = head->NewCache();
    at::Tensor hidden;
    std::vector<int64_t> next(tokens.begin() + 1, tokens.begin() + t + 2);
    at::Tensor logits = head->Forward({{&cache, features.narrow(0, 0, t + 1), next}}, &hidden);
    for (int j = 0; j < steps; ++j) {
      EXPECT_LT((logits[0] - unrolled[j][t]).abs().max().item<double>(), 1e-4)
          << "step " << j << " row " << t;
      if (j + 1 == steps) break;
      logits = head->Forward({{&cache, hidden, {tokens[t + j + 2]}}}, &hidden);
    }
  }
}

// Batched head forwards give each sequence the rows it gets alone, and the CPU kernels (packed
// matrices) agree with the ATen path the trainer runs.
TEST(Eagle3Head, BatchedForwardEqualsAloneAndKernelsEqualAten) {
  c10::InferenceMode guard;
  auto target = testing::RandomModel(TinyTarget(97), 7);
  auto head = NoisyHead(*target, 97, {}, 5);
  const at::Tensor f = at::randn({9, head->feature_width()});
  auto run = [&](const Eagle3Head& h, bool batched) {
    Eagle3Head::Cache a = h.NewCache(), b = h.NewCache(2);
    std::vector<Eagle3Head::Input> in = {{&a, f.narrow(0, 0, 5), {3, 4, 5, 6, 7}},
                                         {&b, f.narrow(0, 5, 4), {8, 9, 10, 11}}};
    if (batched) return h.Forward(in, nullptr);
    return at::cat({h.Forward({in[0]}, nullptr), h.Forward({in[1]}, nullptr)}, 0);
  };
  const at::Tensor alone = run(*head, false);
  EXPECT_TRUE(at::equal(run(*head, true), alone));
  TensorMap w;
  for (const auto& [name, t] : head->NamedWeights()) w[name] = t.clone();
  std::unique_ptr<Eagle3Head> aten;
  ASSERT_TRUE(Eagle3Head::FromTensors(head->config(), w, *target, LoadOptions(), &aten).ok());
  aten->Parameters();  // from here on: the ATen forward
  EXPECT_LT((run(*aten, false) - alone).abs().max().item<double>(), 1e-4);
}

// Greedy speculative decoding through the head equals plain greedy decoding on the fixture
// target, in batched decode steps (the head's forwards batched across the sequences).
TEST(FeatureDraft, GreedySpeculativeEqualsGreedyPlainOnEveryDomain) {
  c10::InferenceMode guard;
  auto target = Load("target-6m");
  auto head = Init(*target);
  std::unique_ptr<Tokenizer> tok;
  ASSERT_TRUE(Tokenizer::Load(testing::SharedDir() + "/models/target-6m", &tok).ok());
  GenerateOptions g;
  g.max_tokens = 40;
  g.stop_at_eos = false;
  g.sampling.temperature = 0;
  std::vector<std::unique_ptr<FeatureSequence>> seqs;
  std::vector<std::vector<int>> prompts;
  for (const char* domain : {"prose", "python", "c", "legal", "docs"}) {
    std::ifstream f(testing::SharedDir() + "/prompts/" + domain + ".jsonl");
    std::string line;
    for (int i = 0; i < 2 && std::getline(f, line);) {
      std::vector<int> ids = tok->Encode(nlohmann::json::parse(line)["prompt"].get<std::string>());
      if (ids.size() > 120) ids.erase(ids.begin(), ids.end() - 120);
      ids.insert(ids.begin(), 1);
      prompts.push_back(ids);
      seqs.push_back(std::make_unique<FeatureSequence>(target.get(), head.get(), ids, g, 4));
      ++i;
    }
  }
  auto kinds = RunToEnd(*target, &seqs);
  SpeculativeStats total;
  for (size_t i = 0; i < seqs.size(); ++i) {
    EXPECT_EQ(seqs[i]->decoder.generated(), GeneratePlain(*target, prompts[i], g).tokens) << i;
    total.Add(seqs[i]->decoder.stats());
  }
  EXPECT_GT(kinds[BlockKind::kFeatureDraft], 40);
  EXPECT_GT(total.drafted, 200);
  EXPECT_LT(total.accepted, total.drafted);
  std::cout << "feature draft (initial head) on target-6m: " << total.accepted << " of "
            << total.drafted << " accepted, mean acceptance length "
            << total.mean_acceptance_length() << "\n";
}

// Calibration times a head's drafting forwards (CalibrationOptions::head) as a draft model's:
// the table then prices its blocks before the first step measures them.
TEST(FeatureDraft, CalibrationTimesTheHeadsForwards) {
  c10::InferenceMode guard;
  auto target = Load("target-6m");
  auto head = Init(*target);
  CalibrationOptions co;
  co.max_batch = 2;
  StepCostTable free_costs, head_costs;
  CalibrateStepCosts(*target, nullptr, 4, &free_costs, co);
  co.head = head.get();
  CalibrateStepCosts(*target, nullptr, 4, &head_costs, co);
  EXPECT_EQ(free_costs.DraftSeconds(1), 0.0);
  EXPECT_GT(head_costs.DraftSeconds(1), 0.0);
  EXPECT_GT(head_costs.DraftSeconds(2), 0.0);
  // One layer of the target's width against its six: cheaper than a target step.
  EXPECT_LT(head_costs.DraftSeconds(1), head_costs.TargetSeconds(1, 256));
}

struct FeatureCase {
  const char* name;
  int draft_vocab;  // < 5: a reduced draft vocabulary (q is 0 outside it)
  bool wrong_verifier;
};

class FeatureDraftExactness : public ::testing::TestWithParam<FeatureCase> {};

// Tiny random target over 5 tokens and a perturbed head; three sampled tokens (125 cells) at
// temperature 0.8 with top-p 0.9, k = 2, in decode steps of 8 sequences (batched head
// forwards). G-test at kSignificance = 1e-3; the q/p verifier must be rejected.
TEST_P(FeatureDraftExactness, SequenceLawEqualsTargetLaw) {
  c10::InferenceMode guard;
  const FeatureCase& c = GetParam();
  auto target = testing::RandomModel(TinyTarget(5), 101);
  std::vector<int64_t> counts = {5, 4, 0, 3, 2};  // a reduced vocabulary leaves token 2 out
  auto head = NoisyHead(*target, c.draft_vocab, counts, 202);
  const std::vector<int> prompt = {1, 3, 0, 4};
  SamplingParams sp;
  sp.temperature = 0.8f;
  sp.top_p = 0.9f;
  const int len = 3, trials = 16000, batch = 8;
  std::vector<int64_t> cells(125, 0);
  SpeculativeStats total;
  std::map<BlockKind, int> kinds;
  for (int t0 = 0; t0 < trials; t0 += batch) {
    std::vector<std::unique_ptr<FeatureSequence>> seqs;
    for (int t = t0; t < t0 + batch; ++t) {
      GenerateOptions g;
      g.max_tokens = len;
      g.stop_at_eos = false;
      g.sampling = sp;
      g.sampling.seed = 1000 + t;
      seqs.push_back(std::make_unique<FeatureSequence>(target.get(), head.get(), prompt, g, 2));
      if (c.wrong_verifier) seqs.back()->decoder.set_verifier_for_testing(&AcceptWithQOverP);
    }
    for (const auto& [kind, n] : RunToEnd(*target, &seqs)) kinds[kind] += n;
    for (auto& s : seqs) {
      const auto out = s->decoder.generated();
      ASSERT_EQ(out.size(), 3u);
      cells[out[0] * 25 + out[1] * 5 + out[2]]++;
      total.Add(s->decoder.stats());
    }
  }
  const auto result = GTest(cells, ExactSequenceLaw(*target, prompt, len, sp));
  if (c.wrong_verifier) {
    EXPECT_TRUE(result.impossible || result.p_value < kSignificance) << result.ToString();
  } else {
    EXPECT_GE(result.p_value, kSignificance) << result.ToString();
  }
  // The path was taken: feature-draft blocks, partly accepted.
  EXPECT_GT(kinds[BlockKind::kFeatureDraft], trials);
  EXPECT_GT(total.drafted, trials);
  EXPECT_GT(total.accepted, 0);
  EXPECT_LT(total.accepted, total.drafted);
  std::cout << c.name << ": " << result.ToString() << "; feature blocks "
            << kinds[BlockKind::kFeatureDraft] << ", plain steps " << kinds[BlockKind::kNone]
            << "; accepted " << total.accepted << " of " << total.drafted << "\n";
}

INSTANTIATE_TEST_SUITE_P(Cases, FeatureDraftExactness,
                         ::testing::Values(FeatureCase{"FullVocabulary", 5, false},
                                           FeatureCase{"ReducedVocabulary", 4, false},
                                           FeatureCase{"WrongVerifierIsCaught", 5, true}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace specloop
