// The tensor chain verifier (common/spec/tensor_verify.h) against the host one
// (common/spec/chain_verify.h): same outcomes for the same uniforms, exactness of the emitted
// token's law by a G-test (with broken companions the same test rejects), greedy equality.
#include "common/spec/tensor_verify.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <vector>

#include "common/base/sampling.h"
#include "common/spec/chain_verify.h"
#include "tests/spec/cases.h"
#include "tests/spec/stat_util.h"

namespace specloop {
namespace spec {
namespace {

using spec_test::GofResult;
using spec_test::GTest;
using spec_test::kSignificance;

// One random batch: rows as host floats, laid out [B, K + 1, V] / [B, K, V] / [B, K].
struct Batch {
  int B = 0, K = 0, V = 0;
  std::vector<int> k;        // [B] drafts per sequence, in [0, K]
  std::vector<float> p, q;   // [B * (K + 1) * V], [B * K * V]
  std::vector<int> tokens;   // [B * K]
  std::vector<uint64_t> seed;  // [B] each sequence's Rng seed

  const float* P(int b) const { return p.data() + static_cast<size_t>(b) * (K + 1) * V; }
  const float* Q(int b) const { return q.data() + static_cast<size_t>(b) * K * V; }
  const int* T(int b) const { return tokens.data() + static_cast<size_t>(b) * K; }
  at::Tensor PT(at::ScalarType t = at::kFloat) const {
    return at::from_blob(const_cast<float*>(p.data()), {B, K + 1, V}, at::kFloat).to(t);
  }
  at::Tensor QT(at::ScalarType t = at::kFloat) const {
    return at::from_blob(const_cast<float*>(q.data()), {B, K, V}, at::kFloat).to(t);
  }
  at::Tensor TT() const {
    return at::from_blob(const_cast<int*>(tokens.data()), {B, K}, at::kInt).to(at::kLong);
  }
  at::Tensor Control(bool draw) const {
    std::vector<Rng> rngs;
    for (uint64_t s : seed) rngs.emplace_back(s);
    std::vector<Rng*> ptrs;
    if (draw) {
      for (Rng& r : rngs) ptrs.push_back(&r);
    }
    return ChainControl(k, K, ptrs);
  }
};

// A random row: sparse (some zeros), sometimes peaked, sometimes equal to `copy`.
void RandomRow(Rng* rng, int V, float* row) {
  const bool peaked = rng->Uniform() < 0.3;
  for (int x = 0; x < V; ++x) {
    const double u = rng->Uniform();
    row[x] = rng->Uniform() < 0.2 ? 0.0f : static_cast<float>(peaked ? std::pow(u, 8.0) : u);
  }
  row[static_cast<int>(rng->Uniform() * V)] += 0.05f;  // some positive mass
}

Batch RandomBatch(uint64_t seed, int B, int K, int V) {
  Rng rng(seed);
  Batch b;
  b.B = B, b.K = K, b.V = V;
  b.p.assign(static_cast<size_t>(B) * (K + 1) * V, 0.0f);
  b.q.assign(static_cast<size_t>(B) * K * V, 0.0f);
  b.tokens.assign(static_cast<size_t>(B) * K, 0);
  for (int s = 0; s < B; ++s) {
    b.k.push_back(static_cast<int>(rng.Uniform() * (K + 1)));  // mixed k, 0..K
    b.seed.push_back(seed * 1000003 + s);
    float* p = b.p.data() + static_cast<size_t>(s) * (K + 1) * V;
    float* q = b.q.data() + static_cast<size_t>(s) * K * V;
    for (int i = 0; i <= K; ++i) RandomRow(&rng, V, p + i * V);
    for (int i = 0; i < K; ++i) {
      if (rng.Uniform() < 0.1) {  // q == p: the residual is empty after a q(x) == 0 rejection
        std::copy(p + i * V, p + (i + 1) * V, q + i * V);
      } else {
        RandomRow(&rng, V, q + i * V);
      }
      // Mostly drafted from q; sometimes a token q rules out, or one p rules out.
      const double r = rng.Uniform();
      b.tokens[s * K + i] = r < 0.9 ? SampleFrom(q + i * V, V, &rng)
                                    : static_cast<int>(rng.Uniform() * V);
    }
  }
  return b;
}

ChainBatchOutcome RunTensor(const Batch& b, at::ScalarType t) {
  at::Tensor packed;
  Status s = VerifyChainTensors(b.PT(t), b.QT(t), b.TT(), b.Control(true), &packed);
  EXPECT_TRUE(s.ok()) << s.ToString();
  ChainBatchOutcome out;
  s = UnpackChainOutcomes(packed, &out);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

// (a) Same uniforms, same outcome. Exact agreement can fail only where a uniform lies within
// rounding of a decision: the tensor path normalizes rows in float32 (the host in double), and
// sums CDFs in another order, so u * q(x) < p(x) or u * total < cdf(x) can flip when the two
// sides differ by ~1e-7 relative. With V = 64 a sequence makes at most k + 1 <= 6 such
// decisions, so a flip has probability ~1e-6 per sequence; we allow 1 in 1000 sequences (float64
// input: the same arithmetic as the host but the CDF's summation order).
TEST(TensorVerify, AgreesWithVerifyChainForTheSameUniforms) {
  for (const at::ScalarType t : {at::kFloat, at::kDouble}) {
    int64_t sequences = 0, mismatches = 0, accepted_total = 0, recoveries = 0;
    for (const int B : {1, 4, 16}) {
      for (int rep = 0; rep < 150; ++rep) {
        const Batch b = RandomBatch(1 + rep + 1000 * B, B, /*K=*/5, /*V=*/64);
        const ChainBatchOutcome got = RunTensor(b, t);
        ASSERT_EQ(got.outcomes.size(), static_cast<size_t>(B));
        for (int s = 0; s < B; ++s) {
          Rng rng(b.seed[s]);
          ChainOutcome want;
          ASSERT_TRUE(VerifyChain(b.k[s], b.V, b.T(s), b.Q(s), b.P(s), &rng, &want).ok());
          ASSERT_TRUE(got.status[s].ok()) << got.status[s].ToString();
          ++sequences;
          accepted_total += want.num_accepted;
          recoveries += want.num_accepted < b.k[s];
          if (got.outcomes[s].num_accepted != want.num_accepted ||
              got.outcomes[s].tokens != want.tokens) {
            ++mismatches;
          }
        }
      }
    }
    std::cout << (t == at::kFloat ? "float32" : "float64") << ": " << mismatches << " of "
              << sequences << " sequences differ (" << accepted_total << " accepted, "
              << recoveries << " recovered)\n";
    EXPECT_GT(recoveries, sequences / 10);  // both branches exercised
    EXPECT_LE(mismatches * 1000, sequences);
  }
}

TEST(TensorVerify, KZeroSamplesP0AndPadsWithMinusOne) {
  Batch b = RandomBatch(7, 3, 2, 16);
  b.k = {0, 2, 0};
  const ChainBatchOutcome got = RunTensor(b, at::kFloat);
  for (int s = 0; s < 3; ++s) {
    Rng rng(b.seed[s]);
    ChainOutcome want;
    ASSERT_TRUE(VerifyChain(b.k[s], b.V, b.T(s), b.Q(s), b.P(s), &rng, &want).ok());
    EXPECT_EQ(got.outcomes[s].tokens, want.tokens) << s;
  }
  EXPECT_EQ(got.outcomes[0].num_accepted, 0);
  EXPECT_EQ(got.outcomes[0].tokens.size(), 1u);
  // A batch padded to K = 0 for everyone: no draft tensors at all.
  Batch z = RandomBatch(8, 4, 0, 16);
  const ChainBatchOutcome zo = RunTensor(z, at::kFloat);
  for (int s = 0; s < 4; ++s) {
    Rng rng(z.seed[s]);
    ChainOutcome want;
    ASSERT_TRUE(VerifyChain(0, z.V, nullptr, nullptr, z.P(s), &rng, &want).ok());
    EXPECT_EQ(zo.outcomes[s].tokens, want.tokens);
  }
}

// Bad values mark only their sequence, where VerifyChain would fail it; rows it never reads
// (after a rejection) do not.
TEST(TensorVerify, BadValuesMarkOnlyTheirSequence) {
  Batch b = RandomBatch(11, 4, 3, 8);
  b.k = {3, 3, 3, 3};
  // Sequence 0: a draft token outside the vocabulary.
  b.tokens[0 * 3 + 2] = 8;
  // Sequence 1: NaN in target row 0 (always read).
  b.p[(1 * 4 + 0) * 8 + 3] = NAN;
  // Sequence 2: rejects at 0 (q(x) == 0), then a negative entry in its unread rows 2..3.
  b.q[(2 * 3 + 0) * 8 + b.tokens[2 * 3 + 0]] = 0.0f;
  b.p[(2 * 4 + 3) * 8 + 1] = -1.0f;
  b.q[(2 * 3 + 2) * 8 + 1] = NAN;
  const ChainBatchOutcome got = RunTensor(b, at::kFloat);
  for (int s = 0; s < 4; ++s) {
    Rng rng(b.seed[s]);
    ChainOutcome want;
    const Status host = VerifyChain(3, 8, b.T(s), b.Q(s), b.P(s), &rng, &want);
    EXPECT_EQ(got.status[s].ok(), host.ok()) << s << ": " << got.status[s].ToString();
    if (host.ok()) {
      EXPECT_EQ(got.outcomes[s].tokens, want.tokens) << s;
    }
  }
  EXPECT_FALSE(got.status[0].ok());
  EXPECT_FALSE(got.status[1].ok());
  EXPECT_TRUE(got.status[2].ok());
  EXPECT_EQ(got.outcomes[2].num_accepted, 0);
  EXPECT_TRUE(got.status[3].ok());
}

TEST(TensorVerify, BadShapesAreInvalidArgument) {
  const Batch b = RandomBatch(3, 2, 3, 8);
  at::Tensor packed;
  EXPECT_TRUE(VerifyChainTensors(b.PT(), b.QT().narrow(2, 0, 7), b.TT(), b.Control(true), &packed)
                  .IsInvalidArgument());
  EXPECT_TRUE(VerifyChainTensors(b.PT(), b.QT(), b.TT().narrow(1, 0, 2), b.Control(true), &packed)
                  .IsInvalidArgument());
  EXPECT_TRUE(VerifyChainTensors(b.PT(), b.QT(), b.TT().to(at::kFloat), b.Control(true), &packed)
                  .IsInvalidArgument());
  EXPECT_TRUE(VerifyChainTensors(b.PT(), b.QT(), b.TT(), b.Control(true).to(at::kFloat), &packed)
                  .IsInvalidArgument());
  at::Tensor control = b.Control(true);
  control[1][0] = 4.0;  // k_b > K
  EXPECT_TRUE(VerifyChainTensors(b.PT(), b.QT(), b.TT(), control, &packed).IsInvalidArgument());
  control[1][0] = -1.0;
  EXPECT_TRUE(VerifyChainGreedyTensors(b.PT(), b.TT(), control, &packed).IsInvalidArgument());
  EXPECT_TRUE(VerifyChainGreedyTensors(b.PT().select(0, 0), b.TT(), b.Control(false), &packed)
                  .IsInvalidArgument());
  EXPECT_FALSE(packed.defined());
  ChainBatchOutcome out;
  EXPECT_TRUE(UnpackChainOutcomes(at::zeros({2, 5}, at::kFloat), &out).IsInvalidArgument());
  at::Tensor broken = at::full({1, 5}, -1, at::kLong);
  broken[0][0] = 2;  // claims 3 tokens, holds none
  EXPECT_TRUE(UnpackChainOutcomes(broken, &out).IsInvalidArgument());
  EXPECT_TRUE(out.outcomes.empty());
}

// (b) Exactness: the first emitted token is distributed as p_0 whatever the draft. Per case,
// kTrials sequences of k = 3 (rows rotated per position), drafted from q_i, verified in batches
// of 1000; G-test at kSignificance. The broken companions must be rejected by the same test.
enum class Variant { kCorrect, kAcceptAlways, kOneUniformPerSequence };

GofResult FirstTokenLaw(const spec_test::DistCase& c, Variant variant) {
  constexpr int kTrials = 100000, kBatch = 1000, K = 3;
  const int V = static_cast<int>(c.p.size());
  std::vector<float> p((K + 1) * V), q(K * V);
  for (int i = 0; i <= K; ++i) {
    for (int x = 0; x < V; ++x) p[i * V + (x + i) % V] = c.p[x];
  }
  for (int i = 0; i < K; ++i) {
    for (int x = 0; x < V; ++x) q[i * V + (x + i) % V] = c.q[x];
  }
  const at::Tensor P = at::from_blob(p.data(), {1, K + 1, V}, at::kFloat).expand({kBatch, K + 1, V});
  const at::Tensor Q = at::from_blob(q.data(), {1, K, V}, at::kFloat).expand({kBatch, K, V});
  Rng rng(20261127);
  std::vector<int64_t> counts(V, 0);
  std::vector<int> tokens(kBatch * K);
  for (int done = 0; done < kTrials; done += kBatch) {
    for (int s = 0; s < kBatch; ++s) {
      for (int i = 0; i < K; ++i) tokens[s * K + i] = SampleFrom(q.data() + i * V, V, &rng);
    }
    if (variant == Variant::kAcceptAlways) {
      for (int s = 0; s < kBatch; ++s) ++counts[tokens[s * K]];
      continue;
    }
    at::Tensor control = ChainControl(std::vector<int>(kBatch, K), K, {});
    double* c = control.data_ptr<double>();
    for (int s = 0; s < kBatch; ++s) {
      const double u = rng.Uniform();
      for (int i = 0; i <= K; ++i) {
        c[s * (K + 2) + 1 + i] = variant == Variant::kOneUniformPerSequence ? u : rng.Uniform();
      }
    }
    const at::Tensor T = at::from_blob(tokens.data(), {kBatch, K}, at::kInt).to(at::kLong);
    at::Tensor packed;
    EXPECT_TRUE(VerifyChainTensors(P, Q, T, control, &packed).ok());
    ChainBatchOutcome out;
    EXPECT_TRUE(UnpackChainOutcomes(packed, &out).ok());
    for (const ChainOutcome& o : out.outcomes) ++counts[o.tokens.at(0)];
  }
  std::vector<double> law(c.p.begin(), c.p.end());
  return GTest(counts, law);
}

TEST(TensorVerify, FirstTokenFollowsTheTarget) {
  for (const spec_test::DistCase& c : spec_test::BaseCases()) {
    const GofResult r = FirstTokenLaw(c, Variant::kCorrect);
    EXPECT_FALSE(r.impossible) << c.name;
    EXPECT_GT(r.p_value, kSignificance) << c.name << ": " << r.ToString();
  }
}

TEST(TensorVerify, BrokenVerifiersAreRejectedByTheSameTest) {
  for (const spec_test::DistCase& c : spec_test::BaseCases()) {
    if (c.name == "equal_v3") continue;  // p == q: accepting always is correct there
    // Reusing the acceptance uniform for the recovered token biases it only where a draft is
    // rejected with probability strictly between 0 and 1 and the residual has two or more
    // tokens: not in v2 (one-token residual) or disjoint_v4 (every draft rejected).
    const bool reuse_matters = c.name != "v2" && c.name != "disjoint_v4";
    for (const Variant v : {Variant::kAcceptAlways, Variant::kOneUniformPerSequence}) {
      if (v == Variant::kOneUniformPerSequence && !reuse_matters) continue;
      const GofResult r = FirstTokenLaw(c, v);
      EXPECT_TRUE(r.impossible || r.p_value < kSignificance)
          << c.name << " variant " << static_cast<int>(v) << ": " << r.ToString();
    }
  }
}

// (c) Greedy equals VerifyChainGreedy on random logits with many ties (small integers) and a
// few NaNs, mixed k, B = 1 / 4 / 16; exact.
TEST(TensorVerify, GreedyEqualsVerifyChainGreedy) {
  int64_t sequences = 0, accepted_total = 0;
  for (const int B : {1, 4, 16}) {
    for (int rep = 0; rep < 100; ++rep) {
      Rng rng(rep + 77 * B);
      const int K = 4, V = 12;
      Batch b;
      b.B = B, b.K = K, b.V = V;
      b.p.resize(static_cast<size_t>(B) * (K + 1) * V);
      for (float& x : b.p) {
        x = rng.Uniform() < 0.02 ? NAN : static_cast<float>(static_cast<int>(rng.Uniform() * 4));
      }
      b.tokens.resize(static_cast<size_t>(B) * K);
      for (int s = 0; s < B; ++s) {
        b.k.push_back(static_cast<int>(rng.Uniform() * (K + 1)));
        for (int i = 0; i < K; ++i) {
          const int best = Argmax(b.P(s) + i * V, V);
          b.tokens[s * K + i] =
              rng.Uniform() < 0.7 ? best : static_cast<int>(rng.Uniform() * V);
        }
      }
      at::Tensor packed;
      ASSERT_TRUE(VerifyChainGreedyTensors(b.PT(), b.TT(), b.Control(false), &packed).ok());
      ChainBatchOutcome got;
      ASSERT_TRUE(UnpackChainOutcomes(packed, &got).ok());
      for (int s = 0; s < B; ++s) {
        ChainOutcome want;
        ASSERT_TRUE(VerifyChainGreedy(b.k[s], V, b.T(s), b.P(s), &want).ok());
        ASSERT_TRUE(got.status[s].ok());
        EXPECT_EQ(got.outcomes[s].num_accepted, want.num_accepted);
        EXPECT_EQ(got.outcomes[s].tokens, want.tokens);
        ++sequences;
        accepted_total += want.num_accepted;
      }
    }
  }
  EXPECT_GT(accepted_total, sequences);  // acceptance runs exercised, not only first mismatches
  // An all-NaN row's argmax is 0, as Argmax's.
  at::Tensor nan = at::full({1, 1, 5}, NAN, at::kFloat), packed;
  ASSERT_TRUE(VerifyChainGreedyTensors(nan, at::zeros({1, 0}, at::kLong),
                                       ChainControl({0}, 0, {}), &packed)
                  .ok());
  EXPECT_EQ(packed[0][1].item<int64_t>(), 0);
}

}  // namespace
}  // namespace spec
}  // namespace specloop
