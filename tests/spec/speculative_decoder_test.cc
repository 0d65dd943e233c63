// Speculative decoding end to end: greedy output equals plain greedy output on the fixture
// models, and sampled output follows the target's distribution exactly on tiny models.
#include "common/engine/speculative_decoder.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "common/engine/decode_step.h"
#include "common/engine/draft_model_proposer.h"
#include "common/spec/prompt_lookup_proposer.h"
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

std::unique_ptr<LlamaModel> Load(const std::string& name,
                                  const LoadOptions& options = LoadOptions()) {
  std::unique_ptr<LlamaModel> m;
  Status s = LlamaModel::Load(testing::SharedDir() + "/models/" + name, options, &m);
  if (!s.ok()) throw std::runtime_error(s.ToString());
  return m;
}

// The first `n` prompts of a domain, encoded with BOS, cut to their last 200 tokens.
std::vector<std::vector<int>> Prompts(const Tokenizer& tok, const std::string& domain, int n) {
  std::ifstream in(testing::SharedDir() + "/prompts/" + domain + ".jsonl");
  std::vector<std::vector<int>> out;
  for (std::string line; (int)out.size() < n && std::getline(in, line);) {
    std::vector<int> ids = tok.Encode(nlohmann::json::parse(line)["prompt"].get<std::string>());
    if (ids.size() > 200) ids.erase(ids.begin(), ids.end() - 200);
    ids.insert(ids.begin(), 1);
    out.push_back(ids);
  }
  return out;
}

TEST(SpeculativeDecoder, GreedyEqualsPlainGreedyOnEveryDomain) {
  c10::InferenceMode guard;
  auto target = Load("target-6m");
  std::unique_ptr<Tokenizer> tok;
  ASSERT_TRUE(Tokenizer::Load(testing::SharedDir() + "/models/target-6m", &tok).ok());
  GenerateOptions g;
  g.max_tokens = 40;
  g.sampling.temperature = 0;
  for (const char* draft_name : {"draft-mix-1m", "draft-prose-1m"}) {
    auto draft = Load(draft_name);
    SpeculativeStats total;
    TreeAcceptance trees({3, 2, 1});
    for (const char* domain : {"prose", "python", "c", "legal", "docs"}) {
      for (const auto& prompt : Prompts(*tok, domain, 2)) {
        const std::vector<int> plain = GeneratePlain(*target, prompt, g).tokens;
        DraftModelProposer model(draft.get(), g.sampling);
        DraftModelProposer tree(draft.get(), g.sampling);
        tree.set_tree_branching({3, 2, 1});
        PromptLookupProposer lookup(4096, true);
        FallbackProposer both(&lookup, &model);
        SpeculationPolicy policy, tree_policy;
        StepCostTable costs, tree_costs;
        // Modes: fixed k, adaptive k, prompt lookup falling back to the draft, a token tree,
        // adaptive k with token trees on offer.
        for (int mode = 0; mode < 5; ++mode) {
          SpeculativeOptions o;
          o.generate = g;
          o.k = 5;
          if (mode == 1) {
            o.policy = &policy;
            o.costs = &costs;
          }
          if (mode == 4) {
            o.policy = &tree_policy;
            o.costs = &tree_costs;
            o.tree = &trees;
          }
          Proposer* p = mode == 2 ? static_cast<Proposer*>(&both) : &model;
          if (mode == 3) p = &tree;
          SpeculativeStats stats;
          EXPECT_EQ(GenerateSpeculative(*target, p, prompt, o, &stats).tokens, plain)
              << draft_name << " " << domain << " mode " << mode;
          total.Add(stats);
        }
      }
    }
    // Speculation did happen and was partly accepted (else the equality proves little).
    EXPECT_GT(total.drafted, 200) << draft_name;
    EXPECT_GT(total.accepted, 20) << draft_name;
    EXPECT_LT(total.accepted, total.drafted) << draft_name;
    EXPECT_GT(trees.alpha.weight(), 8.5) << draft_name << ": trees on offer were drafted";
  }
}

// A wrong multi-draft verifier: tests each candidate against the original p and q, never
// moving to the residual distribution between candidates.
Status NoResidualUpdate(int vocab, const std::vector<int>& drafts, const float* q, const float* p,
                        Rng* rng, spec::MultiDraftOutcome* out) {
  for (size_t j = 0; j < drafts.size(); ++j) {
    const int x = drafts[j];
    if (rng->Uniform() * q[x] < p[x]) {
      out->token = x;
      out->accepted_index = j;
      return Status::OK();
    }
  }
  std::vector<float> residual(vocab);
  float mass = 0;
  for (int v = 0; v < vocab; ++v) mass += residual[v] = std::max(0.0f, p[v] - q[v]);
  out->token = SampleFrom(mass > 0 ? residual.data() : p, vocab, rng);
  out->accepted_index = -1;
  return Status::OK();
}

