// The body of LinearRows, instantiated once per instruction set by linear_kernels_avx2.cc and
// linear_kernels_avx512.cc, each compiled with its own -m flags. Include it inside an anonymous
// namespace after defining the vector traits `V` (see those files): everything here then has
// internal linkage, so no inline function compiled for AVX-512 can be picked by the linker for
// code that runs on a CPU without it. Includes nothing itself for the same reason (the includer
// brings <immintrin.h>).
//
// V provides: vec, kLanes, kMaxRows, kCols, Zero(), Fma(a, b, c) = a * b + c, Sum(v),
// LoadF32/LoadF16/LoadBF16(p) (kLanes weights as floats),
// Broadcast(p), Store(p, v), Add(a, b), kPackedRows, kPackedVectors,
// kFewRowsAskNext; the includer defines SPECLOOP_MAX_ROWS = V::kMaxRows for LinearRows' tile
// switch.
//
// A tile multiplies MR input rows by NR weight rows: per step of kLanes along K it loads MR
// input vectors and NR weight vectors and does MR * NR fused multiply-adds, so each weight
// vector loaded from memory feeds MR rows. The accumulator of (row, output) sees the same
// sequence of operations whatever MR, NR or the row's place in the block: results do not
// depend on the batch.

typedef V::vec vec;

struct F32 {
  typedef float T;
  static vec Load(const T* p) { return V::LoadF32(p); }
  static float Scalar(T w) { return w; }
};
struct F16 {
  typedef unsigned short T;
  static vec Load(const T* p) { return V::LoadF16(p); }
  static float Scalar(T w) { return _cvtsh_ss(w); }  // F16C
};
struct BF16 {
  typedef unsigned short T;
  static vec Load(const T* p) { return V::LoadBF16(p); }
  static float Scalar(T w) {
    const unsigned bits = static_cast<unsigned>(w) << 16;
    float f;
    __builtin_memcpy(&f, &bits, 4);
    return f;
  }
};

template <class W, int MR, int NR>
inline void Tile(const float* x, long K, const typename W::T* w, float* out, long ldo,
                 bool add) {
  vec acc[MR][NR];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) acc[r][j] = V::Zero();
  }
  long k = 0;
  for (; k + V::kLanes <= K; k += V::kLanes) {
    vec xv[MR];
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) xv[r] = V::LoadF32(x + r * K + k);
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) {
      const vec wv = W::Load(w + j * K + k);
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) acc[r][j] = V::Fma(wv, xv[r], acc[r][j]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int j = 0; j < NR; ++j) {
      float s = V::Sum(acc[r][j]);
      for (long t = k; t < K; ++t) s += x[r * K + t] * W::Scalar(w[j * K + t]);
      float& d = out[r * ldo + j];
      d = add ? d + s : s;
    }
  }
}

// Rows [0, M) against outputs [o, o + NR), in chunks of at most kMaxRows rows of near-equal
// size (7 rows run as 4 + 3, not 6 + 1): the weight tile stays in cache for the later chunks.
template <class W, int NR>
inline void Columns(const float* x, long M, long K, const typename W::T* w, float* out,
                    long ldo, bool add) {
  const long chunks = (M + V::kMaxRows - 1) / V::kMaxRows;
  long m = 0;
  for (long c = 0; c < chunks; ++c) {
    const long rows = (M - m) / (chunks - c);
    const float* xm = x + m * K;
    float* om = out + m * ldo;
    switch (rows) {
#define SPECLOOP_TILE_CASE(R) \
  case R: Tile<W, R, NR>(xm, K, w, om, ldo, add); break;
      SPECLOOP_TILE_CASE(1)
      SPECLOOP_TILE_CASE(2)
      SPECLOOP_TILE_CASE(3)
      SPECLOOP_TILE_CASE(4)
#if SPECLOOP_MAX_ROWS > 4
      SPECLOOP_TILE_CASE(5)
      SPECLOOP_TILE_CASE(6)
#endif
#undef SPECLOOP_TILE_CASE
    }
    m += rows;
  }
}

template <class W>
void Linear(const float* x, long M, long K, const void* weights, float* out, long ldo,
            long o_begin, long o_end, bool add) {
  const typename W::T* w = static_cast<const typename W::T*>(weights);
  long o = o_begin;
  for (; o + V::kCols <= o_end; o += V::kCols) {
    Columns<W, V::kCols>(x, M, K, w + o * K, out + o, ldo, add);
  }
  for (; o < o_end; ++o) Columns<W, 1>(x, M, K, w + o * K, out + o, ldo, add);
}

void LinearAny(const float* x, long M, long K, const void* w, int type, float* out, long ldo,
               long o_begin, long o_end, bool add) {
  switch (type) {
    case 0: Linear<F32>(x, M, K, w, out, ldo, o_begin, o_end, add); break;
    case 1: Linear<F16>(x, M, K, w, out, ldo, o_begin, o_end, add); break;
    default: Linear<BF16>(x, M, K, w, out, ldo, o_begin, o_end, add); break;
  }
}

// LinearPacked: weights in panels of 16 outputs stored [K][16] (PackedMatrix). A tile holds
// MR rows x NV vectors of outputs (NV * kLanes outputs within one or two panels): per k it
// loads NV weight vectors and broadcasts MR input scalars, MR * NV fused multiply-adds. Each
// output is one multiply-add chain over k in order. `next`: how many elements ahead of this
// tile's panels the next tile's start (0: none, or not to be asked for).
//
// Each panel is one sequential stream, and the loads ask for weights ahead of use, into L2:
// every tile asks for its own panels kNearSteps columns (2 KB of float32) ahead. A tile of one
// or two rows of float32 computes fast enough for that to keep pace with memory. A tile of more
// rows computes long enough between loads that near requests alone left the memory idle: it
// also asks for the next tile's weights as it reads its own (`next`, a whole tile ahead). So
// does every tile of 16-bit weights where V::kFewRowsAskNext (AVX-512): a 16-bit column holds
// half the bytes, and near requests alone left the memory idle at one and two rows too (the
// same requests made float32's one-row tile slower, and AVX2's 16-bit one). What a forward of
// n rows costs against one: build/bench/engine_bench (bench/RESULTS.md).
constexpr long kNearSteps = 32;

