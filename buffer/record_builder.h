// RecordBuilder: the one way a decoded request becomes a replay-buffer Record (buffer/record.h).
// Serving (serve/sample_logger.h) and the trainer's synthetic traffic
// (trainer/synthetic_traffic.h) both build through it, so a record has the same shape wherever
// it came from: the same top-K selection, the same prompt rows, the same tail mass.
//
// Rows are the target's float32 scores over the vocabulary at one position, at temperature 1:
// logits or log-probs (a constant added to a row changes nothing). For each row the record
// keeps the K largest log-probs in decreasing order, ties toward the lower id, as fp16 bits
// (common/base/half.h), and the tail mass 1 - (sum of the kept probabilities, from the float
// log-probs before rounding), clamped to [0, 1].
//
// Pure C++ (no LibTorch). Not thread-safe: one builder per request, used by one thread at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "buffer/record.h"
#include "common/base/sampling.h"
#include "common/base/status.h"

namespace specloop {

// Fills `step`'s topk_ids, topk_logprobs ((num_rows * top_k) each, row-major) and tail_mass
// (num_rows) from `rows` ([num_rows, vocab] float32, contiguous) as the header describes. When
// top_k > vocab the entries past vocab hold id 0 and log-prob -inf. NaN scores rank last (their
// log-probs are NaN). Leaves the step's other fields alone.
void FillTopK(const float* rows, int num_rows, int vocab, int top_k, SpecStep* step);

// What a record says about who produced it; stamped on the record as is.
struct RecordInfo {
  std::string domain;        // cut to its first 255 bytes
  std::string request_id;
  uint32_t worker_id = 0;
  uint64_t draft_version = 0;
  std::string target_id;
  SamplingParams sampling;   // the request's (the logged log-probs are at temperature 1)
  int top_k = 64;            // K kept per position (> 0). Default: 64.
};

class RecordBuilder {
 public:
  // A record of a request whose prompt is `prompt_len` tokens long (time_us 0: the
  // ReplayLogger stamps it).
  RecordBuilder(const RecordInfo& info, uint32_t prompt_len);

  // One verification step: k = draft_tokens.size() tokens proposed at sequence position
  // `start_pos` (the sequence's length before them), `num_accepted` of them accepted, and
  // `rows` the target's k + 1 rows ([num_rows, vocab], num_rows = k + 1: the positions
  // start_pos .. start_pos + k). InvalidArgument, nothing added, when num_accepted > k,
  // num_rows != k + 1, vocab <= 0 or top_k <= 0.
  Status AddStep(uint32_t start_pos, std::vector<int32_t> draft_tokens, uint32_t num_accepted,
                 const float* rows, int num_rows, int vocab);

  // The same step from a top-K already taken (FillTopK's selection, made on the model's
  // device: common/spec/tensor_topk.h): for each of the num_rows = k + 1 positions, `top_k`
  // ids and float log-probs in decreasing order (row-major) and the tail mass. The log-probs
  // are rounded to fp16 here, as FillTopK rounds its own, and the tail mass clamped to [0, 1].
  // InvalidArgument, nothing added, as AddStep, or when top_k is not the record's K.
  Status AddStepTopK(uint32_t start_pos, std::vector<int32_t> draft_tokens,
                     uint32_t num_accepted, const int64_t* ids, const float* logprobs,
                     const float* tail_mass, int num_rows, int top_k);

  // Prompt rows: row i ([num_rows, vocab]) is the target's distribution of prompt token
  // `first + i` given the tokens before it; each becomes a step with no draft tokens (k = 0)
  // at that position. Serving logs positions 1 .. prompt_len - 1 (the last one's row is the
  // first decoding step's, position prompt_len). InvalidArgument, nothing added, unless
  // 1 <= first and first + num_rows <= prompt_len, or when vocab <= 0 or top_k <= 0.
  Status AddPromptRows(uint32_t first, const float* rows, int num_rows, int vocab);

  // The finished record: `tokens` = prompt + every generated id, the steps in the order they
  // were added; the builder is empty afterwards. InvalidArgument, *out untouched, when tokens
  // is shorter than the prompt or the record fails ValidateRecord.
  Status Finish(std::vector<int32_t> tokens, Record* out);

  size_t num_steps() const { return record_.steps.size(); }

 private:
  Status CheckRows(int vocab) const;
  Status CheckStep(size_t k, uint32_t num_accepted, int num_rows) const;

  Record record_;
};

}  // namespace specloop
