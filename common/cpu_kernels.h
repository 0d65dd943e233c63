// CPU kernels of the small-block forward (llama_forward_cpu.cc). Pure C++, compiled for AVX2
// and for baseline x86-64, the variant chosen at load time by the CPU.
//
// SmallGemm: out[M, O] (+)= x[M, K] * w[O, K]^T for few rows M (decode and verification
// blocks), streaming each weight row once for all M rows. Measured on this machine's EPYC core against OpenBLAS (K = 256,
// O = 4096): M = 1 ties sgemv (73 vs 68 us); M = 5 takes 223 us where sgemm takes 468 us
// (sgemm packs the whole weight on every call); sgemm wins again above M = 16.
#pragma once

#include <cstdint>

namespace specloop {

// REQUIRES: x, w, out non-overlapping, row-major and dense.
void SmallGemm(const float* x, const float* w, float* out, int64_t M, int64_t K, int64_t O,
               bool accumulate);

// out[d] = sum_t weights[t] * rows[t * dim + d] for d < dim: attention's value sum, with the
// accumulators kept in registers across all n rows.
void WeightedRowSum(const float* weights, const float* rows, int64_t n, int64_t dim, float* out);

// sum_i exp(x[i] - shift) for n values with x[i] <= shift (shift = their max: a log-sum-exp),
// accumulated in eight float lanes and added in double. Relative error per term below 1e-7
// (a degree-6 polynomial after range reduction by ln 2); terms below e^-87 count as e^-87.
double SumExpBelow(const float* x, int64_t n, float shift);

}  // namespace specloop
