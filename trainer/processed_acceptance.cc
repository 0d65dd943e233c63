#include "trainer/processed_acceptance.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace specloop {
namespace trainer {

const char* SamplingRegime(const SamplingParams& sampling) {
  return sampling.greedy() ? "greedy" : "sampled";
}

namespace {

// A log-prob with NaN read as no mass.
double LogProb(const LoggedTarget& t, int i) {
  const double lp = t.logprobs[i];
  return std::isnan(lp) ? -std::numeric_limits<double>::infinity() : lp;
}

// Bounds [*lo, *hi] of sum_j x_j^a over `count` tokens with 0 <= x_j <= cap whose sum s lies in
// [sum_lo, sum_hi] (sum_hi <= count * cap). The sum is increasing in s. For a >= 1 (convex) the
// most is as many tokens at the cap as s allows and the rest in one token, the least an even
// spread (Jensen); for a < 1 (concave) the reverse.
void PowerSumBounds(double count, double cap, double sum_lo, double sum_hi, double a, double* lo,
                    double* hi) {
  *lo = *hi = 0;
  if (count <= 0 || sum_hi <= 0) return;
  auto at_cap = [&](double s) {
    const double full = std::min(count, std::floor(s / cap));
    return full * std::pow(cap, a) + std::pow(std::max(0.0, s - full * cap), a);
  };
  auto spread = [&](double s) { return count * std::pow(s / count, a); };
  if (a >= 1) {
    *hi = at_cap(sum_hi);
    *lo = sum_lo > 0 ? spread(sum_lo) : 0;
  } else {
    *hi = spread(sum_hi);
    *lo = sum_lo > 0 ? at_cap(sum_lo) : 0;
  }
}

}  // namespace

void BoundProcessedTarget(const LoggedTarget& t, int vocab, const SamplingParams& s,
                          ProcessedTargetBounds* out) {
  const int K = t.k;
  out->lower.assign(K, 0.0);
  out->upper.assign(K, 0.0);
  out->tail_upper = 0;
  // The logged entries, most likely first, lower ids first on ties (as ByProbDesc orders).
  std::vector<int> order(K);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    const double la = LogProb(t, a), lb = LogProb(t, b);
    return la > lb || (la == lb && t.ids[a] < t.ids[b]);
  });
  const double lp_max = K > 0 ? LogProb(t, order[0]) : -std::numeric_limits<double>::infinity();
  const double tail = std::clamp(std::isnan(t.tail) ? 0.0 : t.tail, 0.0, 1.0);
  const double n = std::max(0, vocab - K);  // tail tokens
  // r: the tail's raw mass relative to the top logged token's.
  const double r = n > 0 ? tail / std::exp(lp_max) : 0;
  if (!std::isfinite(lp_max) || !std::isfinite(r)) {  // no logged mass: nothing is known
    out->upper.assign(K, 1.0);
    out->tail_upper = 1.0;
    return;
  }
  if (s.greedy()) {
    out->lower[order[0]] = out->upper[order[0]] = 1.0;
    return;
  }
  const double T = s.temperature;
  std::vector<double> w(K);  // by rank: weight relative to the top token's, at temperature T
  for (int j = 0; j < K; ++j) w[j] = std::exp((LogProb(t, order[j]) - lp_max) / T);

  // Top-k.
  const int c = (s.top_k > 0 && s.top_k < vocab) ? s.top_k : vocab;
  const int kept = std::min(K, c);                                  // logged entries kept
  const double n_kept = c > K ? std::min(n, static_cast<double>(c - K)) : 0;  // tail tokens kept
  // The kept tail tokens' weight: each has raw relative mass <= cap (consistent with the n of
  // them summing to r), and the c - K largest of the tail hold at least their share of it.
  const double cap = std::max(std::exp(LogProb(t, order[K - 1]) - lp_max), n > 0 ? r / n : 0.0);
  double tail_lo = 0, tail_hi = 0;
  if (n_kept > 0) {
    PowerSumBounds(n_kept, cap, r * n_kept / n, std::min(r, n_kept * cap), 1.0 / T, &tail_lo,
                   &tail_hi);
  }
  std::vector<double> cum(kept);
  double logged = 0;
  for (int j = 0; j < kept; ++j) cum[j] = logged += w[j];

  // Top-p: how many logged entries are kept for a tail weight W (kept + 1: the cut is in the
  // tail), and the kept weight then.
  int sure = kept, maybe = kept;  // kept for the least / the most tail weight
  double kept_hi = logged + tail_hi, kept_lo = logged + tail_lo;
  bool tail_maybe = n_kept > 0;
  if (s.top_p < 1.0f) {
    auto cut = [&](double W) {
      const double target = static_cast<double>(s.top_p) * (logged + W);
      for (int j = 0; j < kept; ++j) {
        if (cum[j] >= target) return j + 1;
      }
      return kept + 1;
    };
    const int at_lo = cut(tail_lo), at_hi = cut(tail_hi);
    sure = std::min(at_lo, kept);
    maybe = std::min(at_hi, kept);
    kept_hi = at_hi <= kept ? cum[at_hi - 1] : logged + tail_hi;
    kept_lo = at_lo <= kept ? cum[at_lo - 1]
                            : std::max(logged, static_cast<double>(s.top_p) * (logged + tail_lo));
    tail_maybe = tail_maybe && at_hi > kept;
  }
  double sum_lower = 0;
  for (int j = 0; j < sure; ++j) sum_lower += out->lower[order[j]] = w[j] / kept_hi;
  for (int j = 0; j < maybe; ++j) out->upper[order[j]] = std::min(1.0, w[j] / kept_lo);
  if (tail_maybe) {
    out->tail_upper = std::clamp(std::min(1.0 - sum_lower, tail_hi / kept_lo), 0.0, 1.0);
  }
}

