// TokenLogprob: a generated token's log-probability and its most likely alternatives, under
// the request's own sampling, as the OpenAI `logprobs` fields report them (formatted by
// logprobs_json.h). Pure math over a row of logits; no model, no LibTorch.
#pragma once

#include <vector>

#include "common/base/sampling.h"

namespace specloop {

struct TokenLogprob {
  struct Alternative {
    int token = 0;
    double logprob = 0;
  };
  int token = 0;
  // The chosen token's log-probability; kLogprobFloor where it lies outside the distribution
  // (never for a token the request's sampling could draw).
  double logprob = 0;
  // The most likely tokens of the distribution, best first (ties toward the lower id), at most
  // the request's N; the chosen token is among them only where it ranks.
  std::vector<Alternative> top;
};

// What a log-probability of -inf is reported as (JSON has no infinity), as vLLM does.
constexpr double kLogprobFloor = -9999.0;

// Fills *out for `token` drawn from the row `logits[0, vocab)` under `sampling`, with `top_n`
// (>= 0) alternatives:
//   greedy (temperature 0): log_softmax(logits), every token a candidate (the log-sum-exp by
//     SumExpBelow, common/kernels/cpu_kernels.h, as the sample logger's);
//   sampled: the log of the processed distribution the token is drawn from, the very row the
//     decoder draws from (ProcessedDistribution, common/base/sampling.h: softmax(logits / T),
//     cut by top-k then top-p, renormalized; float, a relative error near 1e-7); tokens outside
//     the kept set are left out of `top`.
// Cost: one pass over the row (sampled: ProcessedDistribution's) and one for the top_n.
// `scratch` is reused between calls (the processed row).
void ComputeTokenLogprob(const float* logits, int vocab, const SamplingParams& sampling,
                         int token, int top_n, std::vector<float>* scratch, TokenLogprob* out);

}  // namespace specloop