// The --min-confidence rule before issue 27, kept to show that the exactness test catches it:
// the block is drawn as DraftModelProposer draws it, then cut before the first token whose own
// q is below c. A kept token then follows q restricted to {q >= c}, verified against all of q.
class DropsLowConfidenceTokens : public Proposer {
 public:
  DropsLowConfidenceTokens(Proposer* inner, float c) : inner_(inner), c_(c) {}
  void Propose(const std::vector<int>& context, int max_k, DraftBlock* out) override {
    inner_->Propose(context, max_k, out);
    if (out->tokens.empty()) return;
    const size_t V = out->probs.size() / out->tokens.size();
    for (size_t i = 0; i < out->tokens.size(); ++i) {
      if (out->probs[i * V + out->tokens[i]] < c_) {
        out->tokens.resize(i);
        out->probs.resize(i * V);
        return;
      }
    }
  }

 private:
  Proposer* inner_;
  float c_;
};

struct ExactnessCase {
  const char* name;
  int draft_seed;  // 0: the draft is the target itself (q = p)
  bool prompt_lookup;
  bool wrong_verifier;
  bool tree = false;  // a token tree with 2 children per node, depth 2
  float min_confidence = 0.0f;
  bool old_confidence_rule = false;  // min_confidence applied by DropsLowConfidenceTokens
  bool lookup_then_draft = false;    // prompt lookup, the draft model where it finds nothing
  bool qwen = false;  // a Qwen3 target (q/k norms) and a Qwen2 draft (q/k/v biases)
};

class SpeculativeExactness : public ::testing::TestWithParam<ExactnessCase> {};

