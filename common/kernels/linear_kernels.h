// The CPU inference forward's matrix products: out = x * W^T for a block of a few input rows
// (one decode position, a verification of k+1 positions, a batch of sequences) against a
// weight matrix stored row-major in float32, float16 or bfloat16, accumulated in float32.
//
// A decode step is bound by how fast the weights stream from memory, so the kernel reads each
// weight row once per call and multiplies every input row (up to a register tile of rows) by
// each loaded vector: verifying 5 positions costs about what one costs until the arithmetic
// catches up with the memory (measurements in bench/RESULTS.md, engine_bench). The variant is
// chosen once per process from the CPU: AVX-512, AVX2 + FMA + F16C, or portable C++.
// Pure C++: no LibTorch.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/base/half.h"

namespace specloop {

enum class WeightType : uint8_t { kFloat32, kFloat16, kBFloat16 };

enum class Isa : uint8_t { kGeneric, kAvx2, kAvx512 };

// The variant LinearRows runs here: the widest the CPU supports, or the one named by the
// environment variable SPECLOOP_ISA (generic, avx2, avx512) when the CPU supports it.
Isa ActiveIsa();
const char* IsaName(Isa isa);
// Every variant this CPU can run (generic first), for tests that compare them.
std::vector<Isa> SupportedIsas();

// out[m * ldo + o] (+)= sum_k x[m * K + k] * W[o, k] for m < M and o in [o_begin, o_end),
// where W is [O, K] row-major of type `type` (float, or uint16_t bit patterns of float16 or
// bfloat16). Products are summed in float32 in an order that depends on K and the variant
// only, not on M, the row's place in the block or [o_begin, o_end): a row gets the same bits
// whatever else is in the block.
// REQUIRES: x, w and out do not overlap; 0 <= o_begin <= o_end <= O.
void LinearRows(const float* x, int64_t M, int64_t K, const void* w, WeightType type,
                float* out, int64_t ldo, int64_t o_begin, int64_t o_end, bool accumulate);
void LinearRowsIsa(Isa isa, const float* x, int64_t M, int64_t K, const void* w,
                   WeightType type, float* out, int64_t ldo, int64_t o_begin, int64_t o_end,
                   bool accumulate);

// A weight matrix [rows, cols] repacked for LinearPacked: panels of 16 rows (outputs), each
// stored column by column ([cols][16], one 64-byte line of float32 per column), the last panel
// padded with zeros; 64-byte aligned. A product then reads the weights as one sequential
// stream and multiplies every loaded vector by each input row (a broadcast scalar).
class PackedMatrix {
 public:
  static constexpr int64_t kPanel = 16;

  PackedMatrix() = default;
  // Copies w ([rows, cols] row-major, float or uint16_t bit patterns of `type`).
  PackedMatrix(const void* w, WeightType type, int64_t rows, int64_t cols);

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t panels() const { return (rows_ + kPanel - 1) / kPanel; }
  WeightType type() const { return type_; }
  const void* data() const { return data_.get(); }
  int64_t bytes() const;

 private:
  struct Free {
    void operator()(void* p) const;
  };
  int64_t rows_ = 0, cols_ = 0;
  WeightType type_ = WeightType::kFloat32;
  std::unique_ptr<void, Free> data_;
};

// out[m * ldo + o] (+)= sum_k x[m * K + k] * W[o, k] for m < M and the outputs o of panels
// [panel_begin, panel_end) (o < w.rows()), K = w.cols(). Each output is one float32 fused
// multiply-add chain over k in order, the same in every variant: a row's result has the same
// bits whatever the block, the split of panels (between threads) or the instruction set.
// REQUIRES: x and out do not overlap; 0 <= panel_begin <= panel_end <= w.panels().
void LinearPacked(const float* x, int64_t M, const PackedMatrix& w, float* out, int64_t ldo,
                  int64_t panel_begin, int64_t panel_end, bool accumulate);
void LinearPackedIsa(Isa isa, const float* x, int64_t M, const PackedMatrix& w, float* out,
                     int64_t ldo, int64_t panel_begin, int64_t panel_end, bool accumulate);

// bfloat16 bit pattern to float (exact). float16's HalfToFloat / FloatToHalf are in
// common/base/half.h (included above).
float BFloat16ToFloat(uint16_t b);

}  // namespace specloop
