#include "serve/prefill_budget.h"

#include <gtest/gtest.h>

namespace specloop {
namespace {

// A cost curve of a memory-bound forward: 4 ms for the weights' read, 0.25 ms a row.
StepCostTable Costs() {
  StepCostTable t;
  for (int rows : {1, 2, 4, 6, 8, 10, 12, 14, 16, 24, 36, 54, 81, 121, 181, 271, 406, 609}) {
    t.ObserveTarget(rows, 0, 0.004 + 0.00025 * rows, true);
  }
  return t;
}

TEST(PrefillBudget, AloneAStepCarriesTheMostTokens) {
  const StepCostTable t = Costs();
  EXPECT_EQ(PrefillBudget(t, 0, 0, 3, 0, 0), kMaxPrefillChunk);
}

// A lone prompt beside 8 decoding rows: half of the forward it joins (8 + 1 rows: 6.25 ms),
// 3.125 ms at 0.25 ms a token: 12 tokens.
TEST(PrefillBudget, ALonePromptAddsHalfOfTheForwardItJoins) {
  const StepCostTable t = Costs();
  const int64_t n = PrefillBudget(t, 8, 8, 1, 0, 0);
  EXPECT_EQ(n, 12);
  EXPECT_LE(PrefillChunkSeconds(t, 8, n, 0), 0.5 * t.TargetSeconds(9, 0) + 1e-12);
  EXPECT_GT(PrefillChunkSeconds(t, 8, n + 1, 0), 0.5 * t.TargetSeconds(9, 0));
}

// 7 prefilling sequences beside 6 decoding ones: each gets what a decoding one gets, 7 / 6 of
// the forward they join (6 + 7 rows: 7.25 ms; 8.46 ms, 33 tokens). Priced at the 6 decoding
// rows alone (5.5 ms; 6.42 ms, 25 tokens) the chunk shrank with the decoding batch, and a
// queue of prompts fed on it: fewer decoding sequences, a cheaper step, a smaller chunk.
TEST(PrefillBudget, WaitingPromptsArePricedAtTheForwardTheyWillJoin) {
  const StepCostTable t = Costs();
  EXPECT_EQ(PrefillBudget(t, 6, 6, 7, 0, 0), 33);
  // Fewer decoding sequences beside the same queue: no smaller chunk.
  EXPECT_GE(PrefillBudget(t, 4, 4, 9, 0, 0), PrefillBudget(t, 6, 6, 7, 0, 0));
}

TEST(PrefillBudget, APromptAlwaysAdvances) {
  StepCostTable t;
  t.ObserveTarget(1, 0, 0.001, true);
  t.ObserveTarget(16, 0, 0.1, true);  // rows very dear: not even the least chunk fits
  EXPECT_EQ(PrefillBudget(t, 1, 1, 1, 0, 0), kMinPrefillChunk);
}

}  // namespace
}  // namespace specloop
