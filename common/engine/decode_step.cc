#include "common/engine/decode_step.h"

#include <algorithm>
#include <chrono>
#include <exception>

#include <c10/core/InferenceMode.h>

#include "common/spec/acceptance.h"

namespace specloop {

namespace {
using Clock = std::chrono::steady_clock;
double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
void FailSlot(DecodeSlot* slot, const char* what, const std::exception& e) {
  slot->error = std::string(what) + ": " + e.what();
}

// Puts the suffix proposer's block in the slot's decoder when it promises more tokens per
// second than the policy's choice of slot->k (SuffixAcceptance); returns whether it did.
bool TakeSuffixBlock(const StepCostTable& costs, int batch, int64_t context, DecodeSlot* slot) {
  SpeculativeDecoder& decoder = *slot->decoder;
  const int room = decoder.BeginPropose(slot->policy->options().k_max);
  DraftBlock* block = decoder.mutable_draft();
  slot->suffix->Propose(decoder.tokens(), room, block);
  const int m = slot->suffix->match_length();
  const int n = std::min<int>(block->tokens.size(), m);
  if (n > 0) {
    const int bucket = SuffixAcceptance::Bucket(m);
    const double alpha = slot->suffix_acceptance->by_match[bucket].alpha();
    double index_estimate = 0;
    for (int i = 0; i < n; ++i) index_estimate += slot->suffix->token_probs()[i];
    const double expected =
        std::min(index_estimate, spec::ExpectedTokensPerStep(alpha, n) - 1);
    const double seconds = costs.TargetSeconds(batch * (n + 1), static_cast<double>(context));
    const double rate = seconds > 0 ? (1 + expected) / seconds : 0.0;
    SuffixAcceptance& acceptance = *slot->suffix_acceptance;
    const bool wins = rate > slot->policy->ExpectedRate(costs, slot->k, batch, context);
    if (wins || ++acceptance.lost[bucket] % SuffixAcceptance::kProbeInterval == 0) {
      const int keep = wins ? n : 1;  // a probe verifies one token
      const size_t row = block->probs.size() / block->tokens.size();  // 0 under greedy
      block->tokens.resize(keep);
      block->probs.resize(row * keep);
      decoder.EndPropose();
      slot->k = keep;
      slot->used_suffix = true;
      slot->suffix_bucket = bucket;
      return true;
    }
  }
  block->Clear();
  return false;
}

}  // namespace

void DecodeStep(const LlamaModel& target, StepCostTable* costs,
                const std::vector<DecodeSlot*>& slots, DecodeStepTimes* times,
                PrefillChunks* prefill) {
  c10::InferenceMode guard;
  const int batch = static_cast<int>(slots.size());
  // 1-2. Each sequence's k, then its drafts: the model-drafting ones in one batch.
  std::vector<DraftModelProposer::BatchItem> items;
  for (DecodeSlot* slot : slots) {
    slot->k = 0;
    slot->used_suffix = false;
    slot->emitted.clear();
    slot->error.clear();
    slot->draft_seconds = 0;
    try {
      SpeculativeDecoder& decoder = *slot->decoder;
      const std::vector<int>& tokens = decoder.tokens();
      if (slot->policy != nullptr) {
        const int64_t context = static_cast<int64_t>(tokens.size()) - 1;
        slot->k = slot->policy->ChooseK(*costs, batch, context,
                                        slot->proposer->CatchUpTokens(tokens), decoder.remaining());
        if (slot->suffix != nullptr && slot->suffix_acceptance != nullptr &&
            TakeSuffixBlock(*costs, batch, context, slot)) {
          continue;
        }
      } else {
        slot->k = slot->fixed_k;
      }
      if (slot->draft_proposer != nullptr) {
        const int k = decoder.BeginPropose(slot->k);
        items.push_back({slot->draft_proposer, &decoder.tokens(), k, decoder.mutable_draft()});
      } else {
        decoder.Propose(slot->k);
      }
    } catch (const std::exception& e) {
      FailSlot(slot, "draft failed", e);
    }
  }
  try {
    DraftModelProposer::ProposeBatch(items);
  } catch (const std::exception& e) {  // the batch's draft forwards touched them all
    for (DecodeSlot* slot : slots) {
      if (slot->draft_proposer != nullptr && !slot->used_suffix && slot->error.empty()) {
        FailSlot(slot, "draft failed", e);
      }
    }
  }

  // 3. One target forward over every sequence still in the step.
  std::vector<DecodeSlot*> live;
  std::vector<ForwardInput> inputs;
  std::vector<size_t> offsets;
  size_t rows = 0;
  double attended = 0;  // cached tokens the rows attend to, summed over the rows
  for (DecodeSlot* slot : slots) {
    if (!slot->error.empty()) continue;
    SpeculativeDecoder& decoder = *slot->decoder;
    if (slot->draft_proposer != nullptr && !slot->used_suffix) decoder.EndPropose();
    slot->draft_seconds = slot->used_suffix ? 0.0 : slot->proposer->last_propose_seconds();
    slot->start_pos = static_cast<uint32_t>(decoder.tokens().size());
    ForwardInput in = decoder.TargetInput();
    const size_t n = in.tokens.size();
    offsets.push_back(rows);
    rows += n;
    // Each row attends to the cache and to the rows before it.
    attended += n * static_cast<double>(slot->start_pos - 1) + n * (n - 1) / 2.0;
    inputs.push_back(std::move(in));
    live.push_back(slot);
  }
  const size_t decode_rows = rows;
  if (prefill != nullptr) {
    prefill->error.clear();
    for (ForwardInput& chunk : prefill->inputs) {
      const double n = chunk.tokens.size();
      rows += chunk.tokens.size();
      attended += n * static_cast<double>(chunk.cache->length()) + n * (n - 1) / 2.0;
      inputs.push_back(std::move(chunk));
    }
    prefill->inputs.clear();
  }
  if (inputs.empty()) return;
  at::Tensor logits;
  const auto t0 = Clock::now();
  try {
    logits = target.Forward(inputs).to(at::kCPU).contiguous();
  } catch (const std::exception& e) {
    for (DecodeSlot* slot : live) FailSlot(slot, "target forward failed", e);
    if (prefill != nullptr && inputs.size() > live.size()) {
      prefill->error = std::string("target forward failed: ") + e.what();
    }
    return;
  }
  const double forward_s = SecondsSince(t0);
  if (times != nullptr) {
    *times = {forward_s, static_cast<int>(live.size()), static_cast<int>(decode_rows),
              static_cast<int>(inputs.size() - live.size())};
  }

  // 4. Verification, each sequence's on_commit; 5. what the step measured.
  double verify_s = 0;  // the verifiers' (and on_commit's) work: part of what a row costs
  double draft_s = 0;   // the step's drafting, catch-ups apart
  int draft_sequences = 0, draft_forwards = 0;
  bool draft_ran = false;
  for (size_t i = 0; i < live.size(); ++i) {
    DecodeSlot* slot = live[i];
    const size_t n = (i + 1 < live.size() ? offsets[i + 1] : decode_rows) - offsets[i];
    try {
      const at::Tensor mine = logits.narrow(0, offsets[i], n);
      const auto c0 = Clock::now();
      slot->emitted = slot->decoder->Commit(mine);
      if (slot->on_commit) slot->on_commit(*slot, mine);
      verify_s += SecondsSince(c0);
    } catch (const std::exception& e) {
      FailSlot(slot, "verification failed", e);
      continue;
    }
    const int drafted = static_cast<int>(slot->decoder->draft().tokens.size());
    if (slot->used_suffix) {
      slot->suffix_acceptance->by_match[slot->suffix_bucket].Observe(
          drafted, slot->decoder->last_accepted());
      continue;  // no draft forward, no catch-up: nothing of the draft's to measure
    }
    if (slot->policy != nullptr) slot->policy->ObserveStep(drafted, slot->decoder->last_accepted());
    const Proposer::CatchUp catch_up = slot->proposer->last_catch_up();
    if (costs != nullptr) costs->ObserveCatchUp(catch_up.tokens, catch_up.seconds);
    draft_ran = draft_ran || catch_up.tokens > 0 || slot->draft_seconds > 0;
    if (drafted > 0 && slot->draft_seconds > 0) {
      draft_s += slot->draft_seconds;
      ++draft_sequences;
      draft_forwards = std::max(draft_forwards, drafted);
    }
  }
  if (costs == nullptr) return;
  costs->ObserveTarget(static_cast<int>(rows), attended, forward_s + verify_s, draft_ran);
  if (draft_forwards > 0) costs->ObserveDraft(draft_sequences, draft_s / draft_forwards);
}

}  // namespace specloop