TEST_P(SpeculativeExactness, SequenceLawEqualsTargetLaw) {
  // Tiny random models over a 5-token vocabulary; three generated tokens (125 cells), k = 2 so
  // steps mix rejections, recoveries and bonus tokens; temperature 0.8 with top-p 0.9, which
  // cuts tokens out of some rows (supports of p and q differ). G-test at kSignificance = 1e-3.
  c10::InferenceMode guard;
  const ExactnessCase& c = GetParam();
  ModelConfig cfg = c.qwen ? testing::TinyQwen3Config() : testing::TinyConfig();
  ModelConfig draft_cfg = c.qwen ? testing::TinyQwen2Config() : cfg;
  cfg.vocab_size = draft_cfg.vocab_size = 5;
  auto target = testing::RandomModel(cfg, 101);
  auto other = testing::RandomModel(draft_cfg, c.draft_seed);
  const LlamaModel* draft = c.draft_seed ? other.get() : target.get();
  const std::vector<int> prompt = {1, 3, 0, 4};
  SamplingParams sp;
  sp.temperature = 0.8f;
  sp.top_p = 0.9f;
  const int len = 3, trials = 20000;

  std::vector<int64_t> counts(125, 0);
  int64_t drafted = 0, accepted = 0, steps = 0;
  for (int t = 0; t < trials; ++t) {
    GenerateOptions g;
    g.max_tokens = len;
    g.stop_at_eos = false;
    g.sampling = sp;
    g.sampling.seed = 1000 + t;
    DraftModelProposer model(draft, g.sampling, c.old_confidence_rule ? 0.0f : c.min_confidence);
    if (c.tree) model.set_tree_branching({2, 2});
    PromptLookupProposer lookup(5, false, 1, 2);
    FallbackProposer lookup_then_draft(&lookup, &model);
    DropsLowConfidenceTokens old_rule(&model, c.min_confidence);
    Proposer* p = &model;
    if (c.prompt_lookup) p = &lookup;
    if (c.lookup_then_draft) p = &lookup_then_draft;
    if (c.old_confidence_rule) p = &old_rule;
    SpeculativeDecoder dec(target.get(), p, prompt, g);
    if (c.wrong_verifier && !c.tree) dec.set_verifier_for_testing(&AcceptWithQOverP);
    if (c.wrong_verifier && c.tree) dec.set_multi_draft_verifier_for_testing(&NoResidualUpdate);
    while (!dec.finished()) {
      dec.Propose(2);
      dec.Commit(target->Forward({dec.TargetInput()}));
    }
    const auto out = dec.generated();
    ASSERT_EQ(out.size(), 3u);
    counts[out[0] * 25 + out[1] * 5 + out[2]]++;
    drafted += dec.stats().drafted;
    accepted += dec.stats().accepted;
    steps += dec.stats().steps;
  }
  const auto result = GTest(counts, ExactSequenceLaw(*target, prompt, len, sp));
  if (c.wrong_verifier || c.old_confidence_rule) {
    EXPECT_TRUE(result.impossible || result.p_value < kSignificance) << result.ToString();
  } else {
    EXPECT_GE(result.p_value, kSignificance) << result.ToString();
  }
  // The case exercised what it claims to.
  // Early stops happened: fewer than one draft token per step, against about two without a
  // threshold (k = 2).
  if (c.min_confidence > 0) {
    EXPECT_LT(drafted, steps);
    EXPECT_GT(drafted, trials / 2);
  } else {
    EXPECT_GT(drafted, trials);
  }
  if (c.draft_seed == 0 && !c.prompt_lookup && !c.tree) {
    EXPECT_EQ(accepted, drafted);  // q = p: every draft token is accepted
  } else {
    EXPECT_LT(accepted, drafted);
    EXPECT_GT(accepted, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, SpeculativeExactness,
    ::testing::Values(ExactnessCase{"DraftModel", 202, false, false},
                      ExactnessCase{"DraftIsTarget", 0, false, false},
                      ExactnessCase{"PromptLookup", 202, true, false},
                      ExactnessCase{"WrongVerifierIsCaught", 202, false, true},
                      ExactnessCase{"Tree", 202, false, false, true},
                      ExactnessCase{"TreeDraftIsTarget", 0, false, false, true},
                      ExactnessCase{"WrongTreeVerifierIsCaught", 202, false, true, true},
                      ExactnessCase{"MinConfidence", 202, false, false, false, 0.5f},
                      ExactnessCase{"OldMinConfidenceRuleIsCaught", 202, false, false, false,
                                    0.5f, true},
                      ExactnessCase{"PromptLookupThenDraft", 202, false, false, false, 0.0f,
                                    false, true},
                      ExactnessCase{"Qwen3TargetQwen2Draft", 202, false, false, false, 0.0f,
                                    false, false, true},
                      ExactnessCase{"Qwen3TargetQwen2DraftTree", 202, false, false, true, 0.0f,
                                    false, false, true},
                      ExactnessCase{"Qwen3WrongVerifierIsCaught", 202, false, true, false, 0.0f,
                                    false, false, true}),
    [](const auto& info) { return std::string(info.param.name); });

// The zoo's Qwen3 pair, the real checkpoints (qwen3-target, qwen3-draft: vocabulary 4096, q/k
// norms, 16 heads of 32 over hidden 256): the law of two sampled tokens under speculative
// decoding equals the target's. Temperature 0.8 with top-k 5 keeps the law to 25 cells (the
// draft samples under the same parameters, so supports differ and rejections, residual draws and
// bonus tokens all occur at k = 2). G-test at kSignificance = 1e-3; the companion runs the
// same draws through the q/p verifier and must be rejected.
class ZooQwen3Exactness : public ::testing::TestWithParam<bool> {};

TEST_P(ZooQwen3Exactness, TwoTokenLawEqualsTargetLaw) {
  c10::InferenceMode guard;
  const bool wrong_verifier = GetParam();
  auto target = Load("zoo/qwen3-target");
  auto draft = Load("zoo/qwen3-draft");
  const std::vector<int> prompt = {1, 3996, 301, 500, 282};
  SamplingParams sp;
  sp.temperature = 0.8f;
  sp.top_k = 5;
  const int V = target->config().vocab_size, trials = 6000;

  // The target's law over its top-5 support: p(x1) p(x2 | x1).
  std::vector<std::pair<int, int>> cells;
  std::vector<double> law;
  {
    KVCache cache = target->NewCache();
    at::Tensor logits = target->Forward({{&cache, {prompt.begin(), prompt.end()}, false}});
    std::vector<float> p1, p2;
    ProcessedDistribution(logits.data_ptr<float>(), V, sp, &p1);
    for (int x1 = 0; x1 < V; ++x1) {
      if (p1[x1] == 0) continue;
      std::vector<int64_t> seq(prompt.begin(), prompt.end());
      seq.push_back(x1);
      KVCache c2 = target->NewCache();
      at::Tensor l2 = target->Forward({{&c2, seq, false}});
      ProcessedDistribution(l2.data_ptr<float>(), V, sp, &p2);
      for (int x2 = 0; x2 < V; ++x2) {
        if (p2[x2] == 0) continue;
        cells.emplace_back(x1, x2);
        law.push_back(static_cast<double>(p1[x1]) * p2[x2]);
      }
    }
  }
  ASSERT_EQ(cells.size(), 25u);

  std::vector<int64_t> counts(cells.size() + 1, 0);  // the last cell: outside the support
  law.push_back(0.0);
  SpeculativeStats total;
  for (int t = 0; t < trials; ++t) {
    GenerateOptions g;
    g.max_tokens = 2;
    g.stop_at_eos = false;
    g.sampling = sp;
    g.sampling.seed = 5000 + t;
    DraftModelProposer proposer(draft.get(), g.sampling);
    SpeculativeDecoder dec(target.get(), &proposer, prompt, g);
    if (wrong_verifier) dec.set_verifier_for_testing(&AcceptWithQOverP);
    while (!dec.finished()) {
      dec.Propose(2);
      dec.Commit(target->Forward({dec.TargetInput()}));
    }
    const auto out = dec.generated();
    ASSERT_EQ(out.size(), 2u);
    size_t cell = cells.size();
    for (size_t i = 0; i < cells.size(); ++i) {
      if (cells[i] == std::make_pair(out[0], out[1])) cell = i;
    }
    counts[cell]++;
    total.Add(dec.stats());
  }
  const auto result = GTest(counts, law);
  std::printf("[ measured ] %s: %s, alpha %.3f\n", wrong_verifier ? "q/p verifier" : "exact",
              result.ToString().c_str(),
              static_cast<double>(total.accepted) / std::max<int64_t>(1, total.drafted));
  if (wrong_verifier) {
    EXPECT_TRUE(result.impossible || result.p_value < kSignificance) << result.ToString();
  } else {
    EXPECT_GE(result.p_value, kSignificance) << result.ToString();
  }
  // Rejections and acceptances both happened.
  EXPECT_GT(total.drafted, trials);
  EXPECT_GT(total.accepted, trials / 4);
  EXPECT_LT(total.accepted, total.drafted);
}

INSTANTIATE_TEST_SUITE_P(Verifiers, ZooQwen3Exactness, ::testing::Values(false, true),
                         [](const auto& info) {
                           return std::string(info.param ? "WrongVerifierIsCaught" : "Exact");
                         });

// alpha* as the decoder reports it (last_optimal(), summed in stats): on chains it is the
// verifier's own expected acceptance at each tested position, so over many steps it agrees
// with the measured per-token acceptance (accepted / tested); on trees of two children per
// node the optimal verifier can beat recursive rejection, so alpha* >= measured. The
// difference of the measured and expected sums has variance sum alpha_i (1 - alpha_i) <= n / 4:
// bounds at z = 3.29 (two-sided level kSignificance = 1e-3). Companion: accepted / drafted,
// the old k-dependent reading, is outside the same bound.
TEST(SpeculativeDecoder, ReportsTheOptimalAcceptanceOfTheDraftsProposed) {
  c10::InferenceMode guard;
  ModelConfig cfg = testing::TinyConfig();
  cfg.vocab_size = 16;
  auto target = testing::RandomModel(cfg, 301);
  auto draft = testing::RandomModel(cfg, 302);
  const double z = 3.29;
  for (bool tree : {false, true}) {
    SpeculativeStats total;
    for (int t = 0; t < 400; ++t) {
      GenerateOptions g;
      g.max_tokens = 24;
      g.stop_at_eos = false;
      g.sampling.temperature = 0.9f;
      g.sampling.seed = 500 + t;
      DraftModelProposer model(draft.get(), g.sampling);
      if (tree) model.set_tree_branching({2, 2, 2});
      SpeculativeDecoder dec(target.get(), &model, {1, 5, 9, 2}, g);
      while (!dec.finished()) {
        dec.Propose(3);
        dec.Commit(target->Forward({dec.TargetInput()}));
        const auto& o = dec.last_optimal();
        ASSERT_GE(o.expected, 0.0);
        ASSERT_LE(o.expected, o.positions + 1e-9);
      }
      total.Add(dec.stats());
    }
    const double n = total.optimal_positions;
    ASSERT_GT(n, 2000);
    const double measured = total.accepted / n, optimal = total.optimal / n;
    const double bound = z * 0.5 / std::sqrt(n);
    if (!tree) {
      // A chain tests the accepted positions and the first rejection.
      EXPECT_EQ(total.optimal_positions, total.tested);
      EXPECT_EQ(total.tested, total.accepted + (total.steps - total.accepted_at[2]));
      EXPECT_NEAR(measured, optimal, bound);
      EXPECT_GT(std::abs(static_cast<double>(total.accepted) / total.drafted - optimal), bound)
          << "accepted / drafted should read lower than the per-token rate at k = 3";
    } else {
      EXPECT_GE(optimal, measured - bound);
    }
  }
}

TEST(SpeculativeDecoder, StatsAddUp) {
  c10::InferenceMode guard;
  auto target = testing::RandomModel(testing::TinyConfig(), 5);
  auto draft = testing::RandomModel(testing::TinyConfig(), 6);
  GenerateOptions g;
  g.max_tokens = 50;
  g.stop_at_eos = false;
  g.sampling.seed = 9;
  DraftModelProposer model(draft.get(), g.sampling);
  SpeculativeOptions o;
  o.generate = g;
  o.k = 3;
  SpeculativeStats s;
  GenerateResult r = GenerateSpeculative(*target, &model, {1, 2, 3}, o, &s);
  EXPECT_EQ(r.tokens.size(), 50u);
  EXPECT_GE(s.emitted, 50);             // the last step may overshoot max_tokens
  EXPECT_LT(s.emitted, 50 + 4);
  EXPECT_EQ(s.emitted, s.steps + s.accepted);
  EXPECT_EQ(s.k_sum, 3 * s.steps);
  // Tested: every accepted position, plus the first rejection of each block cut short.
  EXPECT_EQ(s.tested, s.accepted + s.steps - s.accepted_at[2]);
  EXPECT_EQ(s.accepted_at[0], [&] {     // steps whose first draft was accepted
    int64_t n = 0;
    for (size_t i = 0; i < s.accepted_at.size(); ++i) n = std::max(n, s.accepted_at[i]);
    return n;
  }());
}

// A step that drafts nothing is plain decoding's step: with the same seed, the speculative path
// held at k = 0 emits plain decoding's sampled tokens, one for one (auto k's floor is plain).
TEST(SpeculativeDecoder, AtKZeroSamplesAsPlainDecodingDoes) {
  c10::InferenceMode guard;
  auto target = testing::RandomModel(testing::TinyConfig(), 5);
  auto draft = testing::RandomModel(testing::TinyConfig(), 6);
  GenerateOptions g;
  g.max_tokens = 40;
  g.stop_at_eos = false;
  g.sampling.temperature = 0.8f;
  g.sampling.top_p = 0.9f;
  std::set<std::vector<int>> distinct;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    g.sampling.seed = seed;
    const std::vector<int> plain = GeneratePlain(*target, {1, 2, 3}, g).tokens;
    distinct.insert(plain);
    DraftModelProposer model(draft.get(), g.sampling);
    SpeculativeOptions o;
    o.generate = g;
    o.k = 0;
    EXPECT_EQ(GenerateSpeculative(*target, &model, {1, 2, 3}, o, nullptr).tokens, plain)
        << "seed " << seed;
  }
  // The seeds drew different sequences: the equality above compares samples, not a constant.
  EXPECT_EQ(distinct.size(), 4u);
}

// spec_bench steps a plain and a speculative generation in lockstep: interleaved step by step,
// each emits what it emits alone (they share the models, nothing else), and each times only
// its own steps.
TEST(SpeculativeDecoder, GenerationsSteppedInLockstepMatchTheirRunsAlone) {
  c10::InferenceMode guard;
  auto target = testing::RandomModel(testing::TinyConfig(), 5);
  auto draft = testing::RandomModel(testing::TinyConfig(), 6);
  GenerateOptions g;
  g.max_tokens = 30;
  g.stop_at_eos = false;
  g.sampling.temperature = 0.8f;
  g.sampling.seed = 3;
  SpeculativeOptions o;
  o.generate = g;
  o.k = 3;
  const std::vector<int> prompt = {1, 2, 3, 4};
  DraftModelProposer alone_model(draft.get(), g.sampling);
  const GenerateResult plain_alone = GeneratePlain(*target, prompt, g);
  const GenerateResult spec_alone = GenerateSpeculative(*target, &alone_model, prompt, o, nullptr);

  DraftModelProposer model(draft.get(), g.sampling);
  PlainGeneration plain(*target, prompt, g);
  SpeculativeGeneration spec(*target, &model, prompt, o);
  int plain_steps = 0, spec_steps = 0;
  while (!plain.finished() || !spec.finished()) {
    if (!plain.finished()) plain.Step(), ++plain_steps;
    if (!spec.finished()) spec.Step(), ++spec_steps;
  }
  EXPECT_EQ(plain.result().tokens, plain_alone.tokens);
  EXPECT_EQ(spec.result().tokens, spec_alone.tokens);
  EXPECT_NE(plain.result().tokens, spec.result().tokens);  // two samples, not one shared stream
  EXPECT_EQ(plain_steps, 29);  // the first token comes from the prefill
  EXPECT_EQ(spec_steps, spec.stats().steps);
  EXPECT_GT(plain.result().prefill_seconds, 0);
  EXPECT_GT(spec.result().prefill_seconds, 0);
  EXPECT_GT(plain.result().decode_seconds, 0);
  EXPECT_DOUBLE_EQ(spec.result().decode_seconds, spec.decode_seconds());
}

TEST(DraftModelProposer, ReportsTheCatchUpItOwesAndDid) {
  c10::InferenceMode guard;
  auto draft = testing::RandomModel(testing::TinyConfig(), 6);
  SamplingParams greedy;
  greedy.temperature = 0;
  DraftModelProposer model(draft.get(), greedy);
  std::vector<int> context = {1, 5, 9, 2, 7, 3};
  EXPECT_EQ(model.CatchUpTokens(context), 6);  // a new sequence owes its whole context
  DraftBlock block;
  model.Propose(context, 3, &block);
  ASSERT_EQ(block.tokens.size(), 3u);
  EXPECT_EQ(model.last_catch_up().tokens, 6);
  EXPECT_GT(model.last_catch_up().seconds, 0.0);
  EXPECT_GT(model.last_propose_seconds(), 0.0);
  // Steady state: the first draft accepted, then the recovered token: one token to feed.
  context.push_back(block.tokens[0]);
  context.push_back(block.tokens[1] + 1);
  EXPECT_EQ(model.CatchUpTokens(context), 0);
  model.Propose(context, 2, &block);
  EXPECT_EQ(model.last_catch_up().tokens, 0);
  EXPECT_EQ(model.last_catch_up().seconds, 0.0);
  // Five tokens decoded without drafting (none equal to the draft cached last): owed.
  const int other = (block.tokens[0] + 1) % draft->config().vocab_size;
  for (int i = 0; i < 5; ++i) context.push_back(other);
  EXPECT_EQ(model.CatchUpTokens(context), 5);
  model.Propose(context, 0, &block);  // k = 0 drafts nothing and feeds nothing
  EXPECT_EQ(model.CatchUpTokens(context), 5);
  model.Propose(context, 1, &block);
  EXPECT_EQ(model.last_catch_up().tokens, 5);
  EXPECT_EQ(model.CatchUpTokens(context), 0);  // the context without the new draft's block
  // A swapped draft starts over.
  model.SetDraft(draft.get());
  EXPECT_EQ(model.CatchUpTokens(context), static_cast<int64_t>(context.size()));
}

// The scheduler drafts all sequences of a step together: the same tokens and draft
// distributions as each proposer drafting alone, over two blocks (the second after a partly
// rejected first: caches rolled back), with greedy, sampled and early-stopping proposers and
// different block lengths in one batch.
TEST(DraftModelProposer, BatchedDraftingEqualsDraftingAlone) {
  c10::InferenceMode guard;
  auto draft = Load("draft-mix-1m");
  std::unique_ptr<Tokenizer> tok;
  ASSERT_TRUE(Tokenizer::Load(testing::SharedDir() + "/models/draft-mix-1m", &tok).ok());
  std::vector<std::vector<int>> contexts = Prompts(*tok, "python", 2);
  for (auto& p : Prompts(*tok, "legal", 2)) contexts.push_back(p);
  contexts[3].resize(9);
  struct Setup {
    float temperature, min_confidence;
    int k;
  };
  const std::vector<Setup> setups = {{0.0f, 0.0f, 4}, {0.8f, 0.0f, 2}, {0.0f, 0.3f, 6}, {1.0f, 0.0f, 5}};
  std::vector<std::unique_ptr<DraftModelProposer>> batched, alone;
  for (size_t i = 0; i < setups.size(); ++i) {
    SamplingParams sp;
    sp.temperature = setups[i].temperature;
    sp.seed = 100 + i;
    batched.push_back(std::make_unique<DraftModelProposer>(draft.get(), sp, setups[i].min_confidence));
    alone.push_back(std::make_unique<DraftModelProposer>(draft.get(), sp, setups[i].min_confidence));
  }
  for (int block = 0; block < 2; ++block) {
    std::vector<DraftBlock> a(setups.size()), b(setups.size());
    std::vector<DraftModelProposer::BatchItem> items;
    for (size_t i = 0; i < setups.size(); ++i) {
      items.push_back({batched[i].get(), &contexts[i], setups[i].k, &a[i]});
      alone[i]->Propose(contexts[i], setups[i].k, &b[i]);
    }
    DraftModelProposer::ProposeBatch(items);
    for (size_t i = 0; i < setups.size(); ++i) {
      EXPECT_EQ(a[i].tokens, b[i].tokens) << "block " << block << " sequence " << i;
      EXPECT_EQ(a[i].probs, b[i].probs) << "block " << block << " sequence " << i;
      if (!a[i].tokens.empty()) {
        EXPECT_GT(batched[i]->last_propose_seconds(), 0.0);
      }
      EXPECT_EQ(batched[i]->last_catch_up().tokens, alone[i]->last_catch_up().tokens);
      // The next context: the first draft token accepted, then a token the draft did not
      // propose (a rejection); an empty block (an early stop): two tokens decoded plainly.
      if (a[i].tokens.empty()) {
        contexts[i].insert(contexts[i].end(), {5, 6});
        continue;
      }
      contexts[i].push_back(a[i].tokens[0]);
      contexts[i].push_back((a[i].tokens.size() > 1 ? a[i].tokens[1] : a[i].tokens[0]) + 1);
    }
  }
}

// On a GPU (skipped without one): both models' forwards run there and drafting reads the
// draft's logits back to the host. Greedy speculative output equals greedy plain output there,
// and batched sampled drafting (the server's path) draws what the same drafting on the CPU
// draws, from the same q up to float rounding.
TEST(SpeculativeDecoder, RunsOnCuda) {
  if (!testing::CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  c10::InferenceMode guard;
  LoadOptions cuda;
  cuda.device = "cuda";
  cuda.dtype = "float32";
  auto target = Load("target-6m", cuda);
  auto draft = Load("draft-mix-1m", cuda);
  auto cpu_draft = Load("draft-mix-1m");
  std::unique_ptr<Tokenizer> tok;
  ASSERT_TRUE(Tokenizer::Load(testing::SharedDir() + "/models/target-6m", &tok).ok());
  std::vector<std::vector<int>> prompts = Prompts(*tok, "python", 2);
  for (auto& p : Prompts(*tok, "legal", 2)) prompts.push_back(p);

  GenerateOptions g;
  g.max_tokens = 40;
  g.sampling.temperature = 0;
  g.stop_at_eos = false;
  SpeculativeStats total;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<int> plain = GeneratePlain(*target, prompts[i], g).tokens;
    ASSERT_EQ(plain.size(), 40u);
    DraftModelProposer model(draft.get(), g.sampling);
    SpeculativeOptions o;
    o.generate = g;
    o.k = 4;
    SpeculativeStats stats;
    EXPECT_EQ(GenerateSpeculative(*target, &model, prompts[i], o, &stats).tokens, plain)
        << "prompt " << i;
    total.Add(stats);
  }
  EXPECT_GT(total.accepted, 20);
  EXPECT_LT(total.accepted, total.drafted);

  std::vector<std::unique_ptr<DraftModelProposer>> on_gpu, on_cpu;
  std::vector<DraftBlock> a(prompts.size()), b(prompts.size());
  std::vector<DraftModelProposer::BatchItem> items;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SamplingParams sp;
    sp.temperature = 0.8f;
    sp.seed = 7 + i;
    on_gpu.push_back(std::make_unique<DraftModelProposer>(draft.get(), sp));
    on_cpu.push_back(std::make_unique<DraftModelProposer>(cpu_draft.get(), sp));
    items.push_back({on_gpu[i].get(), &prompts[i], 5, &a[i]});
    on_cpu[i]->Propose(prompts[i], 5, &b[i]);
  }
  DraftModelProposer::ProposeBatch(items);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens) << "sequence " << i;
    ASSERT_EQ(a[i].probs.size(), b[i].probs.size()) << "sequence " << i;
    ASSERT_FALSE(a[i].probs.empty()) << "sequence " << i;
    float worst = 0;
    for (size_t j = 0; j < a[i].probs.size(); ++j) {
      worst = std::max(worst, std::fabs(a[i].probs[j] - b[i].probs[j]));
    }
    EXPECT_LT(worst, 1e-5f) << "sequence " << i;
  }
}

