#include "common/engine/decode_step.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <stdexcept>

#include <c10/core/InferenceMode.h>

#include "common/base/clock.h"
#include "common/spec/acceptance.h"

namespace specloop {

namespace {
using Clock = std::chrono::steady_clock;
void FailSlot(DecodeSlot* slot, const char* what, const std::exception& e) {
  slot->error = std::string(what) + ": " + e.what();
}

// A model-free block on offer: the suffix proposer's (the domain's earlier requests) or
// prompt lookup's (the sequence's own context).
struct Offer {
  DraftBlock block;
  SuffixAcceptance* acceptance = nullptr;
  int bucket = 0;
  double rate = 0;  // expected tokens per second of its step
  bool lookup = false;
};

// Prices `offer`'s first n tokens, from a match of m context tokens: the acceptance estimate of
// its bucket, capped by `index_estimate` (the expected accepted tokens by the index's own
// statistics; prompt lookup has none), over the step's seconds with n + 1 rows a sequence.
void Price(const StepCostTable& costs, int batch, int64_t context, int chunk_rows, int m, int n,
           double index_estimate, Offer* offer) {
  offer->bucket = SuffixAcceptance::Bucket(m);
  const double alpha = offer->acceptance->by_match[offer->bucket].alpha();
  const double expected = std::min(index_estimate, spec::ExpectedTokensPerStep(alpha, n) - 1);
  StepCostTable::Step step;  // the batch's rows and the prompt chunks riding; no draft forward
  step.rows = batch * (n + 1);
  step.attended = step.rows * static_cast<double>(context);
  step.chunk_rows = chunk_rows;
  const double seconds = costs.StepSeconds(step);
  offer->rate = seconds > 0 ? (1 + expected) / seconds : 0.0;
  const size_t row = offer->block.probs.size() / offer->block.tokens.size();  // 0 under greedy
  offer->block.tokens.resize(n);
  offer->block.probs.resize(row * n);
}

// Puts the best model-free block in the slot's decoder when it promises more tokens per second
// than the policy's choice of slot->k (SuffixAcceptance); returns whether it did.
bool TakeModelFreeBlock(const StepCostTable& costs, int batch, int64_t context, int chunk_rows,
                        DecodeSlot* slot) {
  SpeculativeDecoder& decoder = *slot->decoder;
  const int room = decoder.BeginPropose(slot->policy->options().k_max);
  Offer offers[2];
  int count = 0;
  if (slot->suffix != nullptr && slot->suffix_acceptance != nullptr) {
    Offer& o = offers[count];
    slot->suffix->Propose(decoder.tokens(), room, &o.block);
    const int m = slot->suffix->match_length();
    const int n = std::min<int>(o.block.tokens.size(), m);  // ArcticInference's cap
    if (n > 0) {
      o.acceptance = slot->suffix_acceptance;
      double index_estimate = 0;
      for (int i = 0; i < n; ++i) index_estimate += slot->suffix->token_probs()[i];
      Price(costs, batch, context, chunk_rows, m, n, index_estimate, &o);
      ++count;
    }
  }
  if (slot->lookup != nullptr && slot->lookup_acceptance != nullptr) {
    Offer& o = offers[count];
    slot->lookup->Propose(decoder.tokens(), room, &o.block);
    const int n = static_cast<int>(o.block.tokens.size());
    if (n > 0) {
      o.acceptance = slot->lookup_acceptance;
      o.lookup = true;
      Price(costs, batch, context, chunk_rows, slot->lookup->match_length(), n, n, &o);
      ++count;
    }
  }
  const double policy_rate =
      slot->policy->ExpectedRate(costs, slot->k, batch, context, chunk_rows);
  Offer* take = nullptr;
  for (int i = 0; i < count; ++i) {
    if (offers[i].rate > policy_rate && (take == nullptr || offers[i].rate > take->rate)) {
      take = &offers[i];
    }
  }
  if (take == nullptr) {
    // Each losing offer counts towards its bucket's probe: a one-token block now and then.
    for (int i = 0; i < count && take == nullptr; ++i) {
      Offer& o = offers[i];
      if (++o.acceptance->lost[o.bucket] % SuffixAcceptance::kProbeInterval == 0) {
        const size_t row = o.block.probs.size() / o.block.tokens.size();
        o.block.tokens.resize(1);
        o.block.probs.resize(row);
        take = &o;
      }
    }
  }
  if (take == nullptr) return false;
  *decoder.mutable_draft() = std::move(take->block);
  decoder.EndPropose();
  slot->k = static_cast<int>(decoder.draft().tokens.size());
  slot->kind = take->lookup ? BlockKind::kLookup : BlockKind::kSuffix;
  slot->used_acceptance = take->acceptance;
  slot->suffix_bucket = take->bucket;
  return true;
}

// Decides between the policy's chain of slot->k and a token tree (TreeAcceptance; only where
// the chain pays, k > 0) and sets the draft proposer's branching accordingly; a tree step's
// slot->k is its depth.
void ChooseTree(const StepCostTable& costs, int batch, int64_t context, int chunk_rows,
                DecodeSlot* slot) {
  TreeAcceptance& tree = *slot->tree;
  const int depth_max = slot->k > 0 ? std::min<int>(slot->policy->options().k_max,
                                                    tree.branching.size())
                                    : 0;
  int best = 0;
  double best_rate = 0;
  for (int d = 1; d <= depth_max; ++d) {
    const double rate = tree.Rate(costs, d, batch, context);
    if (rate > best_rate) {
      best = d;
      best_rate = rate;
    }
  }
  bool take = false;
  if (best > 0) {
    // The tree must beat the chain and plain decoding (the chain's k may be the policy's
    // probe); a lost step counts towards the tree's probe.
    const double chain_rate =
        std::max(slot->policy->ExpectedRate(costs, slot->k, batch, context, chunk_rows),
                 slot->policy->ExpectedRate(costs, 0, batch, context, chunk_rows));
    take = best_rate > chain_rate || ++tree.lost % TreeAcceptance::kProbeInterval == 0;
  }
  if (take) {
    slot->kind = BlockKind::kTree;
    slot->k = best;
  }
  DraftModelProposer& proposer = *slot->draft_proposer;
  if (take == proposer.tree_branching().empty()) {  // switching between chains and trees
    proposer.set_tree_branching(take ? tree.branching : std::vector<int>());
  }
}

}  // namespace

const char* BlockKindName(BlockKind kind) {
  switch (kind) {
    case BlockKind::kNone: return "none";
    case BlockKind::kDraftModel: return "draft";
    case BlockKind::kFeatureDraft: return "feature";
    case BlockKind::kTree: return "tree";
    case BlockKind::kSuffix: return "suffix";
    case BlockKind::kLookup: return "lookup";
    case BlockKind::kProposer: return "proposer";
  }
  return "?";
}

int TreeAcceptance::Nodes(int depth) const {
  int nodes = 0, level = 1;
  for (int d = 0; d < depth && d < static_cast<int>(branching.size()); ++d) {
    level *= branching[d];
    nodes += level;
  }
  return nodes;
}

double TreeAcceptance::Rate(const StepCostTable& costs, int depth, int batch,
                            int64_t context) const {
  batch = std::max(1, batch);
  double draft = costs.DraftSeconds(1);
  for (int d = 1; d < depth; ++d) draft += costs.DraftSeconds(Nodes(d));
  const double seconds = batch * draft + costs.TargetSeconds(batch * (Nodes(depth) + 1),
                                                             static_cast<double>(context));
  return seconds > 0 ? spec::ExpectedTokensPerStep(alpha.alpha(), depth) / seconds : 0.0;
}

void DecodeStep(const LlamaModel& target, StepCostTable* costs,
                const std::vector<DecodeSlot*>& slots, DecodeStepTimes* times,
                PrefillChunks* prefill, const DecodeStepOptions& options) {
  c10::InferenceMode guard;
  const int batch = static_cast<int>(slots.size());
  // 1-2. Each sequence's k, then its drafts: the model-drafting ones in one batch.
  std::vector<DraftModelProposer::BatchItem> items;
  std::vector<FeatureDraftProposer::BatchItem> feature_items;
  int planned_chunk_rows = 0;  // the prompt chunks' rows in this step's forward: priced too
  if (prefill != nullptr) {
    for (const ForwardInput& chunk : prefill->inputs) planned_chunk_rows += chunk.tokens.size();
  }
  // The plain refresh (SpeculationPolicyOptions::plain_refresh_steps): where the batch's plain
  // step has gone unmeasured too long, every slot decodes plainly, no block of any kind, so
  // that this forward measures it.
  bool refresh = false;
  if (costs != nullptr) {
    for (const DecodeSlot* slot : slots) {
      if (slot->policy != nullptr &&
          costs->PlainRefreshDue(batch, planned_chunk_rows,
                                 slot->policy->options().plain_refresh_steps)) {
        refresh = true;
        costs->MarkPlainRefresh();
        break;
      }
    }
  }
  for (DecodeSlot* slot : slots) {
    slot->k = 0;
    slot->kind = BlockKind::kNone;
    slot->used_acceptance = nullptr;
    slot->emitted.clear();
    slot->logged_top_k = spec::TopKTensors();
    slot->error.clear();
    slot->draft_seconds = 0;
    try {
      SpeculativeDecoder& decoder = *slot->decoder;
      const std::vector<int>& tokens = decoder.tokens();
      if (slot->policy != nullptr && refresh) {
        slot->k = 0;
      } else if (slot->policy != nullptr) {
        const int64_t context = static_cast<int64_t>(tokens.size()) - 1;
        slot->k = slot->can_draft
                      ? slot->policy->ChooseK(*costs, batch, context,
                                              slot->proposer->CatchUpTokens(tokens),
                                              decoder.remaining(), planned_chunk_rows)
                      : 0;
        if ((slot->suffix != nullptr || slot->lookup != nullptr) &&
            TakeModelFreeBlock(*costs, batch, context, planned_chunk_rows, slot)) {
          continue;
        }
        if (slot->tree != nullptr && slot->draft_proposer != nullptr) {
          ChooseTree(*costs, batch, context, planned_chunk_rows, slot);
        }
      } else {
        slot->k = slot->fixed_k;
      }
      if (slot->k > 0 && slot->kind == BlockKind::kNone) {
        slot->kind = slot->draft_proposer != nullptr     ? BlockKind::kDraftModel
                     : slot->feature_proposer != nullptr ? BlockKind::kFeatureDraft
                                                         : BlockKind::kProposer;
      }
      if (slot->draft_proposer != nullptr) {
        const int k = decoder.BeginPropose(slot->k);
        items.push_back({slot->draft_proposer, &decoder.tokens(), k, decoder.mutable_draft()});
      } else if (slot->feature_proposer != nullptr) {
        const int k = decoder.BeginPropose(slot->k);
        feature_items.push_back(
            {slot->feature_proposer, &decoder.tokens(), k, decoder.mutable_draft()});
      } else {
        decoder.Propose(slot->k);
      }
    } catch (const std::exception& e) {
      FailSlot(slot, "draft failed", e);
    }
  }
  // Where the step verifies its chains: on the device, the drafts (the draft model's, the
  // head's) are drawn there too.
  const bool on_device = options.verify == VerifyPlace::kDevice ||
                         (options.verify == VerifyPlace::kAuto && !target.device().is_cpu());
  // The batched draft forwards' wall time: with their sampling, which the proposers' own
  // timings (their forwards) leave out.
  const auto d0 = Clock::now();
  try {
    DraftModelProposer::ProposeBatch(items, on_device);
  } catch (const std::exception& e) {  // the batch's draft forwards touched them all
    for (DecodeSlot* slot : slots) {
      if (slot->draft_proposer != nullptr && !IsModelFree(slot->kind) && slot->error.empty()) {
        FailSlot(slot, "draft failed", e);
      }
    }
  }
  try {
    FeatureDraftProposer::ProposeBatch(feature_items, on_device);
  } catch (const std::exception& e) {  // likewise the head's forwards
    for (DecodeSlot* slot : slots) {
      if (slot->feature_proposer != nullptr && !IsModelFree(slot->kind) && slot->error.empty()) {
        FailSlot(slot, "draft failed", e);
      }
    }
  }

  const double propose_wall = items.empty() && feature_items.empty() ? 0.0 : SecondsSince(d0);

  // 3. One target forward over every sequence still in the step.
  std::vector<DecodeSlot*> live;
  std::vector<ForwardInput> inputs;
  std::vector<int> layers;  // the features a feature draft reads (one head per step)
  std::vector<size_t> offsets;
  size_t rows = 0;
  double attended = 0;  // cached tokens the rows attend to, summed over the rows
  for (DecodeSlot* slot : slots) {
    if (!slot->error.empty()) continue;
    SpeculativeDecoder& decoder = *slot->decoder;
    const bool batched = slot->draft_proposer != nullptr || slot->feature_proposer != nullptr;
    if (batched && !IsModelFree(slot->kind)) decoder.EndPropose();
    if (slot->review_block_for_testing && !decoder.draft().tokens.empty() &&
        !slot->review_block_for_testing(*slot)) {
      decoder.mutable_draft()->Clear();
    }
    if (decoder.draft().tokens.empty()) slot->kind = BlockKind::kNone;  // dropped, or none
    if (decoder.draft().is_tree()) {  // chosen, or a fixed k's proposer drafts trees
      slot->kind = BlockKind::kTree;
    } else if (slot->kind == BlockKind::kTree) {  // dropped: did not fit
      slot->kind = BlockKind::kDraftModel;
    }
    if (slot->feature_proposer != nullptr) layers = slot->feature_proposer->feature_layers();
    slot->draft_seconds = IsModelFree(slot->kind) ? 0.0 : slot->proposer->last_propose_seconds();
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
  std::vector<int64_t> chunk_rows;  // logits rows of each prompt chunk
  std::vector<int64_t> chunk_tokens;
  if (prefill != nullptr) {
    prefill->error.clear();
    prefill->logits.clear();
    prefill->hidden.clear();
    if (layers.empty()) layers = prefill->feature_layers;
    for (ForwardInput& chunk : prefill->inputs) {
      chunk_tokens.push_back(chunk.tokens.size());
      chunk_rows.push_back(!chunk.logit_rows.empty()
                               ? static_cast<int64_t>(chunk.logit_rows.size())
                               : chunk.all_logits ? static_cast<int64_t>(chunk.tokens.size()) : 1);
      const double n = chunk.tokens.size();
      rows += chunk.tokens.size();
      attended += n * static_cast<double>(chunk.cache->length()) + n * (n - 1) / 2.0;
      inputs.push_back(std::move(chunk));
    }
    prefill->inputs.clear();
  }
  if (inputs.empty()) return;
  at::Tensor logits, hidden;
  const auto t0 = Clock::now();
  try {
    logits = layers.empty() ? target.Forward(inputs) : target.Forward(inputs, layers, &hidden);
    if (!on_device) logits = logits.to(at::kCPU).contiguous();
  } catch (const std::exception& e) {
    for (DecodeSlot* slot : live) FailSlot(slot, "target forward failed", e);
    if (prefill != nullptr && inputs.size() > live.size()) {
      prefill->error = std::string("target forward failed: ") + e.what();
    }
    return;
  }
  const double forward_s = SecondsSince(t0);
  if (prefill != nullptr) {
    int64_t at = static_cast<int64_t>(decode_rows);  // after the decoding sequences' rows
    for (const int64_t n : chunk_rows) {
      prefill->logits.push_back(on_device ? logits.narrow(0, at, n).to(at::kCPU, at::kFloat)
                                          : logits.narrow(0, at, n));
      at += n;
    }
    at = static_cast<int64_t>(decode_rows);  // every token of a chunk has a feature row
    for (const int64_t n : chunk_tokens) {
      prefill->hidden.push_back(hidden.defined() ? hidden.narrow(0, at, n) : at::Tensor());
      at += n;
    }
  }
  if (times != nullptr) {
    *times = {forward_s, static_cast<int>(live.size()), static_cast<int>(decode_rows),
              static_cast<int>(inputs.size() - live.size())};
  }

  // 4. Verification, each sequence's on_commit; 5. what the step measured.
  double verify_s = 0;  // the verifiers' (and on_commit's) work: part of what a row costs
  double draft_s = 0;   // the step's drafting, catch-ups apart
  double catch_up_s = 0;  // the step's catch-ups
  int draft_sequences = 0, draft_forwards = 0;
  bool draft_ran = false, unbatched = false;  // a tree or another proposer drafted
  auto slot_rows = [&](size_t i) {
    return (i + 1 < live.size() ? offsets[i + 1] : decode_rows) - offsets[i];
  };
  // On the device: every chain's outcome in one batched call (a tree keeps the host path).
  std::vector<DeviceChainResult> device_results;
  std::vector<int> device_index(live.size(), -1);
  if (on_device) {
    std::vector<DeviceChain> chains;
    for (size_t i = 0; i < live.size(); ++i) {
      const SpeculativeDecoder& decoder = *live[i]->decoder;
      if (decoder.draft().is_tree()) continue;
      const int64_t k = decoder.draft().tokens.size();
      device_index[i] = static_cast<int>(chains.size());
      // A chain drawn on the device keeps its q there (a dropped block's are stale).
      const DecodeSlot& slot = *live[i];
      const at::Tensor q = k == 0 ? at::Tensor()
                           : slot.kind == BlockKind::kDraftModel
                               ? slot.draft_proposer->device_probs()
                           : slot.kind == BlockKind::kFeatureDraft
                               ? slot.feature_proposer->device_probs()
                               : at::Tensor();
      chains.push_back({static_cast<int64_t>(offsets[i] + slot_rows(i)) - (k + 1),
                        &decoder.draft(), decoder.sampling(), decoder.rng(), q});
    }
    const auto c0 = Clock::now();
    try {
      const Status s =
          VerifyChainsOnDevice(logits.narrow(0, 0, static_cast<int64_t>(decode_rows)), chains,
                               &device_results, options.chain_verifier_for_testing);
      if (!s.ok()) throw std::runtime_error(s.ToString());
    } catch (const std::exception& e) {  // the batch's call touched every chain
      for (size_t i = 0; i < live.size(); ++i) {
        if (device_index[i] >= 0) FailSlot(live[i], "verification failed", e);
      }
    }
    verify_s += SecondsSince(c0);
    // Logging's top-K of the verified chains' rows, on the device; a failure here leaves
    // logged_top_k empty and the rows go to on_commit as on the host path.
    const auto t0 = Clock::now();
    std::vector<size_t> logged;
    std::vector<int64_t> rows_of;
    int top_k = 0;
    for (size_t i = 0; i < live.size(); ++i) {
      DecodeSlot* slot = live[i];
      if (device_index[i] < 0 || !slot->error.empty() || !slot->on_commit ||
          slot->log_top_k <= 0 || (top_k != 0 && slot->log_top_k != top_k)) {
        continue;
      }
      top_k = slot->log_top_k;
      logged.push_back(i);
      const int64_t k = slot->decoder->draft().tokens.size();
      const int64_t first = chains[device_index[i]].first_row;
      for (int64_t r = 0; r <= k; ++r) rows_of.push_back(first + r);
    }
    spec::TopKTensors all;
    bool taken = false;
    try {
      taken = !logged.empty() &&
              spec::TopKLogProbsToHost(logits.narrow(0, 0, static_cast<int64_t>(decode_rows)),
                                       rows_of, top_k, &all)
                  .ok();
    } catch (const std::exception&) {
      taken = false;  // the host path's rows instead
    }
    if (taken) {
      int64_t at = 0;
      for (const size_t i : logged) {
        const int64_t n = live[i]->decoder->draft().tokens.size() + 1;
        live[i]->logged_top_k = {all.ids.narrow(0, at, n), all.logprobs.narrow(0, at, n),
                                 all.tail_mass.narrow(0, at, n)};
        at += n;
      }
    }
    verify_s += SecondsSince(t0);
  }
  for (size_t i = 0; i < live.size(); ++i) {
    DecodeSlot* slot = live[i];
    if (!slot->error.empty()) continue;  // its device verification failed
    const size_t n = slot_rows(i);
    try {
      const auto c0 = Clock::now();
      at::Tensor mine = logits.narrow(0, offsets[i], n);
      // Decoding inputs ask every row's logits: their feature rows are the same rows.
      const at::Tensor features =
          hidden.defined() ? hidden.narrow(0, offsets[i], n) : at::Tensor();
      if (device_index[i] >= 0) {
        const DeviceChainResult& r = device_results[device_index[i]];
        if (!r.status.ok()) {
          slot->error = "verification failed: " + r.status.ToString();
          continue;
        }
        slot->emitted = slot->decoder->CommitOutcome(r.outcome, r.optimal, features);
      } else {
        if (on_device) mine = mine.to(at::kCPU, at::kFloat).contiguous();
        slot->emitted = slot->decoder->Commit(mine, features);
      }
      if (slot->on_commit) {
        if (slot->logged_top_k.ids.defined() && !slot->commit_needs_rows) {
          mine = at::Tensor();  // the step travels in logged_top_k alone
        } else if (on_device) {
          mine = mine.to(at::kCPU, at::kFloat).contiguous();  // no-op when there
        }
        slot->on_commit(*slot, mine);
      }
      verify_s += SecondsSince(c0);
    } catch (const std::exception& e) {
      FailSlot(slot, "verification failed", e);
      continue;
    }
    const int drafted = static_cast<int>(slot->decoder->draft().tokens.size());
    if (slot->kind == BlockKind::kTree && slot->tree != nullptr) {  // (a fixed k's: as chains)
      // Its acceptance per depth; its level forwards price both trees and batched chains (a
      // draft forward over that many new rows).
      slot->tree->alpha.Observe(slot->k, slot->decoder->last_accepted());
      draft_ran = true;
      unbatched = true;
      if (costs != nullptr) {
        const Proposer::CatchUp catch_up = slot->proposer->last_catch_up();
        costs->ObserveCatchUp(catch_up.tokens, catch_up.seconds);
        for (const auto& f : slot->draft_proposer->last_tree_forwards()) {
          costs->ObserveDraft(f.rows, f.seconds);
        }
      }
      continue;
    }
    if (IsModelFree(slot->kind)) {
      slot->used_acceptance->by_match[slot->suffix_bucket].Observe(
          drafted, slot->decoder->last_accepted());
      continue;  // no draft forward, no catch-up: nothing of the draft's to measure
    }
    if (slot->policy != nullptr) slot->policy->ObserveStep(drafted, slot->decoder->last_accepted());
    const Proposer::CatchUp catch_up = slot->proposer->last_catch_up();
    if (costs != nullptr) costs->ObserveCatchUp(catch_up.tokens, catch_up.seconds);
    draft_ran = draft_ran || catch_up.tokens > 0 || slot->draft_seconds > 0;
    if (catch_up.tokens > 0) catch_up_s += std::max(0.0, catch_up.seconds);
    if (slot->kind == BlockKind::kProposer) unbatched = true;
    if (drafted > 0 && slot->draft_seconds > 0) {
      draft_s += slot->draft_seconds;
      ++draft_sequences;
      draft_forwards = std::max(draft_forwards, drafted);
    }
  }
  if (costs == nullptr) return;
  costs->ObserveTarget(static_cast<int>(rows), attended, forward_s + verify_s, draft_ran);
  if (draft_forwards > 0) {
    // Per batched forward: the batch's wall time less its catch-ups where only chains drafted
    // (sampling included), else the proposers' forwards.
    const double batched = unbatched ? draft_s : std::max(draft_s, propose_wall - catch_up_s);
    costs->ObserveDraft(draft_sequences, batched / draft_forwards);
  }
}

}  // namespace specloop
