#include "trainer/distill_loss.h"

#include <gtest/gtest.h>

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace specloop {
namespace trainer {
namespace {

using Vec = std::vector<double>;

const ObjectiveSpec kFkl{Objective::kForwardKl};
const ObjectiveSpec kRkl{Objective::kReverseKl};
const ObjectiveSpec kJsd{Objective::kJsd, 0.5};
const ObjectiveSpec kJsd3{Objective::kJsd, 0.3};
const ObjectiveSpec kTvd{Objective::kTvd};
const std::vector<ObjectiveSpec> kAll = {kFkl, kRkl, kJsd, kJsd3, kTvd};

// ---- Reference formulas on explicit probability vectors, in plain doubles. ----

Vec Softmax(const Vec& x) {
  const double m = *std::max_element(x.begin(), x.end());
  Vec e(x.size());
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += (e[i] = std::exp(x[i] - m));
  for (double& v : e) v /= s;
  return e;
}

double Kl(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] > 0) s += a[i] * std::log(a[i] / b[i]);
  }
  return s;
}

double Rkl(const Vec& p, const Vec& q) {
  double s = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    s += q[i] * (std::log(q[i]) - std::log(std::max(p[i], kMinTargetProb)));
  }
  return s;
}

double Jsd(const Vec& p, const Vec& q, double beta) {
  Vec m(p.size());
  for (size_t i = 0; i < p.size(); ++i) m[i] = beta * p[i] + (1 - beta) * q[i];
  return beta * Kl(p, m) + (1 - beta) * Kl(q, m);
}

double Tvd(const Vec& p, const Vec& q) {
  double s = 0;
  for (size_t i = 0; i < p.size(); ++i) s += std::abs(p[i] - q[i]);
  return 0.5 * s;
}

double SumMin(const Vec& p, const Vec& q) {
  double s = 0;
  for (size_t i = 0; i < p.size(); ++i) s += std::min(p[i], q[i]);
  return s;
}

double Reference(const ObjectiveSpec& spec, const Vec& p, const Vec& q) {
  switch (spec.kind) {
    case Objective::kForwardKl: return Kl(p, q);
    case Objective::kReverseKl: return Rkl(p, q);
    case Objective::kJsd: return Jsd(p, q, spec.beta);
    case Objective::kTvd: return Tvd(p, q);
  }
  return NAN;
}

// Buckets (ids..., tail) of a full distribution; the tail is dropped when ids cover everything.
Vec Coarsen(const Vec& full, const std::vector<int64_t>& ids) {
  Vec out;
  double tail = 0;
  std::vector<bool> logged(full.size(), false);
  for (int64_t id : ids) {
    out.push_back(full[id]);
    logged[id] = true;
  }
  for (size_t i = 0; i < full.size(); ++i) {
    if (!logged[i]) tail += full[i];
  }
  if (ids.size() < full.size()) out.push_back(tail);
  return out;
}

// ---- Building the tensors the buffer would hand the trainer. ----

struct Target {
  at::Tensor ids;       // [N, K] int64
  at::Tensor logprobs;  // [N, K]
  at::Tensor tail;      // [N]
};

// One row per entry of `p`, logging ids[n]; tail = sum of the unlogged masses.
Target MakeTarget(const std::vector<Vec>& p, const std::vector<std::vector<int64_t>>& ids,
                  at::ScalarType dtype) {
  const int64_t n = static_cast<int64_t>(p.size());
  const int64_t k = static_cast<int64_t>(ids[0].size());
  Target t;
  t.ids = at::empty({n, k}, at::kLong);
  t.logprobs = at::empty({n, k}, at::kDouble);
  t.tail = at::empty({n}, at::kDouble);
  for (int64_t r = 0; r < n; ++r) {
    const Vec buckets = Coarsen(p[r], ids[r]);
    for (int64_t j = 0; j < k; ++j) {
      t.ids[r][j] = ids[r][j];
      t.logprobs[r][j] = std::log(p[r][ids[r][j]]);
    }
    t.tail[r] = static_cast<int64_t>(buckets.size()) > k ? buckets[k] : 0.0;
  }
  t.logprobs = t.logprobs.to(dtype);
  t.tail = t.tail.to(dtype);
  return t;
}

