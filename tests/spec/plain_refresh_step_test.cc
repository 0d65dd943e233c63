// DecodeStep's plain refresh over real slots (SpeculationPolicyOptions::plain_refresh_steps):
// a step whose batch's plain cost is due to be measured again decodes plainly throughout, no
// model-free block either: a suffix block riding in it would leave the plain cost unmeasured,
// and a stale plain cost priced against suffix blocks and draft chains keeps choosing them.
#include <gtest/gtest.h>

#include <c10/core/InferenceMode.h>

#include <memory>
#include <vector>

#include "common/engine/decode_step.h"
#include "common/engine/draft_model_proposer.h"
#include "common/engine/speculative_decoder.h"
#include "common/spec/speculation_policy.h"
#include "common/spec/step_cost_table.h"
#include "common/spec/suffix_proposer.h"
#include "tests/common/test_models.h"

namespace specloop {
namespace {

TEST(DecodeStepPlainRefresh, ADueStepTakesNoBlockAndMeasuresThePlainStep) {
  c10::InferenceMode guard;
  const ModelConfig cfg = testing::TinyConfig();
  auto target = testing::RandomModel(cfg, 101);
  auto draft = testing::RandomModel(cfg, 202);
  // The prompt repeats a phrase: the domain's index (which holds it) continues its tail.
  const std::vector<int> phrase = {5, 17, 42, 8, 63, 21, 9, 30, 11, 77, 2, 50};
  std::vector<int> prompt;
  for (int r = 0; r < 3; ++r) prompt.insert(prompt.end(), phrase.begin(), phrase.end());
  prompt.insert(prompt.end(), phrase.begin(), phrase.begin() + 6);
  SuffixIndex index;
  index.Add(prompt);
  SpeculationPolicy policy;
  SuffixAcceptance acceptance;
  for (auto& bucket : acceptance.by_match) {
    for (int i = 0; i < 64; ++i) bucket.Observe(4, 4);  // suffix blocks always accepted so far
  }

  const int batch = 2;
  std::vector<std::unique_ptr<DraftModelProposer>> proposers;
  std::vector<std::unique_ptr<SuffixProposer>> suffixes;
  std::vector<std::unique_ptr<SpeculativeDecoder>> decoders;
  std::vector<DecodeSlot> slot_store(batch);
  std::vector<DecodeSlot*> slots;
  for (int b = 0; b < batch; ++b) {
    GenerateOptions g;
    g.max_tokens = 64;
    g.stop_at_eos = false;
    g.sampling.temperature = 0;  // greedy
    proposers.push_back(std::make_unique<DraftModelProposer>(draft.get(), g.sampling));
    suffixes.push_back(std::make_unique<SuffixProposer>(cfg.vocab_size, true, &index));
    decoders.push_back(std::make_unique<SpeculativeDecoder>(target.get(), proposers.back().get(),
                                                            prompt, g));
    DecodeSlot& slot = slot_store[b];
    slot.decoder = decoders.back().get();
    slot.proposer = slot.draft_proposer = proposers.back().get();
    slot.policy = &policy;
    slot.suffix = suffixes.back().get();
    slot.suffix_acceptance = &acceptance;
    slots.push_back(&slot);
  }

  // A table where every forward is far cheaper than the tiny models' real ones (a memory-bound
  // target: a forward of any size alike, drafts nearly free), whose two-row forward was last
  // seen long ago. Once the refresh measures it, plain decoding looks dearer still.
  StepCostTable costs;
  for (int n = 1; n <= 16; ++n) costs.ObserveTarget(n, 0, 1e-7, true);
  for (int n = 1; n <= 16; ++n) costs.ObserveDraft(n, 1e-9);
  const int64_t every = policy.options().plain_refresh_steps;
  for (int64_t i = 0; i <= every; ++i) costs.ObserveTarget(12, 0, 1e-7, true);
  ASSERT_TRUE(costs.PlainRefreshDue(batch, 0, every));

  DecodeStep(*target, &costs, slots);
  for (const DecodeSlot* slot : slots) {
    ASSERT_TRUE(slot->error.empty()) << slot->error;
    EXPECT_EQ(slot->k, 0);
    EXPECT_EQ(slot->kind, BlockKind::kNone);
    EXPECT_EQ(slot->decoder->draft().tokens.size(), 0u);
  }
  EXPECT_EQ(costs.TargetAge(batch), 0);  // the plain step was measured
  EXPECT_FALSE(costs.PlainRefreshDue(batch, 0, every));

  // The steps after it take blocks again: the refresh, not the setup, kept them out.
  int blocks = 0;
  for (int s = 0; s < 4; ++s) {
    DecodeStep(*target, &costs, slots);
    for (const DecodeSlot* slot : slots) {
      ASSERT_TRUE(slot->error.empty()) << slot->error;
      blocks += slot->kind != BlockKind::kNone;
    }
  }
  EXPECT_GT(blocks, 0);
}

}  // namespace
}  // namespace specloop
