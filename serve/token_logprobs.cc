#include "serve/token_logprobs.h"

#include <algorithm>
#include <cmath>

#include "common/kernels/cpu_kernels.h"

namespace specloop {

void ComputeTokenLogprob(const float* logits, int vocab, const SamplingParams& sampling,
                         int token, int top_n, std::vector<float>* scratch, TokenLogprob* out) {
  out->token = token;
  out->logprob = kLogprobFloor;
  out->top.clear();
  if (vocab <= 0) return;
  // Greedy: every token, at l - logsumexp(l). Sampled: the processed distribution's kept set,
  // at the log of its probability.
  const bool greedy = sampling.greedy();
  double lse = 0;
  if (greedy) {
    float m = logits[0];
    for (int i = 1; i < vocab; ++i) m = logits[i] > m ? logits[i] : m;
    lse = m + std::log(SumExpBelow(logits, vocab, m));
  } else {
    ProcessedDistribution(logits, vocab, sampling, scratch);
  }
  const float* p = greedy ? nullptr : scratch->data();
  const auto kept = [&](int i) { return greedy || p[i] > 0.0f; };
  const auto logprob = [&](int i) {
    return greedy ? static_cast<double>(logits[i]) - lse : std::log(static_cast<double>(p[i]));
  };
  if (token >= 0 && token < vocab && kept(token)) out->logprob = logprob(token);

  // The top_n best kept tokens in one pass: larger logit first (the log-prob's order whatever
  // T), ties toward the lower id.
  const size_t n = static_cast<size_t>(std::max(0, top_n));
  if (n == 0) return;
  std::vector<int> best;  // sorted, best first
  best.reserve(n + 1);
  const auto before = [logits](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  for (int i = 0; i < vocab; ++i) {
    if (!kept(i) || (best.size() == n && !before(i, best.back()))) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), i, before), i);
    if (best.size() > n) best.pop_back();
  }
  for (int id : best) out->top.push_back({id, logprob(id)});
}

}  // namespace specloop
