#include "common/spec/chain_verify.h"

#include <string>

#include "common/base/sampling.h"
#include "common/spec/distribution.h"

namespace specloop {
namespace spec {
namespace {

Status CheckShape(int k, int vocab, const int* draft_tokens, const void* target) {
  if (k < 0) return Status::InvalidArgument("k must be >= 0, got " + std::to_string(k));
  if (vocab <= 0) return Status::InvalidArgument("vocab must be > 0");
  if (target == nullptr || (k > 0 && draft_tokens == nullptr)) {
    return Status::InvalidArgument("null input array");
  }
  for (int i = 0; i < k; ++i) {
    if (draft_tokens[i] < 0 || draft_tokens[i] >= vocab) {
      return Status::InvalidArgument("draft token " + std::to_string(draft_tokens[i]) +
                                     " at position " + std::to_string(i) + " outside vocab " +
                                     std::to_string(vocab));
    }
  }
  return Status::OK();
}

Status BadRow(const char* what, int i) {
  return Status::InvalidArgument(std::string(what) + " row " + std::to_string(i) +
                                 " has no positive mass or a negative/non-finite entry");
}

}  // namespace

Status VerifyChain(int k, int vocab, const int* draft_tokens, const float* draft_probs,
                   const float* target_probs, Rng* rng, ChainOutcome* out) {
  out->num_accepted = 0;
  out->tokens.clear();
  SPECLOOP_RETURN_IF_ERROR(CheckShape(k, vocab, draft_tokens, target_probs));
  if ((k > 0 && draft_probs == nullptr) || rng == nullptr) {
    return Status::InvalidArgument("null input array");
  }
  std::vector<double> p, q, residual;
  std::vector<int> tokens;
  for (int i = 0; i < k; ++i) {
    if (NormalizedCopy(target_probs + static_cast<size_t>(i) * vocab, vocab, &p) <= 0.0) {
      return BadRow("target", i);
    }
    if (NormalizedCopy(draft_probs + static_cast<size_t>(i) * vocab, vocab, &q) <= 0.0) {
      return BadRow("draft", i);
    }
    const int x = draft_tokens[i];
    const double u = rng->Uniform();
    if (q[x] > 0.0 && u * q[x] < p[x]) {
      tokens.push_back(x);
      continue;
    }
    // Rejected: the recovered token comes from norm(max(0, p - q)).
    const double mass = PositivePart(p.data(), q.data(), vocab, &residual);
    const std::vector<double>& from = mass > 0.0 ? residual : p;
    const int recovered = SampleIndex(from.data(), vocab, rng);
    out->num_accepted = i;
    out->tokens = std::move(tokens);
    out->tokens.push_back(recovered);
    return Status::OK();
  }
  if (NormalizedCopy(target_probs + static_cast<size_t>(k) * vocab, vocab, &p) <= 0.0) {
    return BadRow("target", k);
  }
  tokens.push_back(SampleIndex(p.data(), vocab, rng));
  out->num_accepted = k;
  out->tokens = std::move(tokens);
  return Status::OK();
}

Status VerifyChainGreedy(int k, int vocab, const int* draft_tokens, const float* target_scores,
                         ChainOutcome* out) {
  out->num_accepted = 0;
  out->tokens.clear();
  SPECLOOP_RETURN_IF_ERROR(CheckShape(k, vocab, draft_tokens, target_scores));
  for (int i = 0; i <= k; ++i) {
    const int best = Argmax(target_scores + static_cast<size_t>(i) * vocab, vocab);
    out->tokens.push_back(best);
    if (i == k || draft_tokens[i] != best) {
      out->num_accepted = i;
      return Status::OK();
    }
  }
  return Status::OK();  // not reached
}

}  // namespace spec
}  // namespace specloop
