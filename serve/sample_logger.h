// SampleLogger: the glue from a sequence's speculative steps to replay-buffer Records
// (buffer/record.h) written through the asynchronous ReplayLogger.
//
// The scheduler thread does the cheap part: per step it hands over the draft tokens, the
// number accepted, the start position and the target's k + 1 logits rows (or, where the step
// verified on the model's device, those rows' top-K taken there), and at the end of
// the request the final tokens; per prompt chunk of the prefill, the rows of the prompt
// positions it computed (AddPromptRows). A queued step holds a contiguous float32 CPU copy of
// its own rows only (never a view that would keep a whole batch's logits alive), so what the
// queue holds is what it counts. A worker thread does the rest off the decoding path:
// log-softmax at temperature 1, the top-K ids and log-probs (fp16), the tail mass, and the
// ReplayLogger::Log() of the finished record. Records are built by buffer/record_builder.h
// (top-K with ties toward lower ids, fp16 log-probs, tail mass, prompt rows as k = 0 steps),
// the builder synthetic traffic uses too.
//
// Never blocks the caller: a step that would take the queue past `max_pending_steps` steps or
// past `max_pending_bytes` bytes of rows is dropped before it is copied (the record is still
// written, without that step; what is already queued is kept) and counted in steps_dropped()
// (prompt rows count a step each, and a chunk's rows are kept or dropped together, so a chunk
// larger than the byte cap is always dropped); so is a step the builder refuses (rows not
// k + 1, num_accepted > k, prompt rows outside the prompt) or whose rows are undefined.
// ReplayLogger drops are counted there.
//
// Thread safety: Begin/AddStep/AddPromptRows/Finish from one thread (the scheduler); stats from any.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>

#include "buffer/record.h"
#include "buffer/record_builder.h"
#include "buffer/replay_logger.h"
#include "common/spec/tensor_topk.h"

namespace specloop {

struct SampleLoggerOptions {
  // K: target distribution entries kept per position. Default: 64.
  int top_k = 64;
  // Most steps queued for the worker; more are dropped. Default: 2048.
  size_t max_pending_steps = 2048;
  // Most bytes of rows queued for the worker (4 bytes a vocabulary entry a row); a step that
  // would go past it is dropped. Bounds the queue's memory whatever the vocabulary: 64 MiB
  // holds ~450 steps of k = 8 at vocab 4096, ~14 at vocab 128k. Default: 64 MiB.
  size_t max_pending_bytes = size_t{64} << 20;
  // Worker id and target id stamped on every record.
  uint32_t worker_id = 0;
  std::string target_id;
};

class SampleLogger {
 public:
  // `logger` (not owned) must outlive this object.
  SampleLogger(ReplayLogger* logger, const SampleLoggerOptions& options);
  // Drains the queue (every finished request is logged) and stops the worker.
  ~SampleLogger();
  SampleLogger(const SampleLogger&) = delete;
  SampleLogger& operator=(const SampleLogger&) = delete;

  // One request's record under construction; opaque to the scheduler.
  struct Trace;

  // Starts a record: domain, request id, draft version, sampling, prompt (the prompt's ids).
  std::shared_ptr<Trace> Begin(const std::string& domain, const std::string& request_id,
                               uint64_t draft_version, const SamplingParams& sampling,
                               const std::vector<int>& prompt);
  // One verification step. `start_pos`: index in the sequence of the first draft token (the
  // sequence's length before the step's drafts); `rows`: the step's k + 1 target logits rows
  // ([k + 1, vocab] float32 on the CPU).
  void AddStep(const std::shared_ptr<Trace>& trace, uint32_t start_pos,
               const std::vector<int>& draft_tokens, int num_accepted, at::Tensor rows);
  // The same step from its rows' top-K already taken on the model's device
  // (spec::TopKLogProbsToHost; DecodeSlot::logged_top_k): ids [k + 1, K] int64, logprobs
  // [k + 1, K] and tail_mass [k + 1] float32 on the CPU, K = options' top_k. A step whose
  // tensors are undefined or of other shapes is dropped and counted, as a refused one.
  void AddStepTopK(const std::shared_ptr<Trace>& trace, uint32_t start_pos,
                   const std::vector<int>& draft_tokens, int num_accepted,
                   const spec::TopKTensors& top_k);
  // The target's rows at prompt positions first, first + 1, ... (`rows`: [n, vocab] float32
  // on the CPU; row i is the distribution of tokens[first + i] given the tokens before it),
  // computed by the prefill: each is logged as a step with no draft tokens (k = 0) at its
  // position. The trainer distils on them too; its evaluation leaves them out (they are not
  // what the target generated).
  void AddPromptRows(const std::shared_ptr<Trace>& trace, uint32_t first, at::Tensor rows);
  // The request ended (any reason): `tokens` = prompt + every generated id. Queues the record.
  void Finish(const std::shared_ptr<Trace>& trace, const std::vector<int>& tokens);

  int top_k() const { return options_.top_k; }
  uint64_t steps_dropped() const { return steps_dropped_.load(); }
  uint64_t records_submitted() const { return records_submitted_.load(); }
  // Finished records the builder refused (final tokens shorter than the prompt): not logged.
  uint64_t records_refused() const { return records_refused_.load(); }
  // Steps and records waiting for the worker.
  size_t pending() const;
  // Bytes of rows held by queued steps (a step's count until the worker has built it), and the
  // most it has held at once since construction.
  size_t pending_bytes() const;
  size_t peak_pending_bytes() const;

 private:
  struct Job {
    std::shared_ptr<Trace> trace;
    bool finish = false;
    SpecStep step;       // start_pos, draft tokens, num_accepted; RecordBuilder adds the rest
    at::Tensor rows;     // step rows: the caller's until queued, then this job's own copy
    spec::TopKTensors top_k;  // or the rows' top-K (AddStepTopK), copied the same way
    size_t bytes = 0;    // what the copy of `rows` or `top_k` holds (counted in pending_bytes_)
    bool prompt = false;  // rows are prompt positions from step.start_pos on, a step each
    // Steps it makes (what max_pending_steps counts): a prompt job's rows hold as much as
    // that many steps of one row.
    size_t steps() const { return prompt ? static_cast<size_t>(rows.size(0)) : 1; }
    std::vector<int32_t> tokens;  // finish: the final tokens
  };
  void Push(Job job);
  void WorkerLoop();

  ReplayLogger* const logger_;
  const SampleLoggerOptions options_;
  std::atomic<uint64_t> steps_dropped_{0}, records_submitted_{0}, records_refused_{0};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;  // GUARDED_BY(mu_)
  size_t pending_steps_ = 0;  // GUARDED_BY(mu_)
  size_t pending_bytes_ = 0;  // GUARDED_BY(mu_)
  size_t peak_pending_bytes_ = 0;  // GUARDED_BY(mu_)
  bool stop_ = false;         // GUARDED_BY(mu_)
  std::thread worker_;
};

}  // namespace specloop
