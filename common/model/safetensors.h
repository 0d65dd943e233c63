// Safetensors: reading (memory-mapped, zero-copy where the dtype allows) and writing the
// Hugging Face weight format: an 8-byte little-endian header length, a JSON header mapping
// names to {dtype, shape, data_offsets}, then the raw little-endian tensor bytes.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "common/base/status.h"

namespace specloop {

using TensorMap = std::map<std::string, at::Tensor>;

// Maps `path` and fills `out` with one CPU tensor per entry. The tensors view the mapped file
// (the mapping lives as long as any of them) when their data is suitably aligned, and own a
// copy otherwise. Supported dtypes: F32, F16, BF16, I32, I64, BOOL. Every offset and size is
// checked against the file before any tensor is made: a truncated or inconsistent file gives
// Corruption, an unknown dtype NotSupported.
Status ReadSafetensors(const std::string& path, TensorMap* out);

// Reads a model directory's weights: DIR/model.safetensors, or the shards listed in
// DIR/model.safetensors.index.json.
Status ReadModelWeights(const std::string& dir, TensorMap* out);

// Writes `tensors` (any device; written as contiguous CPU data in their own dtype) with
// optional string metadata. Writes to a temporary file and renames it over `path`, so readers
// never see a partial file.
Status WriteSafetensors(const std::string& path,
                        const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

}  // namespace specloop
