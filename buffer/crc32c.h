// CRC-32C (Castagnoli), as used by leveldb, RocksDB and iSCSI. Uses SSE4.2 when the CPU has it,
// a table otherwise; both give the same value. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace specloop {
namespace crc32c {

// CRC-32C of data[0, n) continuing from `init` (the crc of a preceding chunk; 0 to start).
uint32_t Extend(uint32_t init, const char* data, size_t n);

inline uint32_t Value(const char* data, size_t n) { return Extend(0, data, n); }

}  // namespace crc32c
}  // namespace specloop