TEST(SpeculativeDecoder, AdaptivePolicyLeavesTheDraftIdleWhenItsCatchUpDoesNotPay) {
  c10::InferenceMode guard;
  auto target = testing::RandomModel(testing::TinyConfig(), 5);
  auto draft = testing::RandomModel(testing::TinyConfig(), 6);
  std::vector<int> prompt(40, 3);
  prompt[0] = 1;
  GenerateOptions g;
  g.max_tokens = 30;
  g.stop_at_eos = false;
  g.sampling.temperature = 0;
  // A policy sure that every draft token is accepted, that never probes, and costs that make
  // speculation pay (forwards of any size alike, a nearly free draft) but for the draft's
  // catch-up on the prompt, which costs `per_token` seconds per token. The decoder then feeds
  // the table its real timings: the first choice is the costs' alone.
  auto run = [&](double per_token) {
    SpeculationPolicyOptions po;
    po.prior_alpha = 1.0;
    po.prior_weight = 1e12;
    po.probe_share = 0;  // never probes
    SpeculationPolicy policy(po);
    StepCostTable costs;
    for (int n = 1; n <= po.k_max + 1; ++n) costs.ObserveTarget(n, 0, 1e-3, true);
    costs.ObserveDraft(1, 1e-6);
    costs.ObserveCatchUp(1000000, 1000000 * per_token);
    DraftModelProposer model(draft.get(), g.sampling);
    SpeculativeOptions o;
    o.generate = g;
    o.policy = &policy;
    o.costs = &costs;
    SpeculativeStats s;
    const GenerateResult r = GenerateSpeculative(*target, &model, prompt, o, &s);
    EXPECT_EQ(r.tokens, GeneratePlain(*target, prompt, g).tokens);
    return s;
  };
  // 40 tokens at 1 s each against < 30 ms saved: never worth it, the draft never runs.
  const SpeculativeStats idle = run(1.0);
  EXPECT_EQ(idle.drafted, 0);
  EXPECT_EQ(idle.k_sum, 0);
  // The same policy with a cheap catch-up speculates (the check above can fail).
  const SpeculativeStats busy = run(1e-9);
  EXPECT_GT(busy.drafted, 0);
}

