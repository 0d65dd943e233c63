#include "common/base/safetensors_header.h"

#include <limits>

#include <nlohmann/json.hpp>

namespace specloop {

using nlohmann::json;

size_t SafetensorsElementBytes(const std::string& dtype) {
  if (dtype == "F32" || dtype == "I32") return 4;
  if (dtype == "F16" || dtype == "BF16") return 2;
  if (dtype == "I64") return 8;
  if (dtype == "BOOL") return 1;  // EAGLE-3 heads' t2d
  return 0;
}

Status ParseSafetensorsHeader(const uint8_t* file, size_t size, const std::string& where,
                              SafetensorsHeader* out) {
  if (size < 8) {
    return Status::Corruption(where + ": file of " + std::to_string(size) +
                              " bytes is too short for a safetensors header");
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | file[i];
  if (header_len > size - 8) {
    return Status::Corruption(where + ": header length " + std::to_string(header_len) +
                              " runs past the end of the file (" + std::to_string(size) +
                              " bytes): truncated?");
  }
  json header = json::parse(file + 8, file + 8 + header_len, nullptr, false);
  if (!header.is_object()) return Status::Corruption(where + ": header is not a JSON object");
  const size_t data_size = size - 8 - header_len;

  SafetensorsHeader result;
  result.data_offset = 8 + header_len;
  for (auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string at = where + ": tensor '" + name + "'";
    if (!info.is_object() || !info["dtype"].is_string() || !info["shape"].is_array() ||
        !info["data_offsets"].is_array() || info["data_offsets"].size() != 2) {
      return Status::Corruption(at + " has a malformed header entry");
    }
    SafetensorsEntry e;
    e.name = name;
    e.dtype = info["dtype"].get<std::string>();
    e.element_bytes = SafetensorsElementBytes(e.dtype);
    if (e.element_bytes == 0) return Status::NotSupported(at + " has unsupported dtype " + e.dtype);
    // numel * element_bytes must fit in 64 bits: data_size bounds every valid tensor anyway.
    constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
    uint64_t numel = 1;
    bool overflow = false, empty = false;
    for (const auto& d : info["shape"]) {
      if (!d.is_number_unsigned() ||
          d.get<uint64_t>() > uint64_t{std::numeric_limits<int64_t>::max()}) {
        return Status::Corruption(at + " has a bad shape");
      }
      const uint64_t dim = d.get<uint64_t>();
      e.shape.push_back(static_cast<int64_t>(dim));
      empty |= dim == 0;
      if (dim != 0 && numel > kMax / dim) overflow = true;
      numel *= dim;
    }
    if (empty) numel = 0;  // a zero dimension makes any product empty
    if ((overflow && !empty) || numel > kMax / e.element_bytes) {
      return Status::Corruption(at + " has a shape too large for any file");
    }
    const auto& offs = info["data_offsets"];
    if (!offs[0].is_number_unsigned() || !offs[1].is_number_unsigned()) {
      return Status::Corruption(at + " has bad data_offsets");
    }
    e.begin = offs[0].get<uint64_t>();
    e.end = offs[1].get<uint64_t>();
    if (e.begin > e.end || e.end > data_size) {
      return Status::Corruption(at + " data [" + std::to_string(e.begin) + ", " +
                                std::to_string(e.end) + ") lies outside the " +
                                std::to_string(data_size) + " data bytes: truncated file?");
    }
    if (e.end - e.begin != numel * e.element_bytes) {
      return Status::Corruption(at + " holds " + std::to_string(e.end - e.begin) +
                                " bytes but its shape and dtype need " +
                                std::to_string(numel * e.element_bytes));
    }
    result.entries.push_back(std::move(e));
  }
  *out = std::move(result);
  return Status::OK();
}

}  // namespace specloop
