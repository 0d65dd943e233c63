// Plain autoregressive decoding: the baseline every speculative mode is measured against, and
// the reference its greedy output must equal.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "common/base/sampling.h"
#include "common/model/llama_model.h"

namespace specloop {

struct GenerateOptions {
  // Most tokens to generate. Default: 128.
  int max_tokens = 128;
  // Temperature, top-k, top-p and seed. Default: greedy off (temperature 1).
  SamplingParams sampling;
  // Stop after emitting an EOS id of the model's config (the EOS is kept in the output).
  // Default: true.
  bool stop_at_eos = true;
  // The target's cache lies in this pool, when given: a bounded pool kept across calls, as a
  // server's (on CUDA, forwards over such a pool replay CUDA graphs: LlamaModel::Forward);
  // else in a pool of its own, sized for the prompt and max_tokens. Default: none.
  std::shared_ptr<KVBlockPool> pool;
};

struct GenerateResult {
  std::vector<int> tokens;     // generated ids, prompt excluded
  bool hit_eos = false;        // stopped on EOS
  double prefill_seconds = 0;  // prompt forward, to the first token
  double decode_seconds = 0;   // the rest
};

// Decodes from `prompt` (ids, BOS included when the model wants one). Stops at max_tokens, EOS
// or the context limit. REQUIRES: prompt non-empty and shorter than the context limit.
GenerateResult GeneratePlain(const LlamaModel& model, const std::vector<int>& prompt,
                             const GenerateOptions& options);

// Sees each generated token with the row of logits it was sampled from (`vocab` float32
// values on the CPU, valid during the call), e.g. to report its log-probability.
using TokenObserver = std::function<void(int token, const float* logits, int vocab)>;

// GeneratePlain one token at a time, for callers that interleave it with other work (spec_bench
// steps decoders in lockstep, so that they share the machine's state) or watch each token
// (`observer`, may be null; its time counts as the step's). `model` must outlive it.
class PlainGeneration {
 public:
  // Runs the prompt (prefill_seconds) and samples the first token; max_tokens <= 0: finished.
  PlainGeneration(const LlamaModel& model, const std::vector<int>& prompt,
                  const GenerateOptions& options, TokenObserver observer = nullptr);
  bool finished() const { return finished_; }
  // One forward and one token, timed into decode_seconds. REQUIRES: !finished().
  void Step();
  const GenerateResult& result() const { return result_; }

 private:
  // Samples from the forward's logits; stops at EOS, max_tokens or a full context.
  void Sample(const at::Tensor& logits);

  const LlamaModel& model_;
  GenerateOptions options_;
  TokenObserver observer_;
  KVCache cache_;
  Rng rng_;
  std::vector<float> scratch_;
  GenerateResult result_;
  bool finished_ = false;
};

// Samples one token from a row of float32 logits under `params` (greedy: argmax).
int SampleToken(const float* logits, int vocab, const SamplingParams& params, Rng* rng,
                std::vector<float>* scratch);

}  // namespace specloop
