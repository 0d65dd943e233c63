#include "buffer/crc32c.h"

#include <cstring>

namespace specloop {
namespace crc32c {

namespace {

struct Tables {
  uint32_t t[8][256];
  Tables() {
    for (uint32_t i = 0; i < 256; i++) {
      uint32_t c = i;
      for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {
      for (int s = 1; s < 8; s++) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
    }
  }
};

const Tables& GetTables() {
  static const Tables tables;
  return tables;
}

uint32_t ExtendPortable(uint32_t crc, const char* p, size_t n) {
  const Tables& tb = GetTables();
  const unsigned char* d = reinterpret_cast<const unsigned char*>(p);
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, d, 8);  // little-endian host assumed below (x86-64, aarch64)
    v ^= crc;
    crc = tb.t[7][v & 0xff] ^ tb.t[6][(v >> 8) & 0xff] ^ tb.t[5][(v >> 16) & 0xff] ^
          tb.t[4][(v >> 24) & 0xff] ^ tb.t[3][(v >> 32) & 0xff] ^ tb.t[2][(v >> 40) & 0xff] ^
          tb.t[1][(v >> 48) & 0xff] ^ tb.t[0][v >> 56];
    d += 8;
    n -= 8;
  }
  while (n--) crc = tb.t[0][(crc ^ *d++) & 0xff] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("sse4.2"))) uint32_t ExtendSse42(uint32_t crc, const char* p, size_t n) {
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = __builtin_ia32_crc32di(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n--) c32 = __builtin_ia32_crc32qi(c32, static_cast<unsigned char>(*p++));
  return c32;
}
bool HaveSse42() {
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
}
#endif

}  // namespace

uint32_t Extend(uint32_t init, const char* data, size_t n) {
  uint32_t crc = ~init;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (HaveSse42()) return ~ExtendSse42(crc, data, n);
#endif
  return ~ExtendPortable(crc, data, n);
}

}  // namespace crc32c
}  // namespace specloop
