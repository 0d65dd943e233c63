// Safetensors headers (common/base/safetensors_header.h): the first bytes of a model file a user
// points the server at. Every entry that parses must lie inside the file and hold exactly its
// shape's bytes, so ReadSafetensors can view it without reading out of bounds.
#include <algorithm>

#include "common/base/safetensors_header.h"
#include "tests/fuzz/fuzz_util.h"

using namespace specloop;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  SafetensorsHeader h;
  if (!ParseSafetensorsHeader(data, size, "fuzz", &h).ok()) return 0;
  FUZZ_CHECK(h.data_offset >= 8 && h.data_offset <= size);
  for (const SafetensorsEntry& e : h.entries) {
    FUZZ_CHECK(e.begin <= e.end && e.end <= size - h.data_offset);
    // The element count and byte size, computed without wrapping (a wrapped product once
    // passed the size check: shape [2^32, 2^32] holds "0" bytes).
    uint64_t bytes = e.element_bytes;
    for (int64_t d : e.shape) FUZZ_CHECK(d >= 0);
    if (std::find(e.shape.begin(), e.shape.end(), 0) != e.shape.end()) {
      bytes = 0;
    } else {
      for (int64_t d : e.shape) {
        FUZZ_CHECK(!__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes));
      }
    }
    FUZZ_CHECK(bytes == e.end - e.begin);
  }
  return 0;
}
