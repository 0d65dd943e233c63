// Sampled exactness of the whole decode step (common/engine/decode_step.h), as the serving
// scheduler runs it: adaptive k (`--k auto`) over batched slots, with the suffix proposer,
// prompt lookup, token trees and a draft model on offer, the plan chosen per sequence and step
// from the policy's, the blocks' and the tree's estimates, which every trial's outcomes move.
// Each case draws 3 tokens (125 cells) from a tiny random target over 5 tokens at temperature
// 0.8 with top-p 0.9, and G-tests their law against the target's at kSignificance = 1e-3. Each
// has broken companions that the same statistic must reject: a chooser that keeps a block only
// where the target's sample of the step (peeked at through the decoder's random stream) agrees
// with its first token, and (suffix case) suffix blocks whose q rows are not the one-hot they
// are. Two more cases take the other drafters' paths: an EAGLE-3 head's chains beside suffix
// blocks (serve --draft HEAD), and generate's --prompt-lookup --draft (a FallbackProposer,
// BlockKind::kProposer). A control drops blocks by a coin of its own through the same seam
// (DecodeSlot::review_block_for_testing) and must keep the law, so that what the peeking
// chooser's rejection shows is the peek. Every case prints the share of steps of each BlockKind
// (the plan chosen) and asserts that each kind it claims to cover was taken.
//
// Determinism: seeds per trial, and a fixed StepCostTable (each step gets a fresh copy, so the
// step's own timings never move the choice): the plans depend on the trials' outcomes only.
#include <gtest/gtest.h>

#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <vector>

#include <c10/core/InferenceMode.h>

#include "common/base/rng.h"
#include "common/engine/decode_step.h"
#include "common/engine/draft_model_proposer.h"
#include "common/engine/feature_draft_proposer.h"
#include "common/engine/generate.h"
#include "common/engine/speculative_decoder.h"
#include "common/model/eagle3_head.h"
#include "common/spec/chain_verify.h"
#include "common/spec/prompt_lookup_proposer.h"
#include "common/spec/rrs.h"
#include "common/spec/suffix_proposer.h"
#include "tests/common/test_models.h"
#include "tests/spec/exact_law.h"
#include "tests/spec/stat_util.h"

