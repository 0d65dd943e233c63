// A completion request as it travels from an HTTP handler thread to the scheduler thread and
// back (llama.cpp's server "task" and "result", split apart):
//
//   CompletionParams   what the client asked for, validated and tokenized (completion_params.h);
//   RequestChannel     the per-request mailbox: the scheduler posts text deltas and one final
//                      result, the handler waits on it (or streams from it), and either side
//                      may cancel.
//
// The scheduler owns the models and every per-sequence state; the handler owns nothing but
// its shared_ptr to the channel.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "common/engine/generate.h"
#include "serve/spec_decode_metrics.h"
#include "serve/token_logprobs.h"

namespace specloop {

struct CompletionParams {
  std::string request_id;    // "cmpl-..." (server-assigned)
  std::string model;         // the served model name the client named (or the default)
  std::string domain;        // traffic domain as given ("default" when none)
  std::string prompt_text;
  std::vector<int> prompt;   // ids, BOS included when the model wants one
  GenerateOptions generate;  // max_tokens, sampling, stop_at_eos
  std::vector<std::string> stop;  // stop strings (cut on decoded text), at most 4, non-empty
  bool stream = false;
  bool log = true;           // log this request into the replay buffer (when the server logs)
  // Ids that end generation beside the model config's EOS ids (generation_config.json's; empty
  // under ignore_eos): the output ends with the first one, as with an EOS.
  std::vector<int> stop_token_ids;
  // Log-probabilities: -1 none; N >= 0: each generated token's, with its N most likely
  // alternatives (token_logprobs.h).
  int logprobs = -1;
  bool tokens_as_ids = false;  // show tokens as "token_id:ID" (vLLM's return_tokens_as_token_ids)
};

// Speculative statistics reported in the response's `speculative` object.
struct SpeculativeUsage {
  int64_t steps = 0;
  int64_t drafts = 0;  // steps that verified a draft (SpeculativeStats::drafts)
  int64_t drafted = 0;
  int64_t accepted = 0;
  int64_t tested = 0;  // SpeculativeStats::tested
  uint64_t draft_version = 0;
  // Of the above, the steps whose block came from the suffix proposer (each verified one) and
  // their tokens; the rest are the draft model's.
  struct Suffix {
    int64_t steps = 0, drafted = 0, accepted = 0, tested = 0;
  } suffix;
  Suffix lookup;  // likewise, the blocks of prompt lookup (--prompt-lookup)
  Suffix tree;    // likewise, the draft's token trees (--draft-mode tree; drafted: nodes)
  // Per tested token, as specloop_acceptance_rate (independent of k).
  double acceptance_rate() const { return tested ? double(accepted) / tested : 0.0; }
};

// What the scheduler posts. A request gets zero or more kDelta events (each with text, or
// log-probs, or both) and then exactly one kDone or kError event.
struct RequestEvent {
  enum class Type { kDelta, kDone, kError };
  Type type = Type::kDelta;
  std::string text;              // kDelta: new text; kDone: empty
  // kDelta, when the request asks for log-probs: the entries of the tokens this step added to
  // the output, in order (their text may still be held back: text and tokens need not align).
  std::vector<TokenLogprob> logprobs;
  std::string finish_reason;     // kDone: "stop" (EOS or stop string) or "length"
  int prompt_tokens = 0;         // kDone
  int completion_tokens = 0;     // kDone: tokens generated (past a stop string included)
  SpeculativeUsage speculative;  // kDone
  // kDone: vLLM's per-request block (spec_decode_metrics.h); level kNone when not collected.
  RequestSpecDecodeMetrics spec_decode;
  int http_status = 500;         // kError
  std::string error;             // kError: message
};

// Thread-safe mailbox between one handler thread and the scheduler thread.
class RequestChannel {
 public:
  using Clock = std::chrono::steady_clock;

  explicit RequestChannel(CompletionParams params)
      : params_(std::move(params)), created_(Clock::now()) {}

  const CompletionParams& params() const { return params_; }
  Clock::time_point created() const { return created_; }

  // Scheduler side: posts an event and wakes the waiter.
  void Post(RequestEvent event) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      events_.push_back(std::move(event));
    }
    cv_.notify_all();
  }

  // Handler side: waits up to `timeout` for the next event and moves it into *event.
  // Returns false on timeout.
  template <typename Rep, typename Period>
  bool Next(std::chrono::duration<Rep, Period> timeout, RequestEvent* event) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [this] { return !events_.empty(); })) return false;
    *event = std::move(events_.front());
    events_.pop_front();
    return true;
  }

  // Either side: the client went away (or the server shuts down). The scheduler retires the
  // sequence at its next iteration and posts nothing more that matters.
  void Cancel() { cancelled_.store(true, std::memory_order_release); }
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }

 private:
  const CompletionParams params_;
  const Clock::time_point created_;
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestEvent> events_;  // GUARDED_BY(mu_)
};

}  // namespace specloop
