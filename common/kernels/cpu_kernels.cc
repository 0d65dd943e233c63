#include "common/kernels/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>

// AVX2 and baseline variants, picked at load time by an ifunc resolver. Not under
// ThreadSanitizer: GCC instruments the resolver, which runs during relocation before the TSan
// runtime is up and crashes every binary at load; TSan builds use the baseline variant.
#if defined(__SANITIZE_THREAD__)
#define SPECLOOP_CLONES
#else
#define SPECLOOP_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#endif

namespace specloop {

namespace {

typedef float v8 __attribute__((vector_size(32)));

typedef unsigned u32x8 __attribute__((vector_size(32)));

// exp(x) for x in [-87, 0] (callers clamp): x = n ln2 + r with |r| <= ln2 / 2, e^r by the
// Cephes polynomial, 2^n by adding n to the exponent bits.
inline v8 ExpClamped(v8 x) {
  const float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const v8 t = x * 1.44269504088896341f + kMagic;
  const v8 n = t - kMagic;
  const v8 r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // ln 2 in two parts
  v8 p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  u32x8 bits, tb, mb;  // unsigned: the shift below is defined for negative n too
  const v8 magic = v8{} + kMagic;
  std::memcpy(&bits, &p, 32);
  std::memcpy(&tb, &t, 32);
  std::memcpy(&mb, &magic, 32);
  bits += (tb - mb) << 23;  // t's low mantissa bits hold n
  std::memcpy(&p, &bits, 32);
  return p;
}

}  // namespace

SPECLOOP_CLONES
double SumExpBelow(const float* x, int64_t n, float shift) {
  v8 acc = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    v8 v;
    std::memcpy(&v, x + i, 32);
    v -= shift;
    v = v < -87.0f ? v8{} - 87.0f : v;
    acc += ExpClamped(v);
  }
  double sum = 0;
  for (int j = 0; j < 8; ++j) sum += acc[j];
  if (i < n) {  // the tail, padded with terms that count as nothing
    v8 v = v8{} - 87.0f;
    for (int64_t j = 0; i + j < n; ++j) v[j] = std::max(x[i + j] - shift, -87.0f);
    const v8 e = ExpClamped(v);
    for (int64_t j = 0; i + j < n; ++j) sum += e[j];
  }
  return sum;
}

SPECLOOP_CLONES
float ExpBelowInPlace(float* x, int64_t n, float shift) {
  v8 acc = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    v8 v;
    std::memcpy(&v, x + i, 32);
    v -= shift;
    v = v < -87.0f ? v8{} - 87.0f : v;
    const v8 e = ExpClamped(v);
    std::memcpy(x + i, &e, 32);
    acc += e;
  }
  float sum = 0;
  for (int j = 0; j < 8; ++j) sum += acc[j];
  if (i < n) {  // the tail, padded with terms that count as nothing
    v8 v = v8{} - 87.0f;
    for (int64_t j = 0; i + j < n; ++j) v[j] = std::max(x[i + j] - shift, -87.0f);
    const v8 e = ExpClamped(v);
    for (int64_t j = 0; i + j < n; ++j) sum += (x[i + j] = e[j]);
  }
  return sum;
}

// silu(g) = g * sigmoid(g), with sigmoid from e = exp(-|g|) in (0, 1]: 1 / (1 + e) for g >= 0,
// e / (1 + e) below (no overflow either way).
SPECLOOP_CLONES
void SiluMul(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    v8 g, u;
    std::memcpy(&g, gate + i, 32);
    std::memcpy(&u, up + i, 32);
    v8 a = g < 0.0f ? g : -g;  // -|g|
    a = a < -87.0f ? v8{} - 87.0f : a;
    const v8 e = ExpClamped(a);
    const v8 sig = (g < 0.0f ? e : v8{} + 1.0f) / (1.0f + e);
    const v8 r = g * sig * u;
    std::memcpy(out + i, &r, 32);
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

SPECLOOP_CLONES
void WeightedRowSum(const float* weights, const float* rows, int64_t n, int64_t dim, float* out,
                    bool accumulate) {
  int64_t d = 0;
  for (; d + 32 <= dim; d += 32) {  // 32 columns at a time: four 8-wide accumulators
    v8 a0 = {}, a1 = {}, a2 = {}, a3 = {};
    if (accumulate) {
      std::memcpy(&a0, out + d, 32);
      std::memcpy(&a1, out + d + 8, 32);
      std::memcpy(&a2, out + d + 16, 32);
      std::memcpy(&a3, out + d + 24, 32);
    }
    for (int64_t t = 0; t < n; ++t) {
      const float* r = rows + t * dim + d;
      const float w = weights[t];
      v8 u;
      std::memcpy(&u, r, 32); a0 += w * u;
      std::memcpy(&u, r + 8, 32); a1 += w * u;
      std::memcpy(&u, r + 16, 32); a2 += w * u;
      std::memcpy(&u, r + 24, 32); a3 += w * u;
    }
    std::memcpy(out + d, &a0, 32);
    std::memcpy(out + d + 8, &a1, 32);
    std::memcpy(out + d + 16, &a2, 32);
    std::memcpy(out + d + 24, &a3, 32);
  }
  for (; d < dim; ++d) {
    float acc = accumulate ? out[d] : 0.0f;
    for (int64_t t = 0; t < n; ++t) acc += weights[t] * rows[t * dim + d];
    out[d] = acc;
  }
}

}  // namespace specloop
