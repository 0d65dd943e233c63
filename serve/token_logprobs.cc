#include "serve/token_logprobs.h"

#include <algorithm>
#include <cmath>

namespace specloop {

void ComputeTokenLogprob(const float* logits, int vocab, const SamplingParams& sampling,
                         int token, int top_n, std::vector<float>* scratch, TokenLogprob* out) {
  out->token = token;
  out->logprob = kLogprobFloor;
  out->top.clear();
  if (vocab <= 0) return;
  const float m = *std::max_element(logits, logits + vocab);
  // Candidates: every id (greedy) or the kept set of the processed distribution; their
  // log-probs are (l - m) * scale - lse.
  const bool greedy = sampling.greedy();
  const double scale = greedy ? 1.0 : 1.0 / static_cast<double>(sampling.temperature);
  if (!greedy) ProcessedDistribution(logits, vocab, sampling, scratch);
  const auto kept = [&](int i) { return greedy || (*scratch)[i] > 0.0f; };
  double sum = 0.0;
  for (int i = 0; i < vocab; ++i) {
    if (kept(i)) sum += std::exp((static_cast<double>(logits[i]) - m) * scale);
  }
  const double lse = std::log(sum);
  const auto logprob = [&](int i) { return (static_cast<double>(logits[i]) - m) * scale - lse; };
  if (token >= 0 && token < vocab && kept(token)) out->logprob = logprob(token);

  const int n = std::max(0, top_n);
  if (n == 0) return;
  std::vector<int> ids;
  ids.reserve(vocab);
  for (int i = 0; i < vocab; ++i) {
    if (kept(i)) ids.push_back(i);
  }
  // Larger logit first (the same order as the log-prob, whatever T); ties toward the lower id.
  const auto first = [logits](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  const size_t k = std::min<size_t>(n, ids.size());
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), first);
  for (size_t i = 0; i < k; ++i) out->top.push_back({ids[i], logprob(ids[i])});
}

}  // namespace specloop
