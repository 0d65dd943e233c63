#include "trainer/heldout_split.h"

namespace specloop {
namespace trainer {

namespace {

constexpr uint64_t kFnvOffset = 1469598103934665603ULL;

void Fnv1a(const unsigned char* p, size_t n, uint64_t* h) {
  for (size_t i = 0; i < n; ++i) {
    *h ^= p[i];
    *h *= 1099511628211ULL;
  }
}

// A finalizer (MurmurHash3's) spreads FNV's low-entropy high bits; the top 53 bits become a
// uniform double in [0, 1).
bool Below(uint64_t h, double fraction) {
  if (fraction <= 0) return false;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return static_cast<double>(h >> 11) * 0x1.0p-53 < fraction;
}

}  // namespace

bool IsHeldOutPrompt(const int32_t* ids, size_t n, double fraction) {
  uint64_t h = kFnvOffset;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t v = static_cast<uint32_t>(ids[i]);
    const unsigned char bytes[4] = {static_cast<unsigned char>(v), static_cast<unsigned char>(v >> 8),
                                    static_cast<unsigned char>(v >> 16),
                                    static_cast<unsigned char>(v >> 24)};
    Fnv1a(bytes, 4, &h);
  }
  return Below(h, fraction);
}

bool IsHeldOutKey(const std::string& key, double fraction) {
  uint64_t h = kFnvOffset;
  Fnv1a(reinterpret_cast<const unsigned char*>(key.data()), key.size(), &h);
  return Below(h, fraction);
}

}  // namespace trainer
}  // namespace specloop
