#include "common/kernels/linear_kernels.h"

#include <cmath>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace specloop {
namespace {

uint16_t FloatToBFloat16(float f) {  // round to nearest even (test inputs are finite)
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}

// Random weights of a type, and their exact float values for the reference product.
struct Weights {
  std::vector<float> f32, exact;
  std::vector<uint16_t> bits;
  const void* data(WeightType t) const {
    return t == WeightType::kFloat32 ? static_cast<const void*>(f32.data()) : bits.data();
  }
};

Weights MakeWeights(WeightType t, int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> half_bits(0, 0x7bff);  // finite float16 magnitudes < 2^16
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Weights w;
  for (int64_t i = 0; i < n; ++i) {
    if (t == WeightType::kFloat32) {
      w.f32.push_back(normal(gen));
      w.exact.push_back(w.f32.back());
    } else if (t == WeightType::kFloat16) {
      // Random magnitudes around 1 with random signs: exponents 12..17 of float16.
      const uint16_t h = static_cast<uint16_t>((half_bits(gen) & 0x17ff) | 0x3000 |
                                               ((gen() & 1) << 15));
      w.bits.push_back(h);
      w.exact.push_back(HalfToFloat(h));
    } else {
      w.bits.push_back(FloatToBFloat16(normal(gen)));
      w.exact.push_back(BFloat16ToFloat(w.bits.back()));
    }
  }
  return w;
}

const char* TypeName(WeightType t) {
  return t == WeightType::kFloat32 ? "f32" : t == WeightType::kFloat16 ? "f16" : "bf16";
}

// Every variant this CPU runs, every weight type, block sizes across the tile sizes (1-6, 7 as
// 4 + 3, 16, 33) and K with and without a tail: the product is the double-precision one to
// float rounding of K terms.
TEST(LinearRows, MatchesDoublePrecisionProduct) {
  for (Isa isa : SupportedIsas()) {
    for (WeightType t : {WeightType::kFloat32, WeightType::kFloat16, WeightType::kBFloat16}) {
      for (int64_t K : {16, 40, 256, 771}) {
        const int64_t O = 13;
        Weights w = MakeWeights(t, O * K, static_cast<uint32_t>(K));
        for (int64_t M : {1, 2, 3, 4, 5, 6, 7, 9, 16, 33}) {
          std::mt19937 gen(static_cast<uint32_t>(M * 7 + K));
          std::normal_distribution<float> normal(0.0f, 1.0f);
          std::vector<float> x(M * K);
          for (float& v : x) v = normal(gen);
          std::vector<float> out(M * O, -1.0f);
          LinearRowsIsa(isa, x.data(), M, K, w.data(t), t, out.data(), O, 0, O, false);
          for (int64_t m = 0; m < M; ++m) {
            for (int64_t o = 0; o < O; ++o) {
              double want = 0, scale = 0;
              for (int64_t k = 0; k < K; ++k) {
                want += static_cast<double>(x[m * K + k]) * w.exact[o * K + k];
                scale += std::abs(static_cast<double>(x[m * K + k]) * w.exact[o * K + k]);
              }
              ASSERT_NEAR(out[m * O + o], want, 1e-6 * scale + 1e-30)
                  << IsaName(isa) << " " << TypeName(t) << " K=" << K << " M=" << M
                  << " m=" << m << " o=" << o;
            }
          }
        }
      }
    }
  }
}

// A row's result has the same bits whatever block it runs in, wherever it sits in the block,
// and however the outputs are split (between threads): serving output must not depend on
// what else is in the batch.
TEST(LinearRows, RowResultsDoNotDependOnTheBlock) {
  const int64_t K = 200, O = 37, M = 16;
  for (Isa isa : SupportedIsas()) {
    for (WeightType t : {WeightType::kFloat32, WeightType::kFloat16}) {
      Weights w = MakeWeights(t, O * K, 3);
      std::mt19937 gen(4);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> x(M * K);
      for (float& v : x) v = normal(gen);
      std::vector<float> block(M * O);
      LinearRowsIsa(isa, x.data(), M, K, w.data(t), t, block.data(), O, 0, O, false);
      for (int64_t m = 0; m < M; ++m) {
        std::vector<float> alone(O);
        // Outputs in two uneven parts, as two threads would split them.
        LinearRowsIsa(isa, x.data() + m * K, 1, K, w.data(t), t, alone.data(), O, 0, 11, false);
        LinearRowsIsa(isa, x.data() + m * K, 1, K, w.data(t), t, alone.data(), O, 11, O, false);
        EXPECT_EQ(std::memcmp(alone.data(), block.data() + m * O, O * sizeof(float)), 0)
            << IsaName(isa) << " " << TypeName(t) << " row " << m;
      }
    }
  }
}

TEST(LinearRows, AccumulateAddsToTheOutputAndRespectsItsStride) {
  const int64_t K = 48, O = 9, M = 3, ldo = 12;
  Weights w = MakeWeights(WeightType::kFloat32, O * K, 5);
  std::vector<float> x(M * K, 0.5f);
  for (Isa isa : SupportedIsas()) {
    std::vector<float> fresh(M * ldo, 7.0f), added(M * ldo, 7.0f);
    LinearRowsIsa(isa, x.data(), M, K, w.data(WeightType::kFloat32), WeightType::kFloat32,
                  fresh.data(), ldo, 2, O, false);
    LinearRowsIsa(isa, x.data(), M, K, w.data(WeightType::kFloat32), WeightType::kFloat32,
                  added.data(), ldo, 2, O, true);
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t o = 0; o < ldo; ++o) {
        if (o < 2 || o >= O) {  // outside [o_begin, o_end): untouched
          EXPECT_EQ(fresh[m * ldo + o], 7.0f);
          EXPECT_EQ(added[m * ldo + o], 7.0f);
        } else {
          EXPECT_FLOAT_EQ(added[m * ldo + o], fresh[m * ldo + o] + 7.0f) << IsaName(isa);
        }
      }
    }
  }
}

