// Sampling transforms: from a row of logits to the exact processed distribution that decoding
// samples from (and that speculative verification compares: p for the target, q for the
// draft). Pure math over float arrays; no model, no LibTorch.
//
// Order of transforms (as in Hugging Face and vLLM): temperature, then top-k, then top-p.
// temperature == 0 means greedy: the distribution is one-hot on the argmax (lowest id on ties).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/base/rng.h"

namespace specloop {

struct SamplingParams {
  // Softmax temperature; 0 selects greedy decoding. Default: 1.
  float temperature = 1.0f;
  // Keep only the k most likely tokens; 0 keeps all. Default: 0.
  int top_k = 0;
  // Keep the smallest set of most likely tokens whose mass reaches top_p; 1 keeps all.
  // Default: 1.
  float top_p = 1.0f;
  // Seed of the request's Rng. Default: 0.
  uint64_t seed = 0;

  bool greedy() const { return temperature <= 0.0f; }
  // Empty when valid, else what is wrong ("top_p must be in (0, 1]").
  std::string Validate() const;
};

// Writes the processed distribution of `logits[0..vocab)` into `probs` (resized to vocab):
// non-negative, summing to 1, zero outside the kept set. Ties at the top-k / top-p boundary are
// broken toward lower token ids, so the result is deterministic.
void ProcessedDistribution(const float* logits, int vocab, const SamplingParams& params,
                           std::vector<float>* probs);

// Raw softmax of logits at temperature 1 (used for logging the target's log-probs).
void Softmax(const float* logits, int vocab, std::vector<float>* probs);

// Index of the largest value (lowest index on ties).
int Argmax(const float* values, int n);

// Draws an index from `probs` (which need not be exactly normalized: the draw is scaled by
// the sum) with one Uniform() from `rng`. Entries equal to zero are never drawn.
int SampleFrom(const float* probs, int n, Rng* rng);

}  // namespace specloop
