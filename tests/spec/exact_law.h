// The reference side of the statistical exactness tests over real forwards: the exact law of
// a few generated tokens under the target, and a deliberately wrong chain verifier that each
// test must catch.
#pragma once

#include <algorithm>
#include <vector>

#include "common/base/rng.h"
#include "common/base/sampling.h"
#include "common/base/status.h"
#include "common/model/llama_model.h"
#include "common/spec/chain_verify.h"

namespace specloop {
namespace spec_test {

// A wrong verifier: accepts with min(1, q/p) instead of min(1, p/q).
inline Status AcceptWithQOverP(int k, int vocab, const int* draft, const float* q,
                               const float* p, Rng* rng, spec::ChainOutcome* out) {
  out->tokens.clear();
  for (int i = 0; i < k; ++i) {
    const float* pi = p + static_cast<size_t>(i) * vocab;
    const float* qi = q + static_cast<size_t>(i) * vocab;
    const int x = draft[i];
    if (rng->Uniform() * pi[x] < qi[x]) {
      out->tokens.push_back(x);
      continue;
    }
    std::vector<float> residual(vocab);
    float mass = 0;
    for (int v = 0; v < vocab; ++v) mass += residual[v] = std::max(0.0f, pi[v] - qi[v]);
    out->num_accepted = i;
    out->tokens.push_back(SampleFrom(mass > 0 ? residual.data() : pi, vocab, rng));
    return Status::OK();
  }
  out->num_accepted = k;
  out->tokens.push_back(SampleFrom(p + static_cast<size_t>(k) * vocab, vocab, rng));
  return Status::OK();
}

// Exact law of the first `len` generated tokens under the target's processed distributions.
inline std::vector<double> ExactSequenceLaw(const LlamaModel& m, const std::vector<int>& prompt,
                                            int len, const SamplingParams& sp) {
  const int V = m.config().vocab_size;
  std::vector<double> law = {1.0};
  std::vector<std::vector<int>> prefixes = {{}};
  for (int step = 0; step < len; ++step) {
    std::vector<double> next;
    std::vector<std::vector<int>> next_prefixes;
    for (size_t i = 0; i < prefixes.size(); ++i) {
      std::vector<int64_t> seq(prompt.begin(), prompt.end());
      seq.insert(seq.end(), prefixes[i].begin(), prefixes[i].end());
      KVCache cache = m.NewCache();
      at::Tensor logits = m.Forward({{&cache, seq, false}});
      std::vector<float> p;
      ProcessedDistribution(logits.data_ptr<float>(), V, sp, &p);
      for (int v = 0; v < V; ++v) {
        next.push_back(law[i] * p[v]);
        next_prefixes.push_back(prefixes[i]);
        next_prefixes.back().push_back(v);
      }
    }
    law = std::move(next);
    prefixes = std::move(next_prefixes);
  }
  return law;  // index = x1 * V^(len-1) + ... + x_len
}

}  // namespace spec_test
}  // namespace specloop
