// LinearRows for AVX2 (compiled with -mavx2 -mfma -mf16c): 8 float lanes; 16 vector registers
// hold a tile of up to 4 rows x 2 outputs (8 accumulators, 4 inputs, 1 weight), or for packed
// weights 6 rows x 16 outputs (12 accumulators, 2 weights, 1 broadcast input).
#include <immintrin.h>

namespace specloop {
namespace linear_avx2 {
namespace {

struct V {
  typedef __m256 vec;
  static constexpr int kLanes = 8, kMaxRows = 4, kCols = 2;
  static constexpr bool kFewRowsAskNext = false;  // see PackedTile
  static constexpr int kPackedRows = 6, kPackedVectors = 2;  // 12 accumulators
  static vec Broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  static void Store(float* p, vec v) { _mm256_storeu_ps(p, v); }
  static vec Add(vec a, vec b) { return _mm256_add_ps(a, b); }
  static vec Zero() { return _mm256_setzero_ps(); }
  static vec Fma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
  static float Sum(vec v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static vec LoadF32(const float* p) { return _mm256_loadu_ps(p); }
  static vec LoadF16(const unsigned short* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static vec LoadBF16(const unsigned short* p) {
    const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
  }
};

#define SPECLOOP_MAX_ROWS 4
#include "common/kernels/linear_kernels_impl.h"
#undef SPECLOOP_MAX_ROWS

}  // namespace

void Run(const float* x, long M, long K, const void* w, int type, float* out, long ldo,
         long o_begin, long o_end, bool add) {
  LinearAny(x, M, K, w, type, out, ldo, o_begin, o_end, add);
}

void RunPacked(const float* x, long M, long K, long O, const void* w, int type, float* out,
               long ldo, long panel_begin, long panel_end, bool add) {
  PackedAny(x, M, K, O, w, type, out, ldo, panel_begin, panel_end, add);
}

}  // namespace linear_avx2
}  // namespace specloop
