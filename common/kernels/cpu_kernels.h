// CPU kernels of the inference forward's elementwise parts (llama_forward_cpu.cc) and of the
// logger's log-sum-exp. Pure C++, compiled for AVX2 and for baseline x86-64, the variant
// chosen at load time by the CPU. (The matrix products are in linear_kernels.h.)
#pragma once

#include <cstdint>

namespace specloop {

// out[d] (+)= sum_t weights[t] * rows[t * dim + d] for d < dim: attention's value sum, with
// the accumulators kept in registers across all n rows. Each out[d] is one sum in t order,
// started from out[d] when `accumulate`: summing rows [0, a) and then [a, n) with accumulate
// gives the bits of one call over [0, n) (the paged KV cache sums block by block).
void WeightedRowSum(const float* weights, const float* rows, int64_t n, int64_t dim, float* out,
                    bool accumulate = false);

// sum_i exp(x[i] - shift) for n values with x[i] <= shift (shift = their max: a log-sum-exp),
// accumulated in eight float lanes and added in double. Relative error per term below 1e-7
// (a degree-6 polynomial after range reduction by ln 2); terms below e^-87 count as e^-87.
double SumExpBelow(const float* x, int64_t n, float shift);

// x[i] = exp(x[i] - shift) in place for n values with x[i] <= shift (a softmax's numerators),
// returning their sum in float; the same polynomial and clamp as SumExpBelow.
float ExpBelowInPlace(float* x, int64_t n, float shift);

// out[i] = silu(gate[i]) * up[i] = gate[i] / (1 + exp(-gate[i])) * up[i]: SwiGLU's product.
// Relative error below ~1e-6 (the exp above, on -|gate|).
void SiluMul(const float* gate, const float* up, float* out, int64_t n);

}  // namespace specloop