template <class W, int MR, int NV>
inline void PackedTile(const float* x, long K, const typename W::T* panel, long panel_stride,
                       float* out, long ldo, long valid, bool add, long next) {
  vec acc[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = V::Zero();
  }
  const typename W::T* p[NV];
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    const long off = v * V::kLanes;  // output offset within the tile
    p[v] = panel + off / 16 * panel_stride + off % 16;
  }
  for (long k = 0; k < K; ++k) {
    vec wv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      __builtin_prefetch(p[v] + (k + kNearSteps) * 16, 0, 1);
      if ((MR > 2 || (sizeof(typename W::T) == 2 && V::kFewRowsAskNext)) && next != 0) {
        __builtin_prefetch(p[v] + next + k * 16, 0, 1);
      }
      wv[v] = W::Load(p[v] + k * 16);
    }
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const vec xb = V::Broadcast(x + r * K + k);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = V::Fma(wv[v], xb, acc[r][v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      float* d = out + r * ldo + v * V::kLanes;
      const long n = valid - v * V::kLanes;
      if (n >= V::kLanes) {
        V::Store(d, add ? V::Add(V::LoadF32(d), acc[r][v]) : acc[r][v]);
      } else if (n > 0) {
        float lanes[V::kLanes];
        V::Store(lanes, acc[r][v]);
        for (long i = 0; i < n; ++i) d[i] = add ? d[i] + lanes[i] : lanes[i];
      }
    }
  }
}

template <class W, int NV, int kMaxRows>
inline void PackedColumns(const float* x, long M, long K, const typename W::T* panel,
                          float* out, long ldo, long valid, bool add, long next) {
  const long chunks = (M + kMaxRows - 1) / kMaxRows;
  long m = 0;
  for (long c = 0; c < chunks; ++c) {
    const long rows = (M - m) / (chunks - c);
    const float* xm = x + m * K;
    float* om = out + m * ldo;
    switch (rows) {
#define SPECLOOP_TILE_CASE(R)                                                              \
  case R:                                                                                  \
    if constexpr (R <= kMaxRows) {                                                         \
      PackedTile<W, R, NV>(xm, K, panel, K * 16, om, ldo, valid, add, c ? 0 : next);       \
    }                                                                                      \
    break;
      SPECLOOP_TILE_CASE(1)
      SPECLOOP_TILE_CASE(2)
      SPECLOOP_TILE_CASE(3)
      SPECLOOP_TILE_CASE(4)
      SPECLOOP_TILE_CASE(5)
      SPECLOOP_TILE_CASE(6)
      SPECLOOP_TILE_CASE(7)
      SPECLOOP_TILE_CASE(8)
      SPECLOOP_TILE_CASE(9)
      SPECLOOP_TILE_CASE(10)
      SPECLOOP_TILE_CASE(11)
      SPECLOOP_TILE_CASE(12)
#undef SPECLOOP_TILE_CASE
    }
    m += rows;
  }
}

// Up to kPackedRows rows: tiles of kPackedVectors vectors of outputs, each weight vector loaded
// (and converted, for 16-bit weights) once and used for every row. More rows (a verification of
// more positions, a batch of sequences, a prompt): chunks of at most kPackedRows rows of
// near-equal size, the later chunks reading the tile's weights again from cache. A tile of one
// vector of outputs and every row at once (each 16-bit weight converted once per call) took
// 1.3-1.6x the chunks' time at 16 rows on a core with two 512-bit FMA pipes (Zen 5; engine_bench
// in bench/RESULTS.md): one broadcast load per multiply-add bounds it by the loads. The tile
// shape changes how many rows share a loaded weight, never an output's multiply-add chain.
template <class W>
void Packed(const float* x, long M, long K, long O, const void* weights, float* out, long ldo,
            long panel_begin, long panel_end, bool add) {
  const typename W::T* w = static_cast<const typename W::T*>(weights);
  long o = panel_begin * 16;
  const long end = panel_end * 16;
  constexpr long kTile = V::kPackedVectors * V::kLanes;  // outputs per tile: 16 or 32
  for (; o + kTile <= end; o += kTile) {
    const long next = o + kTile < end ? kTile * K : 0;  // the next tile, elements ahead
    PackedColumns<W, V::kPackedVectors, V::kPackedRows>(x, M, K, w + o * K, out + o, ldo, O - o,
                                                       add, next);
  }
  if (o < end) {  // one panel of 16 left where a tile holds two
    PackedColumns<W, 16 / V::kLanes, V::kPackedRows>(x, M, K, w + o * K, out + o, ldo, O - o,
                                                     add, 0);
  }
}

void PackedAny(const float* x, long M, long K, long O, const void* w, int type, float* out,
               long ldo, long panel_begin, long panel_end, bool add) {
  switch (type) {
    case 0: Packed<F32>(x, M, K, O, w, out, ldo, panel_begin, panel_end, add); break;
    case 1: Packed<F16>(x, M, K, O, w, out, ldo, panel_begin, panel_end, add); break;
    default: Packed<BF16>(x, M, K, O, w, out, ldo, panel_begin, panel_end, add); break;
  }
}
