// CheckpointStore: the trainer's versioned checkpoints (DESIGN.md section 6).
//
//   ROOT/vNNNNNN/model.safetensors   the draft's weights (Hugging Face names; an EAGLE-3
//                                    head's under LlamaForCausalLMEagle3's)
//   ROOT/vNNNNNN/config.json         its ModelConfig (a head's Eagle3Config)
//   ROOT/vNNNNNN/meta.json           CheckpointMeta as JSON
//   ROOT/latest                      one line: the latest version's directory name
//
// A version directory is written under a temporary name and renamed into place, and `latest`
// is replaced by rename, so a reader (or a crash) sees either the old or the new state. Only
// the last keep_last versions are kept (never removing the latest). Versions are never
// reused: a new one is one past the highest present.
//
// Thread safety: none; one trainer owns a root.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "common/base/status.h"
#include "common/model/llama_model.h"

namespace specloop {
namespace trainer {

struct CheckpointMeta {
  uint64_t version = 0;  // set by Save()
  uint64_t parent = 0;   // version trained from; 0 = the initial draft
  std::string sha256;    // of model.safetensors; set by Save()
  std::string objective;
  int64_t steps = 0;     // optimizer steps since the initial draft
  int64_t samples = 0;   // records trained on since the initial draft
  std::map<std::string, double> alpha_before;  // domain -> estimated alpha of the live draft
  std::map<std::string, double> alpha_after;   // domain -> estimated alpha of this checkpoint
  std::string created;   // UTC, ISO 8601; set by Save()

  std::string ToJson() const;
  static Status FromJson(const std::string& json, CheckpointMeta* out);
};

class CheckpointStore {
 public:
  // Opens (creating if needed) ROOT. keep_last >= 1.
  static Status Open(const std::string& root, int keep_last, std::unique_ptr<CheckpointStore>* out);

  const std::string& root() const { return root_; }
  // The version `latest` names (falling back to the highest complete directory when `latest`
  // is missing or names a missing directory); 0 when there is none.
  uint64_t Latest() const;
  std::string Dir(uint64_t version) const;

  // Writes a new version with `meta` (version, sha256 and created are filled in and returned
  // in *meta), points `latest` at it and prunes old versions. `write_files(dir)` writes the
  // draft's model.safetensors and config.json into the (existing) version directory.
  Status Save(const std::function<Status(const std::string& dir)>& write_files,
              CheckpointMeta* meta);
  // Save() of a draft model's files (WriteModelFiles).
  Status Save(const LlamaModel& model, CheckpointMeta* meta);
  Status ReadMeta(uint64_t version, CheckpointMeta* out) const;

 private:
  CheckpointStore(std::string root, int keep_last) : root_(std::move(root)), keep_last_(keep_last) {}
  uint64_t HighestVersion() const;
  void Prune(uint64_t latest);

  std::string root_;
  int keep_last_;
};

// Writes DIR/model.safetensors (float32 weights of `model`) and DIR/config.json.
Status WriteModelFiles(const LlamaModel& model, const std::string& dir);

}  // namespace trainer
}  // namespace specloop
