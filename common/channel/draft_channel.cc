// The parts of the draft channel that touch no socket: announcements, version names, SHA-256
// and the checkpoint bundle (format in draft_channel.h).
#include "common/channel/draft_channel.h"

#include <openssl/evp.h>
#include <zmq.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/tokenizer/model_config.h"

namespace specloop {

namespace {

constexpr char kBundleMagic[] = "SPECLOOP-CKPT 1\n";
const char* const kBundleFiles[] = {"config.json", "meta.json", "model.safetensors"};

bool IsHex64(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::string ToHex(const unsigned char* d, unsigned n) {
  static const char* kDigits = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (unsigned i = 0; i < n; ++i) {
    s[2 * i] = kDigits[d[i] >> 4];
    s[2 * i + 1] = kDigits[d[i] & 15];
  }
  return s;
}

}  // namespace

std::string DraftAnnouncement::ToJson() const {
  nlohmann::json j = {{"version", version}, {"sha256", sha256}, {"bytes", bytes}};
  if (!config_sha256.empty()) j["config_sha256"] = config_sha256;
  return j.dump();
}

Status DraftAnnouncement::FromJson(const std::string& json, DraftAnnouncement* out) {
  nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Status::InvalidArgument("announcement is not a JSON object");
  auto uint_field = [&](const char* k) {
    return j.contains(k) && j[k].is_number_unsigned();
  };
  if (!uint_field("version") || j["version"].get<uint64_t>() == 0 ||
      j["version"].get<uint64_t>() > kMaxDraftVersion || !uint_field("bytes") ||
      !j.contains("sha256") || !j["sha256"].is_string() ||
      !IsHex64(j["sha256"].get<std::string>())) {
    return Status::InvalidArgument("announcement needs a version in 1.." +
                                   std::to_string(kMaxDraftVersion) + ", bytes and a hex sha256");
  }
  DraftAnnouncement a;
  a.version = j["version"].get<uint64_t>();
  a.bytes = j["bytes"].get<uint64_t>();
  a.sha256 = j["sha256"].get<std::string>();
  if (j.contains("config_sha256") && j["config_sha256"].is_string()) {
    a.config_sha256 = j["config_sha256"].get<std::string>();
  }
  *out = a;
  return Status::OK();
}

std::string VersionDirName(uint64_t version) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "v%06llu", static_cast<unsigned long long>(version));
  return buf;
}

bool ParseVersionDirName(const std::string& name, uint64_t* version) {
  if (name.size() < 2 || name.size() > 20 || name[0] != 'v') return false;
  uint64_t v = 0;
  for (size_t i = 1; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
    v = v * 10 + static_cast<uint64_t>(name[i] - '0');
    if (v > kMaxDraftVersion) return false;
  }
  if (v == 0) return false;
  *version = v;
  return true;
}

std::string Sha256Hex(const void* data, size_t size) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned n = 0;
  EVP_Digest(data, size, md, &n, EVP_sha256(), nullptr);
  return ToHex(md, n);
}

Status Sha256File(const std::string& path, std::string* hex) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("cannot open " + path);
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  std::string buf(1 << 16, '\0');
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    EVP_DigestUpdate(ctx, buf.data(), static_cast<size_t>(in.gcount()));
  }
  const bool bad = in.bad();
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned n = 0;
  EVP_DigestFinal_ex(ctx, md, &n);
  EVP_MD_CTX_free(ctx);
  if (bad) return Status::IOError("reading " + path);
  *hex = ToHex(md, n);
  return Status::OK();
}

Status PackCheckpointBundle(const std::string& dir, std::string* bundle) {
  std::string out = kBundleMagic;
  for (const char* name : kBundleFiles) {
    std::string data;
    Status s = ReadFileToString(dir + "/" + name, &data);
    if (!s.ok()) return Status::NotFound("checkpoint bundle: " + s.message());
    out += std::string(name) + " " + std::to_string(data.size()) + "\n";
    out += data;
  }
  *bundle = std::move(out);
  return Status::OK();
}

Status UnpackCheckpointBundle(const std::string& bundle, const std::string& dir) {
  const std::string magic = kBundleMagic;
  if (bundle.compare(0, magic.size(), magic) != 0) {
    return Status::Corruption("checkpoint bundle: bad magic");
  }
  size_t pos = magic.size();
  std::vector<std::pair<std::string, std::pair<size_t, size_t>>> files;  // name, offset, size
  while (pos < bundle.size()) {
    const size_t nl = bundle.find('\n', pos);
    if (nl == std::string::npos || nl - pos > 64) {
      return Status::Corruption("checkpoint bundle: bad file header");
    }
    const std::string line = bundle.substr(pos, nl - pos);
    const size_t sp = line.find(' ');
    const std::string name = line.substr(0, sp);
    bool known = false;
    for (const char* f : kBundleFiles) known |= name == f;
    for (const auto& f : files) known &= f.first != name;
    if (sp == std::string::npos || !known || sp + 1 >= line.size() ||
        line.find_first_not_of("0123456789", sp + 1) != std::string::npos ||
        line.size() - sp - 1 > 19 || line.size() > 40) {  // 19 digits: stoull cannot overflow
      return Status::Corruption("checkpoint bundle: bad file header '" + line + "'");
    }
    const uint64_t size = std::stoull(line.substr(sp + 1));
    pos = nl + 1;
    if (size > bundle.size() - pos) return Status::Corruption("checkpoint bundle: truncated");
    files.push_back({name, {pos, static_cast<size_t>(size)}});
    pos += size;
  }
  if (files.size() != std::size(kBundleFiles)) {
    return Status::Corruption("checkpoint bundle: missing files");
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IOError("cannot create " + dir + ": " + ec.message());
  for (const auto& f : files) {
    const std::string path = dir + "/" + f.first;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bundle.data() + f.second.first, static_cast<std::streamsize>(f.second.second));
    out.close();
    if (!out) return Status::IOError("cannot write " + path);
  }
  return Status::OK();
}

Status GenerateCurveKeyPair(std::string* public_key, std::string* secret_key) {
  if (!zmq_has("curve")) return Status::NotSupported("libzmq was built without CURVE");
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0) return Status::IOError("zmq_curve_keypair failed");
  *public_key = pub;
  *secret_key = sec;
  return Status::OK();
}

}  // namespace specloop