// Packed weights: every variant, type, block size across the tile sizes (1-12 rows, 13 as
// 7 + 6, 33) and output counts that leave a partial panel, against the double-precision
// product; panel ranges cover the outputs exactly once.
TEST(LinearPacked, MatchesDoublePrecisionProduct) {
  for (Isa isa : SupportedIsas()) {
    for (WeightType t : {WeightType::kFloat32, WeightType::kFloat16, WeightType::kBFloat16}) {
      for (int64_t K : {1, 40, 256}) {
        for (int64_t O : {16, 37, 64}) {
          Weights w = MakeWeights(t, O * K, static_cast<uint32_t>(K + O));
          PackedMatrix packed(w.data(t), t, O, K);
          for (int64_t M : {1, 2, 5, 6, 7, 12, 13, 33}) {
            std::mt19937 gen(static_cast<uint32_t>(M * 7 + K));
            std::normal_distribution<float> normal(0.0f, 1.0f);
            std::vector<float> x(M * K);
            for (float& v : x) v = normal(gen);
            std::vector<float> out(M * O, NAN);
            // Two calls over uneven panel ranges, as two threads would split them.
            const int64_t mid = packed.panels() / 2;
            LinearPackedIsa(isa, x.data(), M, packed, out.data(), O, 0, mid, false);
            LinearPackedIsa(isa, x.data(), M, packed, out.data(), O, mid, packed.panels(), false);
            for (int64_t m = 0; m < M; ++m) {
              for (int64_t o = 0; o < O; ++o) {
                double want = 0, scale = 0;
                for (int64_t k = 0; k < K; ++k) {
                  want += static_cast<double>(x[m * K + k]) * w.exact[o * K + k];
                  scale += std::abs(static_cast<double>(x[m * K + k]) * w.exact[o * K + k]);
                }
                ASSERT_NEAR(out[m * O + o], want, 1e-6 * scale + 1e-30)
                    << IsaName(isa) << " " << TypeName(t) << " K=" << K << " O=" << O
                    << " M=" << M << " m=" << m << " o=" << o;
              }
            }
          }
        }
      }
    }
  }
}

// Each output is one fused multiply-add chain in every variant: the same bits alone or in a
// block of 16, and on every instruction set (so a model's output does not depend on the CPU
// it runs on).
TEST(LinearPacked, SameBitsWhateverTheBlockAndTheInstructionSet) {
  const int64_t K = 300, O = 50, M = 16;
  for (WeightType t : {WeightType::kFloat32, WeightType::kFloat16, WeightType::kBFloat16}) {
    Weights w = MakeWeights(t, O * K, 8);
    PackedMatrix packed(w.data(t), t, O, K);
    std::mt19937 gen(9);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(M * K);
    for (float& v : x) v = normal(gen);
    std::vector<float> reference;
    for (Isa isa : SupportedIsas()) {
      std::vector<float> block(M * O);
      LinearPackedIsa(isa, x.data(), M, packed, block.data(), O, 0, packed.panels(), false);
      if (reference.empty()) reference = block;
      EXPECT_EQ(std::memcmp(block.data(), reference.data(), block.size() * sizeof(float)), 0)
          << IsaName(isa) << " differs from " << IsaName(SupportedIsas().front()) << " "
          << TypeName(t);
      for (int64_t m = 0; m < M; ++m) {
        std::vector<float> alone(O);
        LinearPackedIsa(isa, x.data() + m * K, 1, packed, alone.data(), O, 0, packed.panels(),
                        false);
        EXPECT_EQ(std::memcmp(alone.data(), block.data() + m * O, O * sizeof(float)), 0)
            << IsaName(isa) << " " << TypeName(t) << " row " << m;
      }
    }
  }
}