namespace specloop {
namespace {

using spec_test::ExactSequenceLaw;
using spec_test::GTest;
using spec_test::kSignificance;

constexpr int kVocab = 5;
constexpr int kLen = 3;  // tokens drawn per trial: 5^3 cells

enum class Variant {
  kProduction,
  // A control of the review seam: drops each block with probability 1/2, by a coin of its own
  // (independent of the step's sample): exact, as a chooser reading past steps only.
  kBlindDrops,
  // Broken: keeps a block only where this step's target sample is one of its first tokens.
  kPeekingChooser,
  // Broken: suffix blocks claim q = 0.5 on their token (their real q is one-hot).
  kSoftSuffixQ,
};
bool IsBroken(Variant v) { return v == Variant::kPeekingChooser || v == Variant::kSoftSuffixQ; }

// What drafts the slot's chains (DecodeSlot::proposer).
enum class Drafter {
  kModel,            // a draft model (serve, generate): chains, and trees where on offer
  kHead,             // an EAGLE-3 head over the target's features (serve --draft HEAD)
  kLookupThenModel,  // generate --prompt-lookup --draft: prompt lookup, else the draft model
};

struct Case {
  const char* name;
  Drafter drafter;
  bool suffix, lookup, tree;  // what is on offer beside the drafter's chains
  Variant variant;
  std::vector<int> prompt;
  int batch;              // sequences per decode step
  // The cost table's draft forward (a target forward: 1 ms), set where the case's plans mix
  // (the printed shares): the policy's chains against model-free blocks and trees.
  double draft_seconds;
  std::vector<BlockKind> claimed;  // kinds the case must take
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// The serving scheduler's per-domain state (serve/scheduler.cc), shared by every trial.
struct Domain {
  SpeculationPolicy policy;
  SuffixIndex index;
  SuffixAcceptance suffix_acceptance, lookup_acceptance;
  TreeAcceptance tree{{2, 2, 1}};
};

// A suffix proposer whose q rows put 0.5 on the drafted token and spread the rest: its tokens
// are the index's deterministic walk, so the q verification needs is one-hot (broken).
class SoftQSuffixProposer : public SuffixProposer {
 public:
  using SuffixProposer::SuffixProposer;
  void Propose(const std::vector<int>& context, int max_k, DraftBlock* out) override {
    SuffixProposer::Propose(context, max_k, out);
    for (size_t i = 0; i < out->tokens.size(); ++i) {
      float* row = out->probs.data() + i * kVocab;
      for (int v = 0; v < kVocab; ++v) row[v] = v == out->tokens[i] ? 0.5f : 0.5f / (kVocab - 1);
    }
  }
};

// The peeking chooser reads the decoder's random stream: the verifiers below (the production
// ones, wrapped) leave the stream's address here, and the slot's on_commit, which runs right
// after its verification, takes it.
Rng* g_verifier_rng = nullptr;
Status PeekableVerifyChain(int k, int vocab, const int* draft, const float* q, const float* p,
                           Rng* rng, spec::ChainOutcome* out) {
  g_verifier_rng = rng;
  return spec::VerifyChain(k, vocab, draft, q, p, rng, out);
}
Status PeekableVerifyTree(int vocab, const std::vector<int>& drafts, const float* q,
                          const float* p, Rng* rng, spec::MultiDraftOutcome* out) {
  g_verifier_rng = rng;
  return spec::VerifyRecursiveRejection(vocab, drafts, q, p, rng, out);
}

// One trial's sequence and its slot, set up as the scheduler (generate: GenerateSpeculative)
// sets up a request's.
struct Sequence {
  Sequence(const LlamaModel* target, const LlamaModel* draft, const Eagle3Head* head,
           Domain* domain, const Case& c, const GenerateOptions& g)
      : lookup(kVocab, false), coin(g.sampling.seed ^ 0xc011ULL), seed(g.sampling.seed) {
    switch (c.drafter) {
      case Drafter::kModel:
        model = std::make_unique<DraftModelProposer>(draft, g.sampling);
        slot.proposer = slot.draft_proposer = model.get();
        break;
      case Drafter::kHead:
        features = std::make_unique<FeatureDraftProposer>(head, g.sampling);
        slot.proposer = slot.feature_proposer = features.get();
        break;
      case Drafter::kLookupThenModel:
        model = std::make_unique<DraftModelProposer>(draft, g.sampling);
        fallback = std::make_unique<FallbackProposer>(&lookup, model.get());
        slot.proposer = fallback.get();
        break;
    }
    decoder = std::make_unique<SpeculativeDecoder>(target, slot.proposer, c.prompt, g);
    slot.decoder = decoder.get();
    slot.policy = &domain->policy;
    if (c.suffix) {
      suffix = c.variant == Variant::kSoftSuffixQ
                   ? std::make_unique<SoftQSuffixProposer>(kVocab, false, &domain->index)
                   : std::make_unique<SuffixProposer>(kVocab, false, &domain->index);
      slot.suffix = suffix.get();
      slot.suffix_acceptance = &domain->suffix_acceptance;
    }
    if (c.lookup) {
      slot.lookup = &lookup;
      slot.lookup_acceptance = &domain->lookup_acceptance;
    }
    if (c.tree) slot.tree = &domain->tree;
    if (c.variant == Variant::kBlindDrops) {
      slot.review_block_for_testing = [this](const DecodeSlot& s) {
        reviewed = s.kind;
        if (coin.Uniform() < 0.5) return true;
        ++dropped;
        return false;
      };
    }
    if (c.variant == Variant::kPeekingChooser) {
      decoder->set_verifier_for_testing(&PeekableVerifyChain);
      decoder->set_multi_draft_verifier_for_testing(&PeekableVerifyTree);
      slot.on_commit = [this](const DecodeSlot& done, const at::Tensor&) {
        if (g_verifier_rng != nullptr) {
          stream = g_verifier_rng;
          g_verifier_rng = nullptr;
        } else if (stream == nullptr) {
          ++plain_steps;  // one uniform drawn (SampleToken)
        }
      };
      slot.review_block_for_testing = [this, target, g](const DecodeSlot& s) {
        reviewed = s.kind;
        return SampleAgrees(*target, g.sampling, s.decoder->draft());
      };
    }
  }

