#include "common/cpu_kernels.h"

#include <algorithm>
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

typedef int i8 __attribute__((vector_size(32)));

typedef unsigned u32x8 __attribute__((vector_size(32)));

inline float HSum(v8 v) {
  float s = 0;
  for (int i = 0; i < 8; ++i) s += v[i];
  return s;
}

// Pairwise sums within 128-bit halves, as AVX's vhaddps:
// [a0+a1, a2+a3, b0+b1, b2+b3, a4+a5, a6+a7, b4+b5, b6+b7].
inline v8 HAdd(v8 a, v8 b) {
  const i8 even = {0, 2, 8, 10, 4, 6, 12, 14}, odd = {1, 3, 9, 11, 5, 7, 13, 15};
  return __builtin_shuffle(a, b, even) + __builtin_shuffle(a, b, odd);
}

// Lane j of the result is the sum of all lanes of v[j]: eight horizontal sums in a tree of
// shuffles and adds, not eight separate reductions.
inline v8 Reduce8(v8 a0, v8 a1, v8 a2, v8 a3, v8 a4, v8 a5, v8 a6, v8 a7) {
  const v8 h0 = HAdd(HAdd(a0, a1), HAdd(a2, a3));  // [s0..s3 of the low halves | high halves]
  const v8 h1 = HAdd(HAdd(a4, a5), HAdd(a6, a7));
  const i8 lo = {0, 1, 2, 3, 8, 9, 10, 11}, hi = {4, 5, 6, 7, 12, 13, 14, 15};
  return __builtin_shuffle(h0, h1, lo) + __builtin_shuffle(h0, h1, hi);
}

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

// out[r, o] (+)= dot(x[r], w[o]): 4 weight rows x 2 input rows per pass (8 accumulators).
SPECLOOP_CLONES
void SmallGemm(const float* x, const float* w, float* out, int64_t M, int64_t K, int64_t O,
               bool add) {
  const int64_t K8 = K / 8 * 8;
  auto store = [&](int64_t r, int64_t o, float s) { float& d = out[r * O + o]; d = add ? d + s : s; };
  int64_t o = 0;
  for (; o + 4 <= O; o += 4) {
    const float* w0 = w + o * K;
    const float* w1 = w0 + K;
    const float* w2 = w1 + K;
    const float* w3 = w2 + K;
    int64_t r = 0;
    for (; r + 2 <= M; r += 2) {
      const float* x0 = x + r * K;
      const float* x1 = x0 + K;
      v8 a00 = {}, a01 = {}, a02 = {}, a03 = {}, a10 = {}, a11 = {}, a12 = {}, a13 = {};
      for (int64_t k = 0; k < K8; k += 8) {
        v8 u, v, t;
        std::memcpy(&u, x0 + k, 32);
        std::memcpy(&v, x1 + k, 32);
        std::memcpy(&t, w0 + k, 32); a00 += t * u; a10 += t * v;
        std::memcpy(&t, w1 + k, 32); a01 += t * u; a11 += t * v;
        std::memcpy(&t, w2 + k, 32); a02 += t * u; a12 += t * v;
        std::memcpy(&t, w3 + k, 32); a03 += t * u; a13 += t * v;
      }
      const v8 sums = Reduce8(a00, a01, a02, a03, a10, a11, a12, a13);
      float s0[4] = {sums[0], sums[1], sums[2], sums[3]};
      float s1[4] = {sums[4], sums[5], sums[6], sums[7]};
      const float* ws[4] = {w0, w1, w2, w3};
      for (int j = 0; j < 4; ++j) {
        for (int64_t k = K8; k < K; ++k) { s0[j] += ws[j][k] * x0[k]; s1[j] += ws[j][k] * x1[k]; }
        store(r, o + j, s0[j]);
        store(r + 1, o + j, s1[j]);
      }
    }
    for (; r < M; ++r) {
      const float* x0 = x + r * K;
      v8 a0 = {}, a1 = {}, a2 = {}, a3 = {};
      for (int64_t k = 0; k < K8; k += 8) {
        v8 u, t;
        std::memcpy(&u, x0 + k, 32);
        std::memcpy(&t, w0 + k, 32); a0 += t * u;
        std::memcpy(&t, w1 + k, 32); a1 += t * u;
        std::memcpy(&t, w2 + k, 32); a2 += t * u;
        std::memcpy(&t, w3 + k, 32); a3 += t * u;
      }
      float s[4] = {HSum(a0), HSum(a1), HSum(a2), HSum(a3)};
      const float* ws[4] = {w0, w1, w2, w3};
      for (int j = 0; j < 4; ++j) {
        for (int64_t k = K8; k < K; ++k) s[j] += ws[j][k] * x0[k];
        store(r, o + j, s[j]);
      }
    }
  }
  for (; o < O; ++o) {
    for (int64_t r = 0; r < M; ++r) {
      float s = 0;
      for (int64_t k = 0; k < K; ++k) s += w[o * K + k] * x[r * K + k];
      store(r, o, s);
    }
  }
}

SPECLOOP_CLONES
void WeightedRowSum(const float* weights, const float* rows, int64_t n, int64_t dim, float* out) {
  int64_t d = 0;
  for (; d + 32 <= dim; d += 32) {  // 32 columns at a time: four 8-wide accumulators
    v8 a0 = {}, a1 = {}, a2 = {}, a3 = {};
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
    float acc = 0.0f;
    for (int64_t t = 0; t < n; ++t) acc += weights[t] * rows[t * dim + d];
    out[d] = acc;
  }
}

}  // namespace specloop
