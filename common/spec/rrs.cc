#include "common/spec/rrs.h"

#include <algorithm>
#include <string>

#include "common/spec/distribution.h"

namespace specloop {
namespace spec {
namespace {

// r <- norm(max(0, r - q)), unless that has no mass (then r is kept).
void UpdateResidual(const std::vector<double>& q, std::vector<double>* r) {
  std::vector<double> next;
  const double mass = PositivePart(r->data(), q.data(), static_cast<int>(r->size()), &next);
  if (mass > 0.0) {
    for (double& v : next) v /= mass;
    r->swap(next);
  }
}

// Acceptance from state (r, q) with `left` candidates still to draw.
double AcceptanceFrom(const std::vector<double>& r, const std::vector<double>& q, int left) {
  if (left == 0) return 0.0;
  std::vector<double> r_next = r;
  UpdateResidual(q, &r_next);
  double total = 0.0;
  for (size_t x = 0; x < q.size(); ++x) {
    if (!(q[x] > 0.0)) continue;
    const double accept = std::min(1.0, r[x] / q[x]);
    double after = 0.0;
    if (accept < 1.0) {
      std::vector<double> q_next = q;
      q_next[x] = 0.0;
      if (Normalize(&q_next) > 0.0) after = AcceptanceFrom(r_next, q_next, left - 1);
    }
    total += q[x] * (accept + (1.0 - accept) * after);
  }
  return total;
}

}  // namespace

Status SampleWithoutReplacement(int n, int vocab, const float* draft_probs, Rng* rng,
                                std::vector<int>* drafts) {
  drafts->clear();
  if (n < 1) return Status::InvalidArgument("n must be >= 1, got " + std::to_string(n));
  if (vocab <= 0 || draft_probs == nullptr || rng == nullptr) {
    return Status::InvalidArgument("bad vocab or null input");
  }
  std::vector<double> q;
  if (NormalizedCopy(draft_probs, vocab, &q) <= 0.0) {
    return Status::InvalidArgument("draft row has no positive mass or a bad entry");
  }
  for (int j = 0; j < n; ++j) {
    const int x = SampleIndex(q.data(), vocab, rng);
    drafts->push_back(x);
    q[x] = 0.0;
    if (Normalize(&q) <= 0.0) break;  // support exhausted
  }
  return Status::OK();
}

Status VerifyRecursiveRejection(int vocab, const std::vector<int>& drafts,
                                const float* draft_probs, const float* target_probs, Rng* rng,
                                MultiDraftOutcome* out) {
  out->token = -1;
  out->accepted_index = -1;
  if (vocab <= 0 || draft_probs == nullptr || target_probs == nullptr || rng == nullptr) {
    return Status::InvalidArgument("bad vocab or null input");
  }
  std::vector<double> r, q;
  if (NormalizedCopy(target_probs, vocab, &r) <= 0.0 ||
      NormalizedCopy(draft_probs, vocab, &q) <= 0.0) {
    return Status::InvalidArgument("row with no positive mass or a bad entry");
  }
  std::vector<bool> seen(vocab, false);
  for (int x : drafts) {
    if (x < 0 || x >= vocab) {
      return Status::InvalidArgument("draft " + std::to_string(x) + " outside vocab");
    }
    if (seen[x]) return Status::InvalidArgument("repeated draft " + std::to_string(x));
    seen[x] = true;
  }
  for (size_t j = 0; j < drafts.size(); ++j) {
    const int x = drafts[j];
    const double u = rng->Uniform();
    if (q[x] > 0.0 && u * q[x] < r[x]) {
      out->token = x;
      out->accepted_index = static_cast<int>(j);
      return Status::OK();
    }
    UpdateResidual(q, &r);
    q[x] = 0.0;
    Normalize(&q);  // no mass left: later candidates are rejected and r stays
  }
  out->token = SampleIndex(r.data(), vocab, rng);
  return Status::OK();
}

double RecursiveRejectionAcceptance(int n, int vocab, const float* draft_probs,
                                    const float* target_probs) {
  std::vector<double> r, q;
  if (NormalizedCopy(target_probs, vocab, &r) <= 0.0 ||
      NormalizedCopy(draft_probs, vocab, &q) <= 0.0) {
    return 0.0;
  }
  return AcceptanceFrom(r, q, n);
}

}  // namespace spec
}  // namespace specloop
