#include "common/model/safetensors.h"

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

#include "common/base/safetensors_header.h"
#include "common/tokenizer/model_config.h"

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

at::ScalarType DtypeOf(const std::string& name) {
  if (name == "F16") return at::kHalf;
  if (name == "BF16") return at::kBFloat16;
  if (name == "I32") return at::kInt;
  if (name == "I64") return at::kLong;
  if (name == "BOOL") return at::kBool;
  return at::kFloat;  // "F32": ParseSafetensorsHeader admits no other dtype
}

const char* DtypeName(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "F32";
    case at::kHalf: return "F16";
    case at::kBFloat16: return "BF16";
    case at::kInt: return "I32";
    case at::kLong: return "I64";
    case at::kBool: return "BOOL";
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

  SafetensorsHeader header;
  SPECLOOP_RETURN_IF_ERROR(ParseSafetensorsHeader(base, size, path, &header));
  const uint8_t* data = base + header.data_offset;

  TensorMap result;
  for (const SafetensorsEntry& e : header.entries) {
    const at::ScalarType type = DtypeOf(e.dtype);
    void* ptr = const_cast<uint8_t*>(data + e.begin);
    at::Tensor t;
    if (reinterpret_cast<uintptr_t>(ptr) % e.element_bytes == 0) {
      t = at::from_blob(ptr, e.shape, [map](void*) {}, at::TensorOptions().dtype(type));
    } else {
      t = at::empty(e.shape, at::TensorOptions().dtype(type));
      std::memcpy(t.data_ptr(), ptr, e.end - e.begin);
    }
    result.emplace(e.name, std::move(t));
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
