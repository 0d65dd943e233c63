#include "common/spec/optimal_acceptance.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <vector>

#include "common/spec/distribution.h"
#include "common/spec/greedy_multi_draft.h"

namespace specloop {
namespace spec {
namespace {

// Tokens with q > 0 sorted by q/p descending (p == 0 first), ties toward lower ids. Tokens with
// q == 0 are left out: adding one to H raises p(H) and leaves Q(all in H) unchanged.
std::vector<int> ByRatioDesc(const std::vector<double>& p, const std::vector<double>& q) {
  std::vector<int> ids;
  for (int x = 0; x < static_cast<int>(q.size()); ++x) {
    if (q[x] > 0.0) ids.push_back(x);
  }
  std::sort(ids.begin(), ids.end(), [&](int a, int b) {
    // q[a]/p[a] > q[b]/p[b], cross-multiplied so that p == 0 means +infinity.
    const double lhs = q[a] * p[b], rhs = q[b] * p[a];
    return lhs > rhs || (lhs == rhs && a < b);
  });
  return ids;
}

// 1 + min(0, min over prefixes H of order: p(H) - all_in(H)), where all_in(i) is called after
// the i-th token of `order` has been added (i = 1..size) and returns Q(all candidates in H).
double ScanPrefixes(const std::vector<double>& p, const std::vector<int>& order,
                    const std::function<double(int)>& all_in) {
  double best = 0.0, p_h = 0.0;
  for (size_t i = 0; i < order.size(); ++i) {
    p_h += p[order[i]];
    best = std::min(best, p_h - all_in(order[i]));
  }
  return std::max(0.0, std::min(1.0, 1.0 + best));
}

bool Load(int vocab, const float* target_probs, const float* draft_probs, std::vector<double>* p,
          std::vector<double>* q) {
  if (vocab <= 0 || target_probs == nullptr || draft_probs == nullptr) return false;
  return NormalizedCopy(target_probs, vocab, p) > 0.0 &&
         NormalizedCopy(draft_probs, vocab, q) > 0.0;
}

// Sums, over the ordered tuples of `len` distinct tokens from h (plus `z`) that use z exactly
// once, the successive-sampling weight w = prod_i q(a_i) / (1 - s_{i-1}) (s = running q mass)
// times 1 / (1 - s) into *a and times s / (1 - s) into *b.
void AddTuplesWith(const std::vector<double>& q, const std::vector<int>& h, int z, int len,
                   std::vector<char>* used, bool z_used, double w, double s, double* a,
                   double* b) {
  if (len == 0) {
    if (!z_used) return;
    const double rest = 1.0 - s;
    if (rest > 0.0) {
      *a += w / rest;
      *b += w * s / rest;
    }
    return;
  }
  const double rest = 1.0 - s;
  if (!(rest > 0.0)) return;
  if (!z_used) {
    AddTuplesWith(q, h, z, len - 1, used, true, w * q[z] / rest, s + q[z], a, b);
  }
  // Tuples still needing z must leave room for it.
  if (!z_used && len == 1) return;
  for (int x : h) {
    if ((*used)[x]) continue;
    (*used)[x] = 1;
    AddTuplesWith(q, h, z, len - 1, used, z_used, w * q[x] / rest, s + q[x], a, b);
    (*used)[x] = 0;
  }
}

}  // namespace

double OptimalAcceptanceSingleDraft(int vocab, const float* target_probs,
                                    const float* draft_probs) {
  std::vector<double> p, q;
  if (!Load(vocab, target_probs, draft_probs, &p, &q)) return 0.0;
  return OverlapMass(p.data(), q.data(), vocab);
}

double OptimalAcceptanceGreedy(int n, int vocab, const float* target_probs,
                               const float* draft_probs) {
  std::vector<double> p, q;
  GreedyDraftPlan plan;
  if (!Load(vocab, target_probs, draft_probs, &p, &q) ||
      !MakeGreedyDraftPlan(n, vocab, draft_probs, &plan).ok()) {
    return 0.0;
  }
  // Q(all in H) = [top is inside H] * q'(H \ top). An H missing a top token scores p(H) >= 0,
  // no better than the empty set; so H = top + G with G a prefix of the other tokens sorted
  // by q'(x)/p(x), scored p(top) + p(G) - q'(G).
  double p_top = 0.0;
  for (int x : plan.top) p_top += p[x];
  const std::vector<int> order = ByRatioDesc(p, plan.last_probs);
  double q_g = 0.0;
  const double alpha_g = ScanPrefixes(p, order, [&](int x) {
    q_g += plan.last_probs[x];
    return q_g;
  });
  // ScanPrefixes gives 1 + min(0, min_G p(G) - q'(G)); the top adds p(top), capped at the
  // empty set's 1.
  return std::min(1.0, p_top + alpha_g);
}

double OptimalAcceptanceWithoutReplacement(int n, int vocab, const float* target_probs,
                                           const float* draft_probs) {
  std::vector<double> p, q;
  if (n < 1 || !Load(vocab, target_probs, draft_probs, &p, &q)) return 0.0;
  const std::vector<int> order = ByRatioDesc(p, q);
  const int m = std::min<int>(n, static_cast<int>(order.size()));  // drafts actually drawn
  // Q(all m in H) = sum over ordered (m-1)-tuples t in H of w(t) * (q(H) - s(t)) / (1 - s(t))
  //              = q(H) * A - B, with A and B kept incrementally as tokens join H.
  std::vector<int> h;
  std::vector<char> used(vocab, 0);
  double q_h = 0.0, a = 0.0, b = 0.0;
  return ScanPrefixes(p, order, [&](int z) {
    if (m > 1) AddTuplesWith(q, h, z, m - 1, &used, false, 1.0, 0.0, &a, &b);
    h.push_back(z);
    q_h += q[z];
    if (m == 1) return q_h;
    return std::min(1.0, std::max(0.0, q_h * a - b));
  });
}

double OptimalAcceptanceWithReplacement(int n, int vocab, const float* target_probs,
                                        const float* draft_probs) {
  std::vector<double> p, q;
  if (n < 1 || !Load(vocab, target_probs, draft_probs, &p, &q)) return 0.0;
  double q_h = 0.0;
  return ScanPrefixes(p, ByRatioDesc(p, q), [&](int x) {
    q_h += q[x];
    return std::pow(q_h, n);
  });
}

}  // namespace spec
}  // namespace specloop
