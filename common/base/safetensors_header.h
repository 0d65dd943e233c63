// SafetensorsHeader: the parsed, checked header of a safetensors file (the format is described
// in common/model/safetensors.h). Pure; no LibTorch: this is the part of reading a weight file that
// sees the file's bytes before any tensor exists, so it is fuzzed (tests/fuzz).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/base/status.h"

namespace specloop {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;           // one of F32, F16, BF16, I32, I64, BOOL
  size_t element_bytes = 0;    // 4, 2, 2, 4, 8
  std::vector<int64_t> shape;  // every dimension >= 0
  // The tensor's bytes are data[begin, end) of the data section (after the header).
  uint64_t begin = 0, end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;  // in the header's (sorted JSON) key order
  size_t data_offset = 0;                 // where the data section starts in the file
};

// Bytes per element of a safetensors dtype name; 0 for a dtype this engine does not read.
size_t SafetensorsElementBytes(const std::string& dtype);

// Parses the header of the `size` bytes of a whole file at `file`. Corruption when the header
// length runs past the file, the header is not a JSON object of well-formed entries, or an
// entry's [begin, end) lies outside the data section or does not hold exactly
// numel * element_bytes bytes (numel overflowing 64 bits included); NotSupported for an unknown
// dtype. `where` prefixes every message (e.g. the path). Never reads outside [file, file+size).
Status ParseSafetensorsHeader(const uint8_t* file, size_t size, const std::string& where,
                              SafetensorsHeader* out);

}  // namespace specloop