  // The broken chooser: draws this step's plain sample x from a copy of the decoder's stream
  // (before its first verification the stream is the seed's, one uniform per plain step) and
  // keeps the block only where x is one of its first-position tokens.
  bool SampleAgrees(const LlamaModel& target, const SamplingParams& sp, const DraftBlock& block) {
    Rng rng(seed);
    if (stream != nullptr) {
      rng = *stream;
    } else {
      for (int i = 0; i < plain_steps; ++i) rng.Uniform();
    }
    KVCache cache = target.NewCache();
    ForwardInput in;
    in.cache = &cache;
    in.tokens.assign(decoder->tokens().begin(), decoder->tokens().end());
    const at::Tensor logits = target.Forward({in});  // the last row: the pending token's
    std::vector<float> scratch;
    const int x = SampleToken(logits.data_ptr<float>(), kVocab, sp, &rng, &scratch);
    for (size_t i = 0; i < block.tokens.size(); ++i) {
      const bool first = block.is_tree() ? block.parents[i] < 0 : i == 0;
      if (first && block.tokens[i] == x) return true;
    }
    ++dropped;
    dropped_for = x;  // the plain step must now emit x
    return false;
  }

  std::unique_ptr<DraftModelProposer> model;
  std::unique_ptr<FeatureDraftProposer> features;
  std::unique_ptr<FallbackProposer> fallback;
  std::unique_ptr<SuffixProposer> suffix;
  PromptLookupProposer lookup;
  std::unique_ptr<SpeculativeDecoder> decoder;
  DecodeSlot slot;
  Rng coin;                      // the blind review's
  std::vector<BlockKind> kinds;  // the plan of each step
  // A review saw this plan this step (kNone: none seen); a block it dropped counts as its
  // plan's kind.
  BlockKind reviewed = BlockKind::kNone;
  // The peeking chooser's view of the decoder's random stream.
  uint64_t seed;
  Rng* stream = nullptr;
  int plain_steps = 0;
  int dropped = 0;
  int dropped_for = -1;  // this step's block was dropped, its plain step drawing this token
};

// The initial head over the target's layers 1, 2, 3 (it computes the target's last layer),
// every tensor perturbed so that q differs from p (feature_draft_test.cc's NoisyHead).
std::unique_ptr<Eagle3Head> NoisyHead(const LlamaModel& target) {
  Eagle3Head::InitOptions o;
  o.aux_layers = {1, 2, 3};
  o.draft_vocab_size = kVocab;
  std::unique_ptr<Eagle3Head> head, noisy;
  Status s = Eagle3Head::InitFromTarget(target, o, &head);
  if (!s.ok()) throw std::runtime_error(s.ToString());
  at::manual_seed(202);
  TensorMap w;
  for (const auto& [name, t] : head->NamedWeights()) {
    w[name] = t.is_floating_point() ? t + at::randn(t.sizes()) * 0.3 : t;
  }
  s = Eagle3Head::FromTensors(head->config(), w, target, LoadOptions(), &noisy);
  if (!s.ok()) throw std::runtime_error(s.ToString());
  return noisy;
}

class DecodeStepExactness : public ::testing::TestWithParam<Case> {};

TEST_P(DecodeStepExactness, SequenceLawEqualsTargetLaw) {
  c10::InferenceMode guard;
  const Case& c = GetParam();
  // A head reads the inputs of target layers 1, 2, 3: its target has 4.
  ModelConfig cfg = c.drafter == Drafter::kHead ? testing::TinyFourLayerConfig()
                                                : testing::TinyConfig();
  cfg.vocab_size = kVocab;
  auto target = testing::RandomModel(cfg, 101);
  auto draft = testing::RandomModel(cfg, 202);
  const auto head = c.drafter == Drafter::kHead ? NoisyHead(*target) : nullptr;
  SamplingParams sp;
  sp.temperature = 0.8f;
  sp.top_p = 0.9f;
  // A memory-bound target (a forward of any size alike) and the case's draft forward.
  StepCostTable costs;
  for (int n = 1; n <= 128; n += n < 16 ? 1 : 16) costs.ObserveTarget(n, 0, 1e-3, true);
  for (int n = 1; n <= 16; ++n) costs.ObserveDraft(n, c.draft_seconds);

  Domain domain;
  const int trials = 16000;
  std::vector<int64_t> cells(125, 0);
  std::map<BlockKind, int64_t> kinds;
  std::map<std::pair<BlockKind, BlockKind>, int64_t> switches;  // consecutive steps' kinds
  int64_t steps = 0, switched = 0, dropped = 0, peeks = 0, peek_misses = 0;
  SpeculativeStats total;
  for (int t0 = 0; t0 < trials; t0 += c.batch) {
    std::vector<std::unique_ptr<Sequence>> seqs;
    for (int t = t0; t < t0 + c.batch; ++t) {
      GenerateOptions g;
      g.max_tokens = kLen;
      g.stop_at_eos = false;
      g.sampling = sp;
      g.sampling.seed = 1000 + t;
      seqs.push_back(
          std::make_unique<Sequence>(target.get(), draft.get(), head.get(), &domain, c, g));
    }
    for (;;) {
      std::vector<DecodeSlot*> slots;
      std::vector<Sequence*> live;
      for (auto& s : seqs) {
        if (s->decoder->finished()) continue;
        slots.push_back(&s->slot);
        live.push_back(s.get());
      }
      if (slots.empty()) break;
      for (Sequence* s : live) {
        s->reviewed = BlockKind::kNone;
        s->dropped_for = -1;
      }
      StepCostTable step_costs = costs;
      DecodeStep(*target, &step_costs, slots);
      for (Sequence* s : live) {
        ASSERT_TRUE(s->slot.error.empty()) << s->slot.error;
        const BlockKind plan = s->reviewed != BlockKind::kNone ? s->reviewed : s->slot.kind;
        s->kinds.push_back(plan);
        ++kinds[plan];
        // The peek saw the sample: where it dropped a block, the plain step drew what it saw.
        if (s->dropped_for >= 0) {
          ++peeks;
          peek_misses += s->slot.emitted.empty() || s->slot.emitted[0] != s->dropped_for;
        }
        ++steps;
        // The scheduler indexes a finished request's prompt and output for later ones.
        if (s->decoder->finished() && c.suffix) domain.index.Add(s->decoder->tokens());
      }
    }
    for (auto& s : seqs) {
      const std::vector<int> out = s->decoder->generated();
      ASSERT_EQ(out.size(), static_cast<size_t>(kLen));
      cells[out[0] * 25 + out[1] * 5 + out[2]]++;
      total.Add(s->decoder->stats());
      dropped += s->dropped;
      const std::set<BlockKind> distinct(s->kinds.begin(), s->kinds.end());
      switched += distinct.size() > 1 ? 1 : 0;
      for (size_t i = 1; i < s->kinds.size(); ++i) {
        if (s->kinds[i] != s->kinds[i - 1]) ++switches[{s->kinds[i - 1], s->kinds[i]}];
      }
    }
  }
  const auto result = GTest(cells, ExactSequenceLaw(*target, c.prompt, kLen, sp));
  std::ostringstream shares;
  for (const auto& [kind, n] : kinds) {
    shares << " " << BlockKindName(kind) << " " << static_cast<double>(n) / steps;
  }
  std::cout << c.name << ": " << result.ToString() << "; steps " << steps << ", shares of plans"
            << shares.str() << "; accepted " << total.accepted << " of " << total.drafted
            << "; sequences switching kinds " << switched << " of " << trials;
  if (dropped > 0) std::cout << "; blocks dropped by the review " << dropped;
  std::map<BlockKind, int64_t> into;  // switches into each kind within a sequence
  for (const auto& [pair, n] : switches) into[pair.second] += n;
  std::cout << "; switches into";
  for (const auto& [kind, n] : into) std::cout << " " << BlockKindName(kind) << " " << n;
  std::cout << "\n";
  if (IsBroken(c.variant)) {
    EXPECT_TRUE(result.impossible || result.p_value < kSignificance) << result.ToString();
  } else {
    EXPECT_GE(result.p_value, kSignificance) << result.ToString();
  }
  // The case planned every path it claims (at least 0.5% of its steps each; a companion's
  // dropped blocks count as planned), and rejections happened (the residual paths ran).
  for (BlockKind kind : c.claimed) {
    EXPECT_GE(kinds[kind], steps / 200) << BlockKindName(kind);
  }
  if (c.variant == Variant::kBlindDrops) EXPECT_GT(dropped, steps / 10);
  if (c.variant == Variant::kPeekingChooser) {
    EXPECT_GT(dropped, 0);
    EXPECT_EQ(peeks, dropped);
    EXPECT_EQ(peek_misses, 0) << "of " << peeks;
  }
  EXPECT_GT(total.accepted, 0);
  EXPECT_LT(total.accepted, total.drafted);
  if (c.claimed.size() > 2) {
    // Sequences that switched kinds between their steps: every claimed kind after another.
    for (BlockKind kind : c.claimed) {
      EXPECT_GT(into[kind], 0) << "no sequence switched into " << BlockKindName(kind);
    }
    EXPECT_GE(switched, trials / 20);
  }
}

const std::vector<int> kRecurring = {1, 3, 0, 4};        // every trial's prompt: recurs
const std::vector<int> kRepetitive = {1, 3, 0, 4, 1, 3, 0};  // n-grams for prompt lookup

Case Suffix(const char* name, Variant variant) {
  // (Soft suffix rows make suffix blocks look better: draft chains become rare.)
  return {name, Drafter::kModel, true, false, false, variant, kRecurring, 8, 2e-4,
          variant == Variant::kSoftSuffixQ
              ? std::vector<BlockKind>{BlockKind::kSuffix}
              : std::vector<BlockKind>{BlockKind::kSuffix, BlockKind::kDraftModel}};
}
Case Lookup(const char* name, Variant variant) {
  return {name, Drafter::kModel, false, true, false, variant, kRepetitive, 8, 4.5e-4,
          {BlockKind::kLookup, BlockKind::kDraftModel}};
}
Case Tree(const char* name, Variant variant) {
  return {name, Drafter::kModel, false, false, true, variant, kRecurring, 4, 5e-5,
          {BlockKind::kTree, BlockKind::kDraftModel}};
}
Case Everything(const char* name, Variant variant) {
  return {name, Drafter::kModel, true, true, true, variant, kRepetitive, 4, 1.3e-4,
          {BlockKind::kSuffix, BlockKind::kLookup, BlockKind::kTree, BlockKind::kDraftModel}};
}

Case HeadWithSuffix(const char* name, Variant variant) {
  return {name, Drafter::kHead, true, false, false, variant, kRecurring, 8, 1e-5,
          {BlockKind::kFeatureDraft, BlockKind::kSuffix}};
}
Case GenerateLookupThenDraft(const char* name, Variant variant) {
  return {name, Drafter::kLookupThenModel, false, false, false, variant, kRepetitive, 8, 2e-4,
          {BlockKind::kProposer}};
}

INSTANTIATE_TEST_SUITE_P(
    Cases, DecodeStepExactness,
    ::testing::Values(Suffix("AutoKWithSuffix", Variant::kProduction),
                      Suffix("AutoKWithSuffixPeekingChooserIsCaught", Variant::kPeekingChooser),
                      Suffix("AutoKWithSuffixSoftQIsCaught", Variant::kSoftSuffixQ),
                      Lookup("PromptLookupWithDraft", Variant::kProduction),
                      Lookup("PromptLookupPeekingChooserIsCaught", Variant::kPeekingChooser),
                      Tree("Tree", Variant::kProduction),
                      Tree("TreePeekingChooserIsCaught", Variant::kPeekingChooser),
                      Everything("SwitchingKinds", Variant::kProduction),
                      Everything("SwitchingKindsBlindDropsKeepTheLaw", Variant::kBlindDrops),
                      Everything("SwitchingKindsPeekingChooserIsCaught",
                                 Variant::kPeekingChooser),
                      HeadWithSuffix("HeadWithSuffix", Variant::kProduction),
                      HeadWithSuffix("HeadWithSuffixPeekingChooserIsCaught",
                                     Variant::kPeekingChooser),
                      GenerateLookupThenDraft("GenerateLookupThenDraft", Variant::kProduction),
                      GenerateLookupThenDraft("GenerateLookupThenDraftPeekingChooserIsCaught",
                                              Variant::kPeekingChooser)),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace specloop