at::Tensor Rows(const std::vector<Vec>& rows, at::ScalarType dtype) {
  const int64_t n = static_cast<int64_t>(rows.size());
  const int64_t v = static_cast<int64_t>(rows[0].size());
  at::Tensor t = at::empty({n, v}, at::kDouble);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t j = 0; j < v; ++j) t[r][j] = rows[r][j];
  }
  return t.to(dtype);
}

Vec RandomLogits(std::mt19937_64* rng, int v, double scale) {
  std::normal_distribution<double> normal(0.0, scale);
  Vec x(v);
  for (double& e : x) e = normal(*rng);
  return x;
}

std::vector<int64_t> RandomIds(std::mt19937_64* rng, int v, int k) {
  std::vector<int64_t> perm(v);
  for (int i = 0; i < v; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), *rng);
  perm.resize(k);
  return perm;
}

bool AllFinite(const at::Tensor& t) { return at::isfinite(t).all().item<bool>(); }

// ---- Closed forms by hand. ----

TEST(DistillLoss, ClosedFormsSmallExample) {
  // V = 5; the target logs ids {3, 0} (K = 2): buckets (p3, p0, tail).
  const Vec logits = {1.0, 0.5, -0.3, 2.0, 0.0};
  const Vec p = {0.4, 0.1, 0.05, 0.3, 0.15};
  const Vec q = Softmax(logits);
  const std::vector<int64_t> ids = {3, 0};
  const Vec pb = {0.3, 0.4, 0.3};
  const Vec qb = {q[3], q[0], q[1] + q[2] + q[4]};
  // Hand-expanded closed forms on the three buckets.
  double fkl = 0, rkl = 0, tvd = 0, alpha = 0, jsd = 0;
  const double beta = 0.3;
  for (int b = 0; b < 3; ++b) {
    fkl += pb[b] * std::log(pb[b] / qb[b]);
    rkl += qb[b] * std::log(qb[b] / pb[b]);
    tvd += 0.5 * std::abs(pb[b] - qb[b]);
    alpha += std::min(pb[b], qb[b]);
    const double m = beta * pb[b] + (1 - beta) * qb[b];
    jsd += beta * pb[b] * std::log(pb[b] / m) + (1 - beta) * qb[b] * std::log(qb[b] / m);
  }
  for (at::ScalarType dtype : {at::kDouble, at::kFloat}) {
    const double tol = dtype == at::kDouble ? 1e-12 : 1e-6;
    const Target t = MakeTarget({p}, {ids}, dtype);
    const at::Tensor x = Rows({logits}, dtype);
    auto loss = [&](const ObjectiveSpec& s) {
      return DistillLossPerPosition(s, x, t.ids, t.logprobs, t.tail)[0].item<double>();
    };
    EXPECT_NEAR(loss(kFkl), fkl, tol);
    EXPECT_NEAR(loss(kRkl), rkl, tol);
    EXPECT_NEAR(loss(ObjectiveSpec{Objective::kJsd, beta}), jsd, tol);
    EXPECT_NEAR(loss(kTvd), tvd, tol);
    EXPECT_NEAR(CoarsenedAcceptance(x, t.ids, t.logprobs, t.tail)[0].item<double>(), alpha, tol);
    EXPECT_NEAR(LoggedAcceptance(x, t.ids, t.logprobs, t.tail)[0].item<double>(),
                std::min(pb[0], qb[0]) + std::min(pb[1], qb[1]), tol);
  }
}

