#include "common/spec/greedy_multi_draft.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "common/spec/distribution.h"

namespace specloop {
namespace spec {

Status MakeGreedyDraftPlan(int n, int vocab, const float* draft_probs, GreedyDraftPlan* plan) {
  plan->top.clear();
  plan->last_probs.clear();
  if (vocab <= 0 || n < 1 || n > vocab) {
    return Status::InvalidArgument("need 1 <= n <= vocab, got n=" + std::to_string(n) +
                                   " vocab=" + std::to_string(vocab));
  }
  if (draft_probs == nullptr) return Status::InvalidArgument("null draft row");
  std::vector<double> q;
  if (NormalizedCopy(draft_probs, vocab, &q) <= 0.0) {
    return Status::InvalidArgument("draft row has no positive mass or a bad entry");
  }
  std::vector<int> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + (n - 1), ids.end(), [&q](int a, int b) {
    return q[a] > q[b] || (q[a] == q[b] && a < b);
  });
  plan->top.assign(ids.begin(), ids.begin() + (n - 1));
  for (int x : plan->top) q[x] = 0.0;
  if (Normalize(&q) <= 0.0) {
    // q has no mass outside the top: the last draft is uniform over the remaining tokens.
    const double w = 1.0 / (vocab - (n - 1));
    q.assign(vocab, w);
    for (int x : plan->top) q[x] = 0.0;
  }
  plan->last_probs = std::move(q);
  return Status::OK();
}

Status SampleGreedyDrafts(int n, int vocab, const float* draft_probs, Rng* rng,
                          std::vector<int>* drafts) {
  drafts->clear();
  if (rng == nullptr) return Status::InvalidArgument("null rng");
  GreedyDraftPlan plan;
  SPECLOOP_RETURN_IF_ERROR(MakeGreedyDraftPlan(n, vocab, draft_probs, &plan));
  *drafts = plan.top;
  drafts->push_back(SampleIndex(plan.last_probs.data(), vocab, rng));
  return Status::OK();
}

Status VerifyGreedyMultiDraft(int vocab, const std::vector<int>& drafts, const float* draft_probs,
                              const float* target_probs, Rng* rng, MultiDraftOutcome* out) {
  out->token = -1;
  out->accepted_index = -1;
  if (rng == nullptr || target_probs == nullptr) return Status::InvalidArgument("null input");
  const int n = static_cast<int>(drafts.size());
  GreedyDraftPlan plan;
  SPECLOOP_RETURN_IF_ERROR(MakeGreedyDraftPlan(n, vocab, draft_probs, &plan));
  if (!std::equal(plan.top.begin(), plan.top.end(), drafts.begin())) {
    return Status::InvalidArgument("the first n-1 drafts are not the top n-1 tokens of q");
  }
  const int last = drafts[n - 1];
  if (last < 0 || last >= vocab || std::find(plan.top.begin(), plan.top.end(), last) !=
                                        plan.top.end()) {
    return Status::InvalidArgument("last draft " + std::to_string(last) +
                                   " out of range or among the top n-1");
  }
  std::vector<double> p;
  if (NormalizedCopy(target_probs, vocab, &p) <= 0.0) {
    return Status::InvalidArgument("target row has no positive mass or a bad entry");
  }
  const std::vector<double>& q_last = plan.last_probs;
  const double u = rng->Uniform();
  int token;
  if (q_last[last] > 0.0 && u * q_last[last] < p[last]) {
    token = last;
  } else {
    std::vector<double> residual;
    const double mass = PositivePart(p.data(), q_last.data(), vocab, &residual);
    token = SampleIndex(mass > 0.0 ? residual.data() : p.data(), vocab, rng);
  }
  out->token = token;
  for (int j = 0; j < n; ++j) {
    if (drafts[j] == token) out->accepted_index = j;
  }
  return Status::OK();
}

double GreedyMultiDraftAcceptance(int n, int vocab, const float* draft_probs,
                                  const float* target_probs) {
  GreedyDraftPlan plan;
  std::vector<double> p;
  if (!MakeGreedyDraftPlan(n, vocab, draft_probs, &plan).ok() ||
      NormalizedCopy(target_probs, vocab, &p) <= 0.0) {
    return 0.0;
  }
  const std::vector<double>& q_last = plan.last_probs;
  // The last draft is accepted with probability sum_x q'(x) min(1, p(x)/q'(x)).
  const double accept_last = OverlapMass(p.data(), q_last.data(), vocab);
  // On rejection the residual norm(max(0, p - q')) lands in the top with this probability.
  std::vector<double> residual;
  const double mass = PositivePart(p.data(), q_last.data(), vocab, &residual);
  const std::vector<double>& from = mass > 0.0 ? residual : p;
  double from_total = 0.0, in_top = 0.0;
  for (int x = 0; x < vocab; ++x) from_total += from[x];
  for (int x : plan.top) in_top += from[x];
  return accept_last + (1.0 - accept_last) * (in_top / from_total);
}

}  // namespace spec
}  // namespace specloop
