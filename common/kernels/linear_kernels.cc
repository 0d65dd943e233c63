#include "common/kernels/linear_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

namespace specloop {

namespace linear_avx2 {
void Run(const float* x, long M, long K, const void* w, int type, float* out, long ldo,
         long o_begin, long o_end, bool add);
void RunPacked(const float* x, long M, long K, long O, const void* w, int type, float* out,
               long ldo, long panel_begin, long panel_end, bool add);
}
namespace linear_avx512 {
void Run(const float* x, long M, long K, const void* w, int type, float* out, long ldo,
         long o_begin, long o_end, bool add);
void RunPacked(const float* x, long M, long K, long O, const void* w, int type, float* out,
               long ldo, long panel_begin, long panel_end, bool add);
}

namespace {

bool Supported(Isa isa) {
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
  __builtin_cpu_init();
  switch (isa) {
    case Isa::kGeneric: return true;
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
  }
  return false;
#else
  return isa == Isa::kGeneric;
#endif
}

Isa ChooseIsa() {
  const char* env = std::getenv("SPECLOOP_ISA");
  if (env != nullptr) {
    for (Isa isa : {Isa::kGeneric, Isa::kAvx2, Isa::kAvx512}) {
      if (IsaName(isa) == std::string(env) && Supported(isa)) return isa;
    }
  }
  if (Supported(Isa::kAvx512)) return Isa::kAvx512;
  if (Supported(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kGeneric;
}

float WeightAt(const void* w, WeightType type, int64_t i) {
  switch (type) {
    case WeightType::kFloat32: return static_cast<const float*>(w)[i];
    case WeightType::kFloat16: return HalfToFloat(static_cast<const uint16_t*>(w)[i]);
    case WeightType::kBFloat16: return BFloat16ToFloat(static_cast<const uint16_t*>(w)[i]);
  }
  return 0;
}

// Portable C++ for CPUs without AVX2: eight partial sums per output, then their sum.
void GenericLinear(const float* x, int64_t M, int64_t K, const void* w, WeightType type,
                   float* out, int64_t ldo, int64_t o_begin, int64_t o_end, bool add) {
  for (int64_t o = o_begin; o < o_end; ++o) {
    for (int64_t m = 0; m < M; ++m) {
      float part[8] = {};
      for (int64_t k = 0; k < K; ++k) part[k % 8] += x[m * K + k] * WeightAt(w, type, o * K + k);
      float s = 0;
      for (float p : part) s += p;
      float& d = out[m * ldo + o];
      d = add ? d + s : s;
    }
  }
}

// Portable C++: the same fused multiply-add chain per output as the vector variants.
void GenericPacked(const float* x, int64_t M, const PackedMatrix& w, float* out, int64_t ldo,
                   int64_t panel_begin, int64_t panel_end, bool add) {
  const int64_t K = w.cols();
  for (int64_t p = panel_begin; p < panel_end; ++p) {
    for (int64_t lane = 0; lane < 16 && p * 16 + lane < w.rows(); ++lane) {
      const int64_t o = p * 16 + lane;
      for (int64_t m = 0; m < M; ++m) {
        float acc = 0;
        for (int64_t k = 0; k < K; ++k) {
          acc = std::fma(WeightAt(w.data(), w.type(), (p * K + k) * 16 + lane), x[m * K + k],
                         acc);
        }
        float& d = out[m * ldo + o];
        d = add ? d + acc : acc;
      }
    }
  }
}

}  // namespace

PackedMatrix::PackedMatrix(const void* w, WeightType type, int64_t rows, int64_t cols)
    : rows_(rows), cols_(cols), type_(type) {
  const int64_t size = type == WeightType::kFloat32 ? 4 : 2;
  const int64_t total = ((panels() * kPanel * cols * size + 63) / 64) * 64;
  data_.reset(std::aligned_alloc(64, std::max<int64_t>(total, 64)));
  std::memset(data_.get(), 0, total);
  const char* src = static_cast<const char*>(w);
  char* dst = static_cast<char*>(data_.get());
  for (int64_t o = 0; o < rows; ++o) {
    const int64_t panel = o / kPanel, lane = o % kPanel;
    for (int64_t k = 0; k < cols; ++k) {
      std::memcpy(dst + ((panel * cols + k) * kPanel + lane) * size, src + (o * cols + k) * size,
                  size);
    }
  }
}

int64_t PackedMatrix::bytes() const {
  return panels() * kPanel * cols_ * (type_ == WeightType::kFloat32 ? 4 : 2);
}

void PackedMatrix::Free::operator()(void* p) const { std::free(p); }

void LinearPackedIsa(Isa isa, const float* x, int64_t M, const PackedMatrix& w, float* out,
                     int64_t ldo, int64_t panel_begin, int64_t panel_end, bool accumulate) {
  if (M <= 0 || panel_begin >= panel_end) return;
  const int type = static_cast<int>(w.type());
  switch (isa) {
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
    case Isa::kAvx512:
      linear_avx512::RunPacked(x, M, w.cols(), w.rows(), w.data(), type, out, ldo, panel_begin,
                               panel_end, accumulate);
      return;
    case Isa::kAvx2:
      linear_avx2::RunPacked(x, M, w.cols(), w.rows(), w.data(), type, out, ldo, panel_begin,
                             panel_end, accumulate);
      return;
#endif
    default:
      GenericPacked(x, M, w, out, ldo, panel_begin, panel_end, accumulate);
  }
}

void LinearPacked(const float* x, int64_t M, const PackedMatrix& w, float* out, int64_t ldo,
                  int64_t panel_begin, int64_t panel_end, bool accumulate) {
  LinearPackedIsa(ActiveIsa(), x, M, w, out, ldo, panel_begin, panel_end, accumulate);
}

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kGeneric: return "generic";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "?";
}

Isa ActiveIsa() {
  static const Isa isa = ChooseIsa();
  return isa;
}

std::vector<Isa> SupportedIsas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kGeneric, Isa::kAvx2, Isa::kAvx512}) {
    if (Supported(isa)) out.push_back(isa);
  }
  return out;
}

void LinearRowsIsa(Isa isa, const float* x, int64_t M, int64_t K, const void* w,
                   WeightType type, float* out, int64_t ldo, int64_t o_begin, int64_t o_end,
                   bool accumulate) {
  if (M <= 0 || o_begin >= o_end) return;
  switch (isa) {
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
    case Isa::kAvx512:
      linear_avx512::Run(x, M, K, w, static_cast<int>(type), out, ldo, o_begin, o_end,
                         accumulate);
      return;
    case Isa::kAvx2:
      linear_avx2::Run(x, M, K, w, static_cast<int>(type), out, ldo, o_begin, o_end,
                       accumulate);
      return;
#endif
    default:
      GenericLinear(x, M, K, w, type, out, ldo, o_begin, o_end, accumulate);
  }
}

void LinearRows(const float* x, int64_t M, int64_t K, const void* w, WeightType type,
                float* out, int64_t ldo, int64_t o_begin, int64_t o_end, bool accumulate) {
  LinearRowsIsa(ActiveIsa(), x, M, K, w, type, out, ldo, o_begin, o_end, accumulate);
}

float BFloat16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace specloop