TEST(DistillLoss, ClosedFormsFullVocabulary) {
  // K = V = 5 in a shuffled order: no tail bucket, the loss is the full-vocabulary loss. The
  // logged tail (garbage here) is ignored.
  const Vec logits = {1.0, 0.5, -0.3, 2.0, 0.0};
  const Vec p = {0.4, 0.1, 0.05, 0.3, 0.15};
  const Vec q = Softmax(logits);
  Target t = MakeTarget({p}, {{4, 1, 3, 0, 2}}, at::kDouble);
  t.tail.fill_(0.25);
  const at::Tensor x = Rows({logits}, at::kDouble);
  double fkl = 0, rkl = 0, tvd = 0, alpha = 0;
  for (int i = 0; i < 5; ++i) {
    fkl += p[i] * std::log(p[i] / q[i]);
    rkl += q[i] * std::log(q[i] / p[i]);
    tvd += 0.5 * std::abs(p[i] - q[i]);
    alpha += std::min(p[i], q[i]);
  }
  auto loss = [&](const ObjectiveSpec& s) {
    return DistillLossPerPosition(s, x, t.ids, t.logprobs, t.tail)[0].item<double>();
  };
  EXPECT_NEAR(loss(kFkl), fkl, 1e-12);
  EXPECT_NEAR(loss(kRkl), rkl, 1e-12);
  EXPECT_NEAR(loss(kJsd), Jsd(p, q, 0.5), 1e-12);
  EXPECT_NEAR(loss(kTvd), tvd, 1e-12);
  EXPECT_NEAR(CoarsenedAcceptance(x, t.ids, t.logprobs, t.tail)[0].item<double>(), alpha, 1e-12);
  EXPECT_NEAR(LoggedAcceptance(x, t.ids, t.logprobs, t.tail)[0].item<double>(), alpha, 1e-12);
}

TEST(DistillLoss, JsdConvention) {
  // Identical distributions: every loss is 0. Disjoint supports: JSD_0.5 = log 2 and, in
  // general, JSD_beta = -beta log beta - (1 - beta) log(1 - beta) (the entropy of beta).
  const Vec logits = {3.0, -1.0, 0.5, 0.0};
  const Vec q = Softmax(logits);
  const at::Tensor x = Rows({logits}, at::kDouble);
  const Target same = MakeTarget({q}, {{0, 2}}, at::kDouble);
  for (const ObjectiveSpec& s : kAll) {
    EXPECT_NEAR(DistillLossPerPosition(s, x, same.ids, same.logprobs, same.tail)[0].item<double>(),
                0.0, 1e-12)
        << s.ToString();
  }
  // Draft mass entirely on id 0 (logit 0 vs -800: the rest underflows), target on id 1.
  const at::Tensor peaked = Rows({{0.0, -800.0, -800.0, -800.0}}, at::kDouble);
  const Target other = MakeTarget({{0.0, 1.0, 0.0, 0.0}}, {{0, 1}}, at::kDouble);
  for (double beta : {0.5, 0.2, 0.9}) {
    const double expected = -beta * std::log(beta) - (1 - beta) * std::log(1 - beta);
    const double got = DistillLossPerPosition(ObjectiveSpec{Objective::kJsd, beta}, peaked,
                                              other.ids, other.logprobs, other.tail)[0]
                           .item<double>();
    EXPECT_NEAR(got, expected, 1e-9) << beta;
  }
}

// ---- K = V and coarsening on random cases. ----

TEST(DistillLoss, FullVocabularyEqualsExactLossOnRandomCases) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    const int v = 3 + trial % 9;
    const Vec logits = RandomLogits(&rng, v, 2.0);
    const Vec p = Softmax(RandomLogits(&rng, v, 2.0));
    const Vec q = Softmax(logits);
    const Target t = MakeTarget({p}, {RandomIds(&rng, v, v)}, at::kDouble);
    const at::Tensor x = Rows({logits}, at::kDouble);
    for (const ObjectiveSpec& s : kAll) {
      EXPECT_NEAR(DistillLossPerPosition(s, x, t.ids, t.logprobs, t.tail)[0].item<double>(),
                  Reference(s, p, q), 1e-10)
          << s.ToString() << " trial " << trial;
    }
    EXPECT_NEAR(CoarsenedAcceptance(x, t.ids, t.logprobs, t.tail)[0].item<double>(),
                SumMin(p, q), 1e-12);
  }
}

TEST(DistillLoss, CoarsenedLossIsTheLossOfTheBucketsAndNeverExceedsTheFullLoss) {
  // Merging tokens cannot increase an f-divergence (data processing), so for K < V the
  // coarsened loss is at most the full-vocabulary one.
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 30; ++trial) {
    const int v = 4 + trial % 8;
    const int k = 1 + trial % (v - 1);
    const Vec logits = RandomLogits(&rng, v, 2.0);
    const Vec p = Softmax(RandomLogits(&rng, v, 2.0));
    const Vec q = Softmax(logits);
    const std::vector<int64_t> ids = RandomIds(&rng, v, k);
    const Target t = MakeTarget({p}, {ids}, at::kDouble);
    const at::Tensor x = Rows({logits}, at::kDouble);
    const Vec pb = Coarsen(p, ids);
    const Vec qb = Coarsen(q, ids);
    for (const ObjectiveSpec& s : kAll) {
      const double got =
          DistillLossPerPosition(s, x, t.ids, t.logprobs, t.tail)[0].item<double>();
      EXPECT_NEAR(got, Reference(s, pb, qb), 1e-10) << s.ToString() << " trial " << trial;
      EXPECT_LE(got, Reference(s, p, q) + 1e-12) << s.ToString() << " trial " << trial;
    }
  }
}