namespace {

// The bounds of a sampled position from the draft's processed distribution q[0, vocab).
AcceptanceBounds FromProcessedDraft(const float* q, int vocab, const LoggedTarget& t,
                                    const SamplingParams& s) {
  AcceptanceBounds a;
  ProcessedTargetBounds p;
  BoundProcessedTarget(t, vocab, s, &p);
  double q_all = 0, q_logged = 0;
  for (int x = 0; x < vocab; ++x) q_all += q[x];
  for (int i = 0; i < t.k; ++i) {
    const double qi = q[t.ids[i]];
    q_logged += qi;
    a.lower += std::min(p.lower[i], qi);
    a.upper += std::min(p.upper[i], qi);
  }
  a.upper = std::min(1.0, a.upper + std::min(p.tail_upper, std::max(0.0, q_all - q_logged)));
  return a;
}

}  // namespace

namespace {

// Greedy: the bounds when the draft proposes target id `draft`.
AcceptanceBounds GreedyAcceptance(int draft, int vocab, const LoggedTarget& t,
                                  const SamplingParams& s) {
  AcceptanceBounds a;
  ProcessedTargetBounds p;
  BoundProcessedTarget(t, vocab, s, &p);
  for (int i = 0; i < t.k; ++i) {
    if (t.ids[i] == draft) {
      a.lower = p.lower[i];
      a.upper = p.upper[i];
      return a;
    }
  }
  // The draft's argmax is not logged; the target's is (tail_upper is 0 unless no logged entry
  // has any mass).
  a.upper = p.tail_upper;
  return a;
}

}  // namespace

AcceptanceBounds ProcessedAcceptance(const float* draft_logits, int vocab, const LoggedTarget& t,
                                     const SamplingParams& s, std::vector<float>* scratch) {
  if (!s.greedy()) {
    std::vector<float> local;
    std::vector<float>& q = scratch ? *scratch : local;
    ProcessedDistribution(draft_logits, vocab, s, &q);
    return FromProcessedDraft(q.data(), vocab, t, s);
  }
  return GreedyAcceptance(Argmax(draft_logits, vocab), vocab, t, s);
}

AcceptanceBounds ProcessedAcceptance(const float* draft_logits, int draft_vocab,
                                     const int* draft_to_target, int vocab,
                                     const LoggedTarget& t, const SamplingParams& s,
                                     std::vector<float>* scratch) {
  if (s.greedy()) {
    return GreedyAcceptance(draft_to_target[Argmax(draft_logits, draft_vocab)], vocab, t, s);
  }
  std::vector<float> local;
  std::vector<float>& qd = scratch ? *scratch : local;
  ProcessedDistribution(draft_logits, draft_vocab, s, &qd);
  std::vector<float> q(static_cast<size_t>(vocab), 0.0f);
  for (int d = 0; d < draft_vocab; ++d) q[draft_to_target[d]] = qd[d];
  return FromProcessedDraft(q.data(), vocab, t, s);
}

}  // namespace trainer
}  // namespace specloop
