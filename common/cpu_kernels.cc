#include "common/cpu_kernels.h"

#include <cstring>

namespace specloop {

namespace {

typedef float v8 __attribute__((vector_size(32)));

inline float HSum(v8 v) {
  float s = 0;
  for (int i = 0; i < 8; ++i) s += v[i];
  return s;
}

}  // namespace

// out[r, o] (+)= dot(x[r], w[o]): 4 weight rows x 2 input rows per pass (8 accumulators).
__attribute__((target_clones("arch=x86-64-v3", "default")))
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
      float s0[4] = {HSum(a00), HSum(a01), HSum(a02), HSum(a03)};
      float s1[4] = {HSum(a10), HSum(a11), HSum(a12), HSum(a13)};
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

__attribute__((target_clones("arch=x86-64-v3", "default")))
float Dot(const float* a, const float* b, int64_t n) {
  const int64_t n8 = n / 8 * 8;
  v8 acc = {};
  for (int64_t i = 0; i < n8; i += 8) {
    v8 u, v;
    std::memcpy(&u, a + i, 32);
    std::memcpy(&v, b + i, 32);
    acc += u * v;
  }
  float s = HSum(acc);
  for (int64_t i = n8; i < n; ++i) s += a[i] * b[i];
  return s;
}

__attribute__((target_clones("arch=x86-64-v3", "default")))
void Axpy(float alpha, const float* x, float* y, int64_t n) {
  const int64_t n8 = n / 8 * 8;
  for (int64_t i = 0; i < n8; i += 8) {
    v8 u, v;
    std::memcpy(&u, x + i, 32);
    std::memcpy(&v, y + i, 32);
    v += alpha * u;
    std::memcpy(y + i, &v, 32);
  }
  for (int64_t i = n8; i < n; ++i) y[i] += alpha * x[i];
}

}  // namespace specloop