// ---- Acceptance estimates. ----

TEST(Acceptance, BracketsTheTrueOverlapOnRandomCases) {
  // Logged (K buckets) <= sum_x min(p, q) <= Coarsened (K + 1 buckets).
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 50; ++trial) {
    const int v = 4 + trial % 10;
    const int k = 1 + trial % (v - 1);
    std::vector<Vec> logits, p;
    std::vector<std::vector<int64_t>> ids;
    for (int r = 0; r < 3; ++r) {
      logits.push_back(RandomLogits(&rng, v, 1.5));
      p.push_back(Softmax(RandomLogits(&rng, v, 1.5)));
      ids.push_back(RandomIds(&rng, v, k));
    }
    const Target t = MakeTarget(p, ids, at::kDouble);
    const at::Tensor x = Rows(logits, at::kDouble);
    const at::Tensor upper = CoarsenedAcceptance(x, t.ids, t.logprobs, t.tail);
    const at::Tensor lower = LoggedAcceptance(x, t.ids, t.logprobs, t.tail);
    ASSERT_EQ(upper.sizes(), at::IntArrayRef({3}));
    for (int r = 0; r < 3; ++r) {
      const double truth = SumMin(p[r], Softmax(logits[r]));
      EXPECT_LE(lower[r].item<double>(), truth + 1e-12);
      EXPECT_GE(upper[r].item<double>(), truth - 1e-12);
      const double tail_gap =
          std::min(Coarsen(p[r], ids[r]).back(), Coarsen(Softmax(logits[r]), ids[r]).back());
      EXPECT_NEAR(upper[r].item<double>() - lower[r].item<double>(), tail_gap, 1e-12);
    }
  }
}

TEST(Acceptance, CoarseningCanOverstateTheOverlap) {
  // p and q agree on the logged id 0 and put their remaining halves on different tokens of the
  // tail: the true overlap is 0.5 but the tail buckets (0.5 each) coincide.
  const at::Tensor x = Rows({{0.0, -40.0, 0.0, -40.0}}, at::kDouble);
  const Target t = MakeTarget({{0.5, 0.5, 0.0, 0.0}}, {{0}}, at::kDouble);
  EXPECT_NEAR(CoarsenedAcceptance(x, t.ids, t.logprobs, t.tail)[0].item<double>(), 1.0, 1e-9);
  EXPECT_NEAR(LoggedAcceptance(x, t.ids, t.logprobs, t.tail)[0].item<double>(), 0.5, 1e-9);
}

TEST(Acceptance, CarriesNoGradient) {
  const at::Tensor x = at::randn({2, 6}, at::kDouble).requires_grad_(true);
  const Target t = MakeTarget({Softmax({1, 2, 3, 4, 5, 6}), Softmax({6, 5, 4, 3, 2, 1})},
                              {{0, 1}, {2, 3}}, at::kFloat);
  EXPECT_FALSE(CoarsenedAcceptance(x, t.ids, t.logprobs, t.tail).requires_grad());
  EXPECT_FALSE(LoggedAcceptance(x, t.ids, t.logprobs, t.tail).requires_grad());
}

// ---- Gradients. ----

