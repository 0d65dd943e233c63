#include "common/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "common/model_config.h"

namespace specloop {

using nlohmann::json;

namespace {

// A read-only mapping of a whole file; unmapped when the last tensor viewing it goes away.
struct Mapping {
  void* data = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (data != nullptr) munmap(data, size);
  }
};

bool DtypeOf(const std::string& name, at::ScalarType* type, size_t* bytes) {
  static const std::map<std::string, std::pair<at::ScalarType, size_t>> kTypes = {
      {"F32", {at::kFloat, 4}}, {"F16", {at::kHalf, 2}}, {"BF16", {at::kBFloat16, 2}},
      {"I32", {at::kInt, 4}},   {"I64", {at::kLong, 8}},
  };
  auto it = kTypes.find(name);
  if (it == kTypes.end()) return false;
  *type = it->second.first;
  *bytes = it->second.second;
  return true;
}

const char* DtypeName(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "F32";
    case at::kHalf: return "F16";
    case at::kBFloat16: return "BF16";
    case at::kInt: return "I32";
    case at::kLong: return "I64";
    default: return nullptr;
  }
}

}  // namespace

Status ReadSafetensors(const std::string& path, TensorMap* out) {
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return Status::NotFound(path + ": cannot open");
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return Status::IOError(path + ": cannot stat");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    close(fd);
    return Status::Corruption(path + ": file of " + std::to_string(size) +
                              " bytes is too short for a safetensors header");
  }
  auto map = std::make_shared<Mapping>();
  map->data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);  // copy-on-write: in-place updates never reach the file
  close(fd);
  if (map->data == MAP_FAILED) {
    map->data = nullptr;
    return Status::IOError(path + ": mmap failed");
  }
  map->size = size;
  const auto* base = static_cast<const uint8_t*>(map->data);

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base[i];
  if (header_len > size - 8) {
    return Status::Corruption(path + ": header length " + std::to_string(header_len) +
                              " runs past the end of the file (" + std::to_string(size) +
                              " bytes): truncated?");
  }
  json header = json::parse(base + 8, base + 8 + header_len, nullptr, false);
  if (!header.is_object()) return Status::Corruption(path + ": header is not a JSON object");
  const uint8_t* data = base + 8 + header_len;
  const size_t data_size = size - 8 - header_len;

  TensorMap result;
  for (auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = path + ": tensor '" + name + "'";
    if (!info.is_object() || !info["dtype"].is_string() || !info["shape"].is_array() ||
        !info["data_offsets"].is_array() || info["data_offsets"].size() != 2) {
      return Status::Corruption(where + " has a malformed header entry");
    }
    at::ScalarType type;
    size_t elem = 0;
    const std::string dtype = info["dtype"].get<std::string>();
    if (!DtypeOf(dtype, &type, &elem)) {
      return Status::NotSupported(where + " has unsupported dtype " + dtype);
    }
    std::vector<int64_t> shape;
    uint64_t numel = 1;
    for (const auto& d : info["shape"]) {
      if (!d.is_number_unsigned()) return Status::Corruption(where + " has a bad shape");
      shape.push_back(d.get<int64_t>());
      numel *= d.get<uint64_t>();
    }
    const auto& offs = info["data_offsets"];
    if (!offs[0].is_number_unsigned() || !offs[1].is_number_unsigned()) {
      return Status::Corruption(where + " has bad data_offsets");
    }
    const uint64_t begin = offs[0].get<uint64_t>(), end = offs[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return Status::Corruption(where + " data [" + std::to_string(begin) + ", " +
                                std::to_string(end) + ") lies outside the " +
                                std::to_string(data_size) + " data bytes: truncated file?");
    }
    if (end - begin != numel * elem) {
      return Status::Corruption(where + " holds " + std::to_string(end - begin) +
                                " bytes but its shape and dtype need " +
                                std::to_string(numel * elem));
    }
    void* ptr = const_cast<uint8_t*>(data + begin);
    at::Tensor t;
    if (reinterpret_cast<uintptr_t>(ptr) % elem == 0) {
      t = at::from_blob(ptr, shape, [map](void*) {}, at::TensorOptions().dtype(type));
    } else {
      t = at::empty(shape, at::TensorOptions().dtype(type));
      std::memcpy(t.data_ptr(), ptr, end - begin);
    }
    result.emplace(name, std::move(t));
  }
  for (auto& kv : result) (*out)[kv.first] = std::move(kv.second);
  return Status::OK();
}

Status ReadModelWeights(const std::string& dir, TensorMap* out) {
  std::string index_text;
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (!ReadFileToString(index_path, &index_text).ok()) {
    return ReadSafetensors(dir + "/model.safetensors", out);
  }
  json index = json::parse(index_text, nullptr, false);
  if (!index.is_object() || !index["weight_map"].is_object()) {
    return Status::Corruption(index_path + ": no weight_map object");
  }
  std::set<std::string> shards;
  for (auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string()) return Status::Corruption(index_path + ": bad entry for " + name);
    const std::string f = file.get<std::string>();
    if (f.find('/') != std::string::npos) {
      return Status::Corruption(index_path + ": shard name with a path: " + f);
    }
    shards.insert(f);
  }
  for (const auto& shard : shards) {
    SPECLOOP_RETURN_IF_ERROR(ReadSafetensors(dir + "/" + shard, out));
  }
  for (auto& [name, file] : index["weight_map"].items()) {
    if (!out->count(name)) {
      return Status::Corruption(index_path + ": tensor " + name + " not found in " +
                                file.get<std::string>());
    }
  }
  return Status::OK();
}

Status WriteSafetensors(const std::string& path,
                        const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> cpu;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    const char* dtype = DtypeName(t.scalar_type());
    if (dtype == nullptr) return Status::NotSupported("cannot write dtype of " + name);
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    const uint64_t bytes = c.numel() * c.element_size();
    header[name] = {{"dtype", dtype}, {"shape", c.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    cpu.push_back(std::move(c));
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // pad so the data starts 8-byte aligned
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return Status::IOError("cannot create " + tmp);
    uint64_t n = h.size();
    char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    f.write(len, 8);
    f.write(h.data(), h.size());
    for (const auto& c : cpu) {
      f.write(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
    }
    f.flush();
    if (!f) return Status::IOError("cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return Status::IOError("cannot rename " + tmp + " to " + path);
  }
  return Status::OK();
}

}  // namespace specloop
