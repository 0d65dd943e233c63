// Reading a JSON integer into an int, for the config parsers of common/tokenizer.
#pragma once

#include <cstdint>
#include <limits>

#include <nlohmann/json.hpp>

namespace specloop {

// A JSON integer that fits an int. nlohmann's get<int>() would convert 1e300 or 2^40 (undefined
// behaviour, or a silently different number). False (and *out unchanged) otherwise.
inline bool JsonToInt(const nlohmann::json& v, int* out) {
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int>::max())) return false;
  } else if (!v.is_number_integer() || v.get<int64_t>() < std::numeric_limits<int>::min() ||
             v.get<int64_t>() > std::numeric_limits<int>::max()) {
    return false;
  }
  *out = static_cast<int>(v.get<int64_t>());
  return true;
}

}  // namespace specloop