TEST(DistillLoss, GradientMatchesCentralDifferences) {
  std::mt19937_64 rng(5);
  const int n = 3, v = 7, k = 3;
  std::vector<Vec> logits, p;
  std::vector<std::vector<int64_t>> ids;
  for (int r = 0; r < n; ++r) {
    logits.push_back(RandomLogits(&rng, v, 1.5));
    p.push_back(Softmax(RandomLogits(&rng, v, 1.5)));
    ids.push_back(RandomIds(&rng, v, k));
  }
  // The last row's target gives one logged id zero mass (log-prob -inf).
  p[n - 1][ids[n - 1][0]] = 0.0;
  double s = 0;
  for (double e : p[n - 1]) s += e;
  for (double& e : p[n - 1]) e /= s;
  const Target t = MakeTarget(p, ids, at::kDouble);
  const at::Tensor w = at::tensor({1.0, 0.5, 2.0}, at::kDouble);
  const at::Tensor x0 = Rows(logits, at::kDouble);
  for (const ObjectiveSpec& spec : kAll) {
    const at::Tensor x = x0.clone().requires_grad_(true);
    DistillLoss(spec, x, t.ids, t.logprobs, t.tail, w).backward();
    const at::Tensor grad = x.grad();
    ASSERT_TRUE(grad.defined());
    const double h = 1e-6;
    for (int r = 0; r < n; ++r) {
      for (int j = 0; j < v; ++j) {
        at::Tensor plus = x0.clone(), minus = x0.clone();
        plus[r][j] += h;
        minus[r][j] -= h;
        const double fd = (DistillLoss(spec, plus, t.ids, t.logprobs, t.tail, w).item<double>() -
                           DistillLoss(spec, minus, t.ids, t.logprobs, t.tail, w).item<double>()) /
                          (2 * h);
        EXPECT_NEAR(grad[r][j].item<double>(), fd, 1e-7)
            << spec.ToString() << " at [" << r << "][" << j << "]";
      }
    }
  }
}

TEST(DistillLoss, GradientOfForwardKlIsQMinusPOnTheBuckets) {
  // d fkl / d x_j = q_j - p_bucket(j) * q_j / q_bucket(j): for a logged id, q_j - p_j.
  const Vec logits = {0.3, -0.2, 1.1, 0.0, 0.7};
  const Vec p = {0.1, 0.2, 0.3, 0.25, 0.15};
  const Vec q = Softmax(logits);
  const Target t = MakeTarget({p}, {{2, 0}}, at::kDouble);
  const at::Tensor x = Rows({logits}, at::kDouble).requires_grad_(true);
  DistillLoss(kFkl, x, t.ids, t.logprobs, t.tail, at::Tensor()).backward();
  const double q_tail = q[1] + q[3] + q[4];
  const double p_tail = p[1] + p[3] + p[4];
  EXPECT_NEAR(x.grad()[0][2].item<double>(), q[2] - p[2], 1e-12);
  EXPECT_NEAR(x.grad()[0][0].item<double>(), q[0] - p[0], 1e-12);
  for (int j : {1, 3, 4}) {
    EXPECT_NEAR(x.grad()[0][j].item<double>(), q[j] - p_tail * q[j] / q_tail, 1e-12);
  }
}

// ---- Numerical edge cases. ----

TEST(DistillLoss, ZeroMassBucketsAndTinyTailsStayFinite) {
  const double inf = std::numeric_limits<double>::infinity();
  for (at::ScalarType dtype : {at::kFloat, at::kDouble}) {
    // Row 0: a logged bucket with log-prob -inf. Row 1: zero tail mass with K < V. Row 2: tail
    // of 1e-30. Row 3: the draft's tail underflows (logits -200 below) while the target's is
    // 0.2. Row 4: the draft puts nearly all mass on one unlogged token.
    const at::Tensor logprobs =
        at::tensor({-inf, std::log(0.5), std::log(0.6), std::log(0.4), std::log(0.5),
                    std::log(0.5 - 1e-30), std::log(0.5), std::log(0.3), std::log(0.9),
                    std::log(0.05)},
                   at::kDouble)
            .view({5, 2})
            .to(dtype);
    const at::Tensor tail = at::tensor({0.5, 0.0, 1e-30, 0.2, 0.05}, at::kDouble).to(dtype);
    const at::Tensor ids = at::tensor({0, 1, 0, 1, 0, 1, 0, 1, 0, 1}, at::kLong).view({5, 2});
    const at::Tensor x0 = at::tensor({2.0, -1.0, 0.5, 0.0,  //
                                      1.0, 1.0, 0.0, -3.0,  //
                                      0.0, 0.0, 0.0, 0.0,   //
                                      0.0, 0.0, -200.0, -200.0,  //
                                      0.0, 0.0, 50.0, 0.0},
                                     at::kDouble)
                             .view({5, 4})
                             .to(dtype);
    for (const ObjectiveSpec& spec : kAll) {
      const at::Tensor x = x0.clone().requires_grad_(true);
      const at::Tensor per = DistillLossPerPosition(spec, x, ids, logprobs, tail);
      EXPECT_TRUE(AllFinite(per)) << spec.ToString() << " " << per;
      DistillLoss(spec, x, ids, logprobs, tail, at::Tensor()).backward();
      EXPECT_TRUE(AllFinite(x.grad())) << spec.ToString() << " " << x.grad();
    }
    EXPECT_TRUE(AllFinite(CoarsenedAcceptance(x0, ids, logprobs, tail)));
  }
}

