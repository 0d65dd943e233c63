// Sequence: one active request inside the scheduler. A composition of single-purpose parts,
// each owned here and touched only by the scheduler thread.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "common/engine/decode_step.h"
#include "common/engine/draft_model_proposer.h"
#include "common/engine/speculative_decoder.h"
#include "common/spec/prompt_lookup_proposer.h"
#include "common/spec/speculation_policy.h"
#include "common/spec/suffix_proposer.h"
#include "serve/request.h"
#include "serve/sample_logger.h"
#include "serve/serving_metrics.h"
#include "serve/text_stream.h"

namespace specloop {

// Proposes nothing: plain decoding through the same decoder (speculation off).
class NullProposer : public Proposer {
 public:
  void Propose(const std::vector<int>& context, int max_k, DraftBlock* out) override {
    out->Clear();
  }
};

struct Sequence {
  using Clock = std::chrono::steady_clock;

  std::shared_ptr<RequestChannel> channel;        // the client's mailbox
  ServingMetrics::DomainSeries* series = nullptr;  // the domain's metrics
  std::unique_ptr<Proposer> proposer;              // DraftModelProposer or NullProposer
  std::unique_ptr<SuffixProposer> suffix;          // over the domain's index (may be null)
  std::unique_ptr<PromptLookupProposer> lookup;    // over its own context (may be null)
  std::unique_ptr<SpeculativeDecoder> decoder;     // target cache, verification, tokens
  std::unique_ptr<TextStream> text;                // ids -> released text, stop strings
  std::shared_ptr<SampleLogger::Trace> trace;      // null when not logged
  // Logged: prompt positions [1, prompt_logged_to) have the target's row in the trace or in
  // this step's chunk, which asked for the rows of positions [chunk_first, prompt_logged_to)
  // (a resumed prefill logs no position again).
  int64_t prompt_logged_to = 1;
  int64_t chunk_first = 1;
  uint64_t draft_version = 0;
  SpeculativeUsage::Suffix suffix_usage;           // the suffix proposer's steps so far
  SpeculativeUsage::Suffix lookup_usage;           // prompt lookup's steps so far
  SpeculativeUsage::Suffix tree_usage;             // token-tree steps so far
  RequestSpecDecodeMetrics spec_decode;            // per-request block (level kNone: off)
  // When the request asks for log-probs: the entries of the last step's emitted tokens
  // (slot.emitted), computed by its on_commit from the step's target rows; and the scratch row.
  std::vector<TokenLogprob> step_logprobs;
  std::vector<float> logprob_scratch;
  // Tokens the decoder emitted after an extra stop id (CompletionParams::stop_token_ids) ended
  // the output in their step: not part of the output, nor counted in completion_tokens.
  int64_t cut_tokens = 0;
  bool got_first_token = false;
  double ttft_seconds = -1;
  bool done = false;                               // retired at the end of the iteration
  bool preempted = false;                          // its cache blocks freed; waits to resume

  // The decoder's place in the step (DecodeStep: its proposers, the domain's policy for
  // adaptive k, the logger's call), set at admission, and the last step's outcome.
  DecodeSlot slot;
};

}  // namespace specloop
