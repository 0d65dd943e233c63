// DecodeStep: one step of speculative decoding over a batch of sequences, the one decode loop
// of the server's scheduler, `specloop generate` (SpeculativeGeneration, a batch of one) and
// spec_bench. For every sequence it
//   1. picks k: fixed, or its SpeculationPolicy's choice for this batch size, context,
//      catch-up and remaining tokens, priced by the StepCostTable;
//   2. drafts: the sequences that draft with a model together (DraftModelProposer::ProposeBatch:
//      one batched draft forward per drafted position), the others through their proposer;
//   3. runs ONE target forward over every sequence's pending token and drafts;
//   4. verifies each sequence's rows (SpeculativeDecoder::Commit, exact) and calls its
//      `on_commit` (the server's sample logger), inside the step's timing;
//   5. feeds the measured costs to the table (the forward with its verification by rows and
//      attended context, the batched draft forwards, the catch-ups) and each outcome to its
//      sequence's policy.
// An exception while drafting, in the target forward or while verifying fails only the
// sequences it touched (`error` set; the batch's draft or target forward touches them all);
// the rest go on. Callers handle the outcome: metrics, text, finishing.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/engine/draft_model_proposer.h"
#include "common/engine/speculative_decoder.h"
#include "common/spec/speculation_policy.h"
#include "common/spec/step_cost_table.h"

namespace specloop {

struct DecodeSlot {
  // Set by the caller (not owned).
  SpeculativeDecoder* decoder = nullptr;
  Proposer* proposer = nullptr;                  // the decoder's proposer
  DraftModelProposer* draft_proposer = nullptr;  // = proposer when it drafts with a model
  SpeculationPolicy* policy = nullptr;           // null: fixed_k
  int fixed_k = 0;
  int64_t max_tokens = 0;  // the request's, for the tokens remaining
  size_t prompt_len = 0;
  // Called after verification with this step's target rows (the last drafted + 1 are the
  // verified ones); its time counts as the rows' cost. May throw (the slot fails).
  std::function<void(const DecodeSlot&, const at::Tensor& rows)> on_commit;

  // This step's outcome.
  int k = 0;                      // asked
  std::vector<int> draft_tokens;  // proposed (a tree's nodes)
  uint32_t start_pos = 0;         // the pending token's position
  double draft_seconds = 0;       // proposer's last_propose_seconds()
  std::vector<int> emitted;       // tokens out (after EOS / max_tokens cuts)
  std::string error;              // non-empty: failed in this step ("draft failed: ...")
};

struct DecodeStepTimes {
  double forward_seconds = 0;  // the batched target forward
  int sequences = 0;           // in it
};

// Resets every slot's outcome, then steps them. REQUIRES: every slot's decoder is not
// finished; a slot with a policy needs `costs` (null: nothing is measured).
void DecodeStep(const LlamaModel& target, StepCostTable* costs,
                const std::vector<DecodeSlot*>& slots, DecodeStepTimes* times = nullptr);

}  // namespace specloop