TEST(DistillLoss, UnderflowedDraftTailKeepsItsExactLog) {
  // The draft's tail (two logits at -200) is e^-200 * 2 / (1 + 1): far below float32's range,
  // yet forward KL charges the target's 0.2 tail exactly 0.2 * (log 0.2 - log q_tail).
  const at::Tensor x = at::tensor({0.0, 0.0, -200.0, -200.0}, at::kFloat).view({1, 4});
  const at::Tensor ids = at::tensor({0, 1}, at::kLong).view({1, 2});
  const at::Tensor logprobs = at::tensor({std::log(0.4f), std::log(0.4f)}).view({1, 2});
  const at::Tensor tail = at::tensor({0.2f});
  const double log_q_tail = -200.0;  // log(2 e^-200 / 2)
  const double expected =
      2 * 0.4 * std::log(0.4 / 0.5) + 0.2 * (std::log(0.2) - log_q_tail);
  EXPECT_NEAR(DistillLossPerPosition(kFkl, x, ids, logprobs, tail)[0].item<double>(), expected,
              1e-4);
}

TEST(DistillLoss, ReverseKlFloorsZeroTargetMass) {
  // A logged bucket with zero target mass costs q (log q - log kMinTargetProb) in reverse KL.
  const Vec logits = {0.0, 1.0, -1.0};
  const Vec q = Softmax(logits);
  const at::Tensor x = Rows({logits}, at::kDouble);
  const Target t = MakeTarget({{0.0, 0.7, 0.3}}, {{0, 1}}, at::kDouble);
  const double expected = q[0] * (std::log(q[0]) - std::log(kMinTargetProb)) +
                          q[1] * std::log(q[1] / 0.7) + q[2] * std::log(q[2] / 0.3);
  EXPECT_NEAR(DistillLossPerPosition(kRkl, x, t.ids, t.logprobs, t.tail)[0].item<double>(),
              expected, 1e-12);
}

TEST(DistillLoss, TargetIsRenormalizedAndAcceptsHalfPrecision) {
  // Masses off by 1% (or fp16-rounded) give the loss of the normalized target.
  const Vec logits = {0.2, -0.4, 1.0, 0.3, -1.0, 0.0};
  const Vec p = Softmax({1.0, 0.0, 0.5, -0.5, 0.2, -2.0});
  const Target t = MakeTarget({p}, {{2, 0, 4}}, at::kDouble);
  const at::Tensor x = Rows({logits}, at::kDouble);
  for (const ObjectiveSpec& s : kAll) {
    const double exact = DistillLossPerPosition(s, x, t.ids, t.logprobs, t.tail)[0].item<double>();
    const double scaled = DistillLossPerPosition(s, x, t.ids, t.logprobs + std::log(1.01),
                                                 t.tail * 1.01)[0]
                              .item<double>();
    EXPECT_NEAR(scaled, exact, 1e-12) << s.ToString();
    const double half = DistillLossPerPosition(s, x, t.ids, t.logprobs.to(at::kHalf),
                                               t.tail.to(at::kFloat))[0]
                            .item<double>();
    EXPECT_NEAR(half, exact, 5e-3) << s.ToString();
  }
}

// ---- Weights and reduction. ----

