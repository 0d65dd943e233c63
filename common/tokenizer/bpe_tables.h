// The open-addressing tables of the BPE models (byte_bpe, sp_bpe): sizes, the hash and the key
// of a merge pair. Internal to common/tokenizer.
#pragma once

#include <cstddef>
#include <cstdint>

namespace specloop {
namespace bpe {

// An empty slot of a table of 64-bit entries.
constexpr uint64_t kEmpty = ~0ULL;

// A power of two at least twice `n` (tables stay at most half full).
inline size_t TableSize(size_t n) {
  size_t size = 16;
  while (size < 2 * n) size *= 2;
  return size;
}

// A 64-bit finalizer (MurmurHash3's): every key bit moves the slot.
inline uint64_t MixBits(uint64_t key) {
  key ^= key >> 33;
  key *= 0xff51afd7ed558ccdULL;
  key ^= key >> 33;
  return key;
}

// The key of the merge of `left` then `right`.
inline uint64_t PairKey(int left, int right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace bpe
}  // namespace specloop
