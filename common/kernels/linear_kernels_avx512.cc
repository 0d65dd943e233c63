// LinearRows for AVX-512 (compiled with -mavx512f -mfma -mf16c): 16 float lanes; 32 vector
// registers hold a tile of up to 6 rows x 4 outputs (24 accumulators, 6 inputs, 1 weight), or
// for packed weights 12 rows x 32 outputs (24 accumulators, 2 weights, 1 broadcast input).
#include <immintrin.h>

namespace specloop {
namespace linear_avx512 {
namespace {

struct V {
  typedef __m512 vec;
  static constexpr int kLanes = 16, kMaxRows = 6, kCols = 4;
  static constexpr bool kFewRowsAskNext = true;  // see PackedTile
  static constexpr int kPackedRows = 12, kPackedVectors = 2;  // 24 accumulators
  static vec Broadcast(const float* p) { return _mm512_set1_ps(*p); }
  static void Store(float* p, vec v) { _mm512_storeu_ps(p, v); }
  static vec Add(vec a, vec b) { return _mm512_add_ps(a, b); }
  static vec Zero() { return _mm512_setzero_ps(); }
  static vec Fma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
  static float Sum(vec v) { return _mm512_reduce_add_ps(v); }
  static vec LoadF32(const float* p) { return _mm512_loadu_ps(p); }
  static vec LoadF16(const unsigned short* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static vec LoadBF16(const unsigned short* p) {
    const __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
  }
};

#define SPECLOOP_MAX_ROWS 6
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

}  // namespace linear_avx512
}  // namespace specloop