TEST(DistillLoss, WeightedMeanOverPositions) {
  std::mt19937_64 rng(13);
  const int n = 4, v = 6;
  std::vector<Vec> logits, p;
  std::vector<std::vector<int64_t>> ids;
  for (int r = 0; r < n; ++r) {
    logits.push_back(RandomLogits(&rng, v, 1.0));
    p.push_back(Softmax(RandomLogits(&rng, v, 1.0)));
    ids.push_back(RandomIds(&rng, v, 2));
  }
  Target t = MakeTarget(p, ids, at::kDouble);
  const at::Tensor x = Rows(logits, at::kDouble);
  for (const ObjectiveSpec& s : kAll) {
    const at::Tensor per = DistillLossPerPosition(s, x, t.ids, t.logprobs, t.tail);
    EXPECT_NEAR(DistillLoss(s, x, t.ids, t.logprobs, t.tail, at::Tensor()).item<double>(),
                per.mean().item<double>(), 1e-12);
    const at::Tensor w = at::tensor({2.0, 0.0, 1.0, 0.5}, at::kDouble);
    const double expected = (2 * per[0] + per[2] + 0.5 * per[3]).item<double>() / 3.5;
    EXPECT_NEAR(DistillLoss(s, x, t.ids, t.logprobs, t.tail, w).item<double>(), expected, 1e-12);
    EXPECT_EQ(DistillLoss(s, x, t.ids, t.logprobs, t.tail, at::zeros({n}, at::kDouble))
                  .item<double>(),
              0.0);
  }
  // A padding row with no target mass at all (weight 0) changes neither loss nor gradient.
  t.logprobs[1].fill_(-std::numeric_limits<double>::infinity());
  t.tail[1] = 0.0;
  const at::Tensor w = at::tensor({1.0, 0.0, 1.0, 1.0}, at::kDouble);
  for (const ObjectiveSpec& s : kAll) {
    const at::Tensor xg = x.clone().requires_grad_(true);
    const at::Tensor loss = DistillLoss(s, xg, t.ids, t.logprobs, t.tail, w);
    loss.backward();
    EXPECT_TRUE(AllFinite(loss)) << s.ToString();
    EXPECT_TRUE(AllFinite(xg.grad())) << s.ToString();
    EXPECT_EQ(xg.grad()[1].abs().sum().item<double>(), 0.0) << s.ToString();
  }
}

TEST(DistillLoss, RejectsBadShapes) {
  const at::Tensor x = at::zeros({2, 5});
  const at::Tensor ids = at::zeros({2, 3}, at::kLong);
  const at::Tensor lp = at::zeros({2, 3});
  const at::Tensor tail = at::zeros({2});
  EXPECT_NO_THROW(DistillLossPerPosition(kFkl, x, ids, lp, tail));
  EXPECT_THROW(DistillLossPerPosition(kFkl, x.view({10}), ids, lp, tail), c10::Error);
  EXPECT_THROW(DistillLossPerPosition(kFkl, x, at::zeros({3, 3}, at::kLong), lp, tail),
               c10::Error);
  EXPECT_THROW(DistillLossPerPosition(kFkl, x, at::zeros({2, 6}, at::kLong), at::zeros({2, 6}),
                                      tail),
               c10::Error);
  EXPECT_THROW(DistillLossPerPosition(kFkl, x, ids.to(at::kFloat), lp, tail), c10::Error);
  EXPECT_THROW(DistillLossPerPosition(kFkl, x, ids, at::zeros({2, 2}), tail), c10::Error);
  EXPECT_THROW(DistillLossPerPosition(kFkl, x, ids, lp, at::zeros({3})), c10::Error);
  EXPECT_THROW(DistillLossPerPosition(kFkl, x.to(at::kLong), ids, lp, tail), c10::Error);
  EXPECT_THROW(DistillLoss(kFkl, x, ids, lp, tail, at::ones({3})), c10::Error);
}

// ---- Behaviour under gradient descent. ----