// Issue 48: every vector variant this CPU runs gives the portable variant's bits (one fused
// multiply-add chain per output, k in order) for every block of 1..16 rows, whichever tile
// shape serves it (one chunk of kPackedRows rows or several), with a partial last panel, K not
// a multiple of any vector width, and accumulation.
TEST(LinearPacked, EveryVariantGivesThePortableBitsForOneToSixteenRows) {
  const int64_t O = 50;  // 3 full panels and a partial one: a two-panel tile and a lone panel
  for (WeightType t : {WeightType::kFloat32, WeightType::kFloat16, WeightType::kBFloat16}) {
    for (int64_t K : {7, 37, 300, 771}) {
      Weights w = MakeWeights(t, O * K, static_cast<uint32_t>(K * 3 + 1));
      PackedMatrix packed(w.data(t), t, O, K);
      for (int64_t M = 1; M <= 16; ++M) {
        std::mt19937 gen(static_cast<uint32_t>(M * 131 + K));
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::vector<float> x(M * K), start(M * O);
        for (float& v : x) v = normal(gen);
        for (float& v : start) v = normal(gen);
        for (bool accumulate : {false, true}) {
          std::vector<float> want = start;
          LinearPackedIsa(Isa::kGeneric, x.data(), M, packed, want.data(), O, 0, packed.panels(),
                          accumulate);
          for (Isa isa : SupportedIsas()) {
            std::vector<float> got = start;
            LinearPackedIsa(isa, x.data(), M, packed, got.data(), O, 0, packed.panels(),
                            accumulate);
            ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
                << IsaName(isa) << " " << TypeName(t) << " K=" << K << " M=" << M
                << " accumulate=" << accumulate;
          }
        }
      }
    }
  }
  std::string isas;
  for (Isa isa : SupportedIsas()) isas += std::string(" ") + IsaName(isa);
  RecordProperty("isas", isas);
  std::cout << "variants compared:" << isas << "\n";
}

TEST(LinearPacked, AccumulateAddsAndPaddingIsNeverWritten) {
  const int64_t K = 32, O = 20, M = 3, ldo = 24;  // 2 panels, the second 4 rows deep
  Weights w = MakeWeights(WeightType::kFloat32, O * K, 10);
  PackedMatrix packed(w.data(WeightType::kFloat32), WeightType::kFloat32, O, K);
  EXPECT_EQ(packed.panels(), 2);
  std::vector<float> x(M * K, 0.25f);
  for (Isa isa : SupportedIsas()) {
    std::vector<float> fresh(M * ldo, 7.0f), added(M * ldo, 7.0f);
    LinearPackedIsa(isa, x.data(), M, packed, fresh.data(), ldo, 0, 2, false);
    LinearPackedIsa(isa, x.data(), M, packed, added.data(), ldo, 0, 2, true);
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t o = 0; o < ldo; ++o) {
        if (o >= O) {  // past the last row: the padding's zeros are not stored
          EXPECT_EQ(fresh[m * ldo + o], 7.0f) << IsaName(isa);
          EXPECT_EQ(added[m * ldo + o], 7.0f) << IsaName(isa);
        } else {
          EXPECT_FLOAT_EQ(added[m * ldo + o], fresh[m * ldo + o] + 7.0f) << IsaName(isa);
        }
      }
    }
  }
}

// Every float16 bit pattern: HalfToFloat agrees with the hardware conversion the kernels use
// (a product with the weight alone), and with known values.
TEST(HalfToFloat, AgreesWithTheKernelsConversionOnEveryPattern) {
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xc000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_TRUE(std::isinf(HalfToFloat(0x7c00)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7e00)));
  EXPECT_EQ(BFloat16ToFloat(0x3f80), 1.0f);
  const float one = 1.0f;
  for (Isa isa : SupportedIsas()) {
    for (uint32_t h = 0; h < 0x10000; ++h) {
      if ((h & 0x7c00) == 0x7c00) continue;  // inf and nan: no product to compare
      const uint16_t bits = static_cast<uint16_t>(h);
      float got = 0;
      LinearRowsIsa(isa, &one, 1, 1, &bits, WeightType::kFloat16, &got, 1, 0, 1, false);
      ASSERT_EQ(got, HalfToFloat(bits)) << IsaName(isa) << " pattern " << h;
    }
  }
}

}  // namespace
}  // namespace specloop
