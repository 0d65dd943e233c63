// Record: what the replay buffer holds for one finished request (or one block of speculative
// steps of a request): who produced it, how it was sampled, the tokens, and for every
// speculative step the draft tokens, how many the target accepted and the target's sparse
// distribution at each of the k+1 verified positions (DESIGN.md section 5).
//
// A plain value type: copyable, movable, comparable. buffer/record_codec.h turns it into bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/base/sampling.h"

namespace specloop {

// One speculative step: k = draft_tokens.size() draft tokens verified in one target pass.
struct SpecStep {
  // Index in Record::tokens of the first draft token (the position the step started at). A
  // step with start_pos < Record::prompt_len is a prompt row: no draft, the target's
  // distribution at a prompt position, which the serving prefill computed (logged before the
  // decoding steps; only positions past a prefix the KV cache already held).
  uint32_t start_pos = 0;
  // The k proposed tokens, in order. A token tree's step is logged as its accepted path (its
  // other nodes are not kept): k = num_accepted, the rows those of the committed positions.
  std::vector<int32_t> draft_tokens;
  // How many of the draft tokens the target accepted, 0..k.
  uint32_t num_accepted = 0;
  // The target's raw (temperature 1) distribution at each of the k+1 positions, stored
  // sparsely as its top-K entries, flattened position-major:
  //   topk_ids[j * K + i], topk_logprobs[j * K + i] for position j in [0, k], entry i in [0, K)
  // where K = Record::top_k. Log-probs are IEEE fp16 bit patterns (common/base/half.h converts).
  std::vector<int32_t> topk_ids;
  std::vector<uint16_t> topk_logprobs;
  // Probability mass outside the top-K at each of the k+1 positions (size k+1), in [0, 1].
  std::vector<float> tail_mass;

  bool operator==(const SpecStep& o) const;
  bool operator!=(const SpecStep& o) const { return !(*this == o); }
};

struct Record {
  // Wall-clock time of the record in microseconds since the Unix epoch. Orders the buffer
  // (retention drops the oldest first). 0 when logged: the logger stamps the current time.
  uint64_t time_us = 0;
  // Traffic domain ("prose", "python", ...). At most 255 bytes, no NUL byte.
  std::string domain;
  // The request's id as the client or server named it.
  std::string request_id;
  // Serving worker that produced the record.
  uint32_t worker_id = 0;
  // Version of the draft model that proposed the tokens.
  uint64_t draft_version = 0;
  // Identifies the target model (e.g. its directory name or checksum).
  std::string target_id;
  // The request's sampling parameters (the logged log-probs are raw, at temperature 1).
  SamplingParams sampling;
  // tokens[0, prompt_len) is the prompt, the rest the output.
  uint32_t prompt_len = 0;
  std::vector<int32_t> tokens;
  // K: entries of the target's distribution kept per position. Default: 64.
  uint32_t top_k = 64;
  std::vector<SpecStep> steps;

  bool operator==(const Record& o) const;
  bool operator!=(const Record& o) const { return !(*this == o); }
};

// Empty when `r` is well formed, else what is wrong: domain too long or holding NUL,
// prompt_len > tokens.size(), num_accepted > k, or a step whose topk_ids / topk_logprobs are
// not (k+1)*K long or whose tail_mass is not k+1 long. Cost: O(number of steps).
std::string ValidateRecord(const Record& r);

}  // namespace specloop