// Runs `steps` of plain gradient descent on free logits [2, 8] against a fixed target (K = 3)
// and returns (mean coarsened alpha-hat before, after). sign = -1 ascends instead.
std::pair<double, double> Descend(const ObjectiveSpec& spec, double sign, int steps, double lr) {
  std::mt19937_64 rng(21);
  const int v = 8, k = 3;
  std::vector<Vec> p, init;
  std::vector<std::vector<int64_t>> ids;
  for (int r = 0; r < 2; ++r) {
    p.push_back(Softmax(RandomLogits(&rng, v, 1.5)));
    ids.push_back(RandomIds(&rng, v, k));
    init.push_back(RandomLogits(&rng, v, 1.5));
  }
  const Target t = MakeTarget(p, ids, at::kFloat);
  at::Tensor x = Rows(init, at::kFloat).requires_grad_(true);
  auto alpha = [&] {
    return CoarsenedAcceptance(x, t.ids, t.logprobs, t.tail).mean().item<double>();
  };
  const double before = alpha();
  for (int i = 0; i < steps; ++i) {
    const at::Tensor loss = sign * DistillLoss(spec, x, t.ids, t.logprobs, t.tail, at::Tensor());
    loss.backward();
    {
      at::NoGradGuard no_grad;
      x -= lr * x.grad();
      x.grad().zero_();
    }
  }
  return {before, alpha()};
}

TEST(DistillLoss, GradientDescentDrivesDraftTowardTarget) {
  for (const ObjectiveSpec& spec : kAll) {
    // TVD's gradient does not shrink near the optimum: a smaller step lets it settle. (Both
    // rows start with a bucket of tiny draft mass, whose slow softmax gradient sets the pace.)
    const double lr = spec.kind == Objective::kTvd ? 1.0 : 2.0;
    const auto [before, after] = Descend(spec, 1.0, 1000, lr);
    EXPECT_LT(before, 0.8) << spec.ToString();
    EXPECT_GT(after, 0.99) << spec.ToString() << " from " << before;
  }
}

TEST(DistillLoss, SignFlippedLossDoesNotRaiseAcceptance) {
  for (const ObjectiveSpec& spec : kAll) {
    const double lr = spec.kind == Objective::kTvd ? 1.0 : 2.0;
    const auto [before, after] = Descend(spec, -1.0, 100, lr);
    EXPECT_LT(after, before - 0.1) << spec.ToString();
  }
}

// ---- ObjectiveSpec. ----

TEST(ObjectiveSpec, ParseRoundTrips) {
  for (const std::string s : {"fkl", "rkl", "tvd", "jsd:0.5", "jsd:0.1", "jsd:0.9", "jsd:0.25",
                              "jsd:1e-05", "jsd:0.999"}) {
    ObjectiveSpec spec;
    ASSERT_TRUE(ObjectiveSpec::Parse(s, &spec).ok()) << s;
    EXPECT_EQ(spec.ToString(), s);
  }
  ObjectiveSpec spec;
  ASSERT_TRUE(ObjectiveSpec::Parse("jsd", &spec).ok());
  EXPECT_EQ(spec.kind, Objective::kJsd);
  EXPECT_EQ(spec.beta, 0.5);
  EXPECT_EQ(spec.ToString(), "jsd:0.5");
  ASSERT_TRUE(ObjectiveSpec::Parse("jsd:0.3", &spec).ok());
  EXPECT_EQ(spec.beta, 0.3);
  ASSERT_TRUE(ObjectiveSpec::Parse("rkl", &spec).ok());
  EXPECT_EQ(spec.kind, Objective::kReverseKl);
  // Any beta survives ToString and Parse exactly.
  const ObjectiveSpec third{Objective::kJsd, 1.0 / 3.0};
  ObjectiveSpec back;
  ASSERT_TRUE(ObjectiveSpec::Parse(third.ToString(), &back).ok());
  EXPECT_EQ(back.beta, third.beta);
  EXPECT_EQ(back.kind, Objective::kJsd);
}

TEST(ObjectiveSpec, RejectsGarbage) {
  for (const std::string s : {"", "FKL", "kl", "fkl ", " fkl", "fkl:0.5", "jsd:", "jsd:0",
                              "jsd:1", "jsd:1.5", "jsd:-0.2", "jsd:abc", "jsd:0.5x", "jsd:nan",
                              "jsd:inf", "jsd: 0.5", "jsd:0.5:0.1", "jsd0.5", "tvd,fkl"}) {
    ObjectiveSpec spec{Objective::kTvd, 0.75};
    const Status st = ObjectiveSpec::Parse(s, &spec);
    EXPECT_TRUE(st.IsInvalidArgument()) << "'" << s << "': " << st.ToString();
    EXPECT_EQ(spec.kind, Objective::kTvd) << s;
    EXPECT_EQ(spec.beta, 0.75) << s;
  }
}

}  // namespace
}  // namespace trainer
}  // namespace specloop
