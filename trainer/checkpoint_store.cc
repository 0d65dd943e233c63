#include "trainer/checkpoint_store.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/base/remove_tree.h"
#include "common/channel/draft_channel.h"
#include "common/model/safetensors.h"

namespace specloop {
namespace trainer {

namespace fs = std::filesystem;

namespace {

Status WriteFileAtomic(const std::string& path, const std::string& data) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << data;
    out.flush();
    if (!out) return Status::IOError("cannot write " + tmp);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return Status::IOError("rename " + tmp + ": " + ec.message());
  return Status::OK();
}

std::string NowIso8601() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::vector<uint64_t> ListVersions(const std::string& root) {
  std::vector<uint64_t> v;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    uint64_t n;
    if (e.is_directory() && ParseVersionDirName(e.path().filename().string(), &n) &&
        fs::exists(e.path() / "meta.json")) {
      v.push_back(n);
    }
  }
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace

std::string CheckpointMeta::ToJson() const {
  nlohmann::json j = {{"version", version},     {"parent", parent},
                      {"sha256", sha256},       {"objective", objective},
                      {"steps", steps},         {"samples", samples},
                      {"alpha_before", alpha_before}, {"alpha_after", alpha_after},
                      {"created", created}};
  return j.dump(2);
}

Status CheckpointMeta::FromJson(const std::string& json, CheckpointMeta* out) {
  nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
  if (!j.is_object()) return Status::Corruption("meta.json is not a JSON object");
  try {
    CheckpointMeta m;
    m.version = j.at("version").get<uint64_t>();
    m.parent = j.at("parent").get<uint64_t>();
    m.sha256 = j.at("sha256").get<std::string>();
    m.objective = j.at("objective").get<std::string>();
    m.steps = j.at("steps").get<int64_t>();
    m.samples = j.at("samples").get<int64_t>();
    m.alpha_before = j.at("alpha_before").get<std::map<std::string, double>>();
    m.alpha_after = j.at("alpha_after").get<std::map<std::string, double>>();
    m.created = j.at("created").get<std::string>();
    *out = std::move(m);
  } catch (const nlohmann::json::exception& e) {
    return Status::Corruption(std::string("meta.json: ") + e.what());
  }
  return Status::OK();
}

Status CheckpointStore::Open(const std::string& root, int keep_last,
                             std::unique_ptr<CheckpointStore>* out) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) return Status::IOError("cannot create " + root + ": " + ec.message());
  out->reset(new CheckpointStore(root, std::max(1, keep_last)));
  return Status::OK();
}

std::string CheckpointStore::Dir(uint64_t version) const {
  return root_ + "/" + VersionDirName(version);
}

uint64_t CheckpointStore::HighestVersion() const {
  const auto v = ListVersions(root_);
  return v.empty() ? 0 : v.back();
}

uint64_t CheckpointStore::Latest() const {
  std::string text;
  if (ReadFileToString(root_ + "/latest", &text).ok()) {
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    uint64_t v;
    if (ParseVersionDirName(text, &v) && fs::exists(Dir(v) + "/meta.json")) return v;
  }
  return HighestVersion();
}

Status WriteModelFiles(const LlamaModel& model, const std::string& dir) {
  SPECLOOP_RETURN_IF_ERROR(WriteSafetensors(dir + "/model.safetensors", model.NamedWeights(),
                                            {{"format", "pt"}}));
  return WriteFileAtomic(dir + "/config.json", model.config().ToJson());
}

Status CheckpointStore::Save(const LlamaModel& model, CheckpointMeta* meta) {
  return Save([&](const std::string& dir) { return WriteModelFiles(model, dir); }, meta);
}

Status CheckpointStore::Save(const std::function<Status(const std::string& dir)>& write_files,
                             CheckpointMeta* meta) {
  const uint64_t version = std::max(HighestVersion(), Latest()) + 1;
  if (version > kMaxDraftVersion) {
    return Status::InvalidArgument("checkpoint versions exhausted in " + root_);
  }
  const std::string final_dir = Dir(version);
  const std::string tmp = root_ + "/." + VersionDirName(version) + ".tmp";
  (void)RemoveTree(tmp);  // a save cut short; create_directories reports a failure
  std::error_code ec;
  fs::create_directories(tmp, ec);
  if (ec) return Status::IOError("cannot create " + tmp + ": " + ec.message());
  SPECLOOP_RETURN_IF_ERROR(write_files(tmp));
  CheckpointMeta m = *meta;
  m.version = version;
  m.created = NowIso8601();
  SPECLOOP_RETURN_IF_ERROR(Sha256File(tmp + "/model.safetensors", &m.sha256));
  SPECLOOP_RETURN_IF_ERROR(WriteFileAtomic(tmp + "/meta.json", m.ToJson()));
  fs::rename(tmp, final_dir, ec);
  if (ec) return Status::IOError("rename to " + final_dir + ": " + ec.message());
  SPECLOOP_RETURN_IF_ERROR(WriteFileAtomic(root_ + "/latest", VersionDirName(version) + "\n"));
  Prune(version);
  *meta = m;
  return Status::OK();
}

Status CheckpointStore::ReadMeta(uint64_t version, CheckpointMeta* out) const {
  std::string text;
  SPECLOOP_RETURN_IF_ERROR(ReadFileToString(Dir(version) + "/meta.json", &text));
  return CheckpointMeta::FromJson(text, out);
}

void CheckpointStore::Prune(uint64_t latest) {
  std::vector<uint64_t> v = ListVersions(root_);
  const size_t keep = static_cast<size_t>(keep_last_);
  if (v.size() <= keep) return;
  for (size_t i = 0; i + keep < v.size(); ++i) {
    if (v[i] != latest) (void)RemoveTree(Dir(v[i]));  // best effort: retried at the next save
  }
}

}  // namespace trainer
}  // namespace specloop
