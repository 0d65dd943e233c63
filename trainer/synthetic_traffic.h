// Synthetic traffic: replay records made by running speculative decoding locally, exactly as a
// serving worker would log them (target's raw temperature-1 top-K log-probs and tail mass at
// each of the k+1 verified positions, buffer/record.h). Tests and the trainer benchmark use it
// to produce a small real buffer; it also seeds a buffer for an offline run.
#pragma once

#include <string>
#include <vector>

#include "buffer/record.h"
#include "common/base/status.h"
#include "common/model/llama_model.h"

namespace specloop {
namespace trainer {

struct TrafficOptions {
  int k = 4;                    // draft tokens per step. Default: 4.
  int max_tokens = 64;          // tokens generated per request. Default: 64.
  int top_k = 64;               // K logged per position. Default: 64.
  float temperature = 1.0f;     // sampling temperature of the requests. Default: 1.
  uint64_t seed = 0;            // request i uses seed + i. Default: 0.
  int max_prompt_tokens = 128;  // prompts are cut to their last tokens. Default: 128.
};

// Decodes `prompt` (BOS included) with `target` verifying `draft`'s proposals and fills
// *record (time_us left 0; draft_version 0) through buffer/record_builder.h, as serving's
// SampleLogger does: a prompt row (k = 0 step) at each prompt position 1 .. prompt_len - 1,
// then one step per verification. InvalidArgument for an empty prompt; IOError wraps a
// LibTorch failure.
Status DecodeToRecord(const LlamaModel& target, const LlamaModel& draft,
                      const std::vector<int>& prompt, const std::string& domain,
                      const std::string& request_id, const TrafficOptions& options,
                      Record* record);

// Reads up to `max_prompts` prompts of SHARED/prompts/<domain>.jsonl, tokenized with the
// tokenizer of `model_dir` (BOS added as its config says) and cut to max_prompt_tokens.
Status LoadDomainPrompts(const std::string& shared_dir, const std::string& domain,
                         const std::string& model_dir, size_t max_prompts, int max_prompt_tokens,
                         std::vector<std::vector<int>>* out);

}  // namespace trainer
}  // namespace specloop