// DecodeStep with trees on offer (TreeAcceptance) drafts a tree where the tree's measured
// acceptance makes it promise more tokens per second than the policy's chain, a chain where
// the chain does, and a probe tree every kProbeInterval-th step the tree lost.
TEST(DecodeStep, TakesATokenTreeWhereItPromisesMoreThanTheChain) {
  c10::InferenceMode guard;
  auto target = Load("target-6m");
  auto draft = Load("draft-mix-1m");
  std::vector<int> prompt(30, 300);
  prompt[0] = 1;
  GenerateOptions g;
  g.max_tokens = 900;  // 40 steps of up to 9 tokens
  g.stop_at_eos = false;
  g.sampling.temperature = 0;
  // Costs of a memory-bound target (a forward of any size alike) and a cheap draft.
  StepCostTable costs;
  for (int n = 1; n <= 16; ++n) {
    costs.ObserveTarget(n, 0, 1e-3, true);
    costs.ObserveDraft(n, 1e-4);
  }
  auto step = [&](double chain_alpha, double tree_alpha, int steps, int* trees) {
    SpeculationPolicyOptions po;
    po.prior_alpha = chain_alpha;
    po.prior_weight = 1e12;
    SpeculationPolicy policy(po);
    TreeAcceptance tree({2, 2, 1, 1});
    tree.alpha = spec::AcceptanceEstimator(tree_alpha, 1e12, 32);
    DraftModelProposer proposer(draft.get(), g.sampling);
    SpeculativeDecoder decoder(target.get(), &proposer, prompt, g);
    DecodeSlot slot;
    slot.decoder = &decoder;
    slot.proposer = slot.draft_proposer = &proposer;
    slot.policy = &policy;
    slot.tree = &tree;
    *trees = 0;
    for (int i = 0; i < steps; ++i) {
      // A fresh copy each step: DecodeStep feeds the table its real timings, which on a busy
      // machine would move the choice this test pins down.
      StepCostTable step_costs = costs;
      DecodeStep(*target, &step_costs, {&slot});
      EXPECT_TRUE(slot.error.empty()) << slot.error;
      EXPECT_EQ(slot.kind == BlockKind::kTree, decoder.draft().is_tree());
      if (slot.kind == BlockKind::kTree) {
        ++*trees;
        EXPECT_EQ(decoder.draft().tokens.size(),
                  static_cast<size_t>(tree.Nodes(slot.k)));
      }
    }
    return tree.lost;
  };
  int trees = 0;
  // alpha 0.3 per chain position against 0.98 per tree depth: every step a tree.
  EXPECT_EQ(step(0.3, 0.98, 3, &trees), 0);
  EXPECT_EQ(trees, 3);
  // The other way round: chains, but for the probe on the 32nd lost step.
  EXPECT_EQ(step(0.9, 0.2, 40, &trees), 40);
  EXPECT_EQ(trees, 1);
}

TEST(TreeAcceptance, CountsNodesByDepth) {
  const TreeAcceptance t({2, 2, 1, 1});
  EXPECT_EQ(t.Nodes(0), 0);
  EXPECT_EQ(t.Nodes(1), 2);
  EXPECT_EQ(t.Nodes(2), 6);
  EXPECT_EQ(t.Nodes(4), 14);
  EXPECT_EQ(t.Nodes(9), 14);  // no deeper than its shape
}

}  // namespace
}  // namespace specloop
