#include "cli/eagle3_interchange.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/model/eagle3_config.h"
#include "common/model/safetensors.h"

namespace specloop {

namespace {

namespace fs = std::filesystem;

std::string ShapeString(at::IntArrayRef s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

std::string DtypeName(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kLong: return "int64";
    case at::kInt: return "int32";
    case at::kBool: return "bool";
    default: return c10::toString(t);
  }
}

Status ParseExportDtype(const std::string& name, at::ScalarType* out) {
  if (name == "float16") *out = at::kHalf;
  else if (name == "bfloat16") *out = at::kBFloat16;
  else if (name == "float32") *out = at::kFloat;
  else return Status::InvalidArgument("dtype \"" + name + "\": one of float16, bfloat16, float32");
  return Status::OK();
}

// A weights file other than model.safetensors, which a loader could read instead of or beside it.
bool IsOtherWeightsFile(const std::string& name) {
  auto ends = [&](const std::string& suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (name == "model.safetensors") return false;
  return ends(".safetensors") || ends(".index.json") || ends(".bin") || ends(".pt") ||
         ends(".pth") || ends(".gguf");
}

// Writes `text` to `path` through a temporary file renamed over it.
Status WriteFileAtomically(const std::string& path, const std::string& text) {
  {
    std::ofstream f(path + ".tmp", std::ios::binary | std::ios::trunc);
    f << text;
    f.close();
    if (!f) return Status::IOError(path + ".tmp: cannot write");
  }
  std::error_code ec;
  fs::rename(path + ".tmp", path, ec);
  if (ec) return Status::IOError(path + ": " + ec.message());
  return Status::OK();
}

// The weights of a published head in `dir` (model.safetensors or an index of shards); a
// PyTorch pickle (pytorch_model.bin and the like) is refused, naming it.
Status ReadHeadWeights(const std::string& dir, TensorMap* out) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Status::NotFound(dir + ": not a directory");
  if (fs::exists(dir + "/model.safetensors", ec) ||
      fs::exists(dir + "/model.safetensors.index.json", ec)) {
    return ReadModelWeights(dir, out).Annotate(dir);
  }
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const std::string ext = entry.path().extension().string();
    if (name.rfind("pytorch_model", 0) == 0 || ext == ".bin" || ext == ".pt" || ext == ".pth") {
      return Status::NotSupported(
          dir + "/" + name + ": PyTorch pickle weights are not readable here (no pickle "
          "interpreter); convert them to safetensors first, e.g. in Python: "
          "safetensors.torch.save_file(torch.load(\"" + name + "\"), \"model.safetensors\")");
    }
  }
  return Status::NotFound(dir + ": no model.safetensors (nor model.safetensors.index.json)");
}

// Whether config.json names a plain Llama although the weights are an EAGLE-3 head's (EAGLE's
// own training code saves them so): the hint to give with FromDir's refusal.
std::string ArchitectureHint(const std::string& dir, const TensorMap& tensors) {
  std::string text;
  if (!ReadFileToString(dir + "/config.json", &text).ok()) return "";
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("architectures")) return "";
  const bool looks_like_head = tensors.count("fc.weight") || tensors.count("model.fc.weight");
  if (!looks_like_head || j["architectures"] != nlohmann::json({"LlamaForCausalLM"})) return "";
  return " (its weights are an EAGLE-3 head's, as EAGLE's training code saves them: set "
         "\"architectures\": [\"LlamaForCausalLMEagle3\"] in config.json, as SGLang's "
         "republished copies do)";
}

// Which forms of the aux layer ids config.json uses.
std::string AuxIdsForm(const std::string& dir) {
  std::string text;
  if (!ReadFileToString(dir + "/config.json", &text).ok()) return "";
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  const bool top = j.contains("eagle_aux_hidden_state_layer_ids") &&
                   !j["eagle_aux_hidden_state_layer_ids"].is_null();
  const bool nested = j.contains("eagle_config") && j["eagle_config"].is_object() &&
                      j["eagle_config"].contains("eagle_aux_hidden_state_layer_ids") &&
                      !j["eagle_config"]["eagle_aux_hidden_state_layer_ids"].is_null();
  if (top && nested) return "vLLM + SGLang";
  if (top) return "vLLM";
  if (nested) return "SGLang";
  return "none (the target's default)";
}

// Renames the tensors to the native names: a leading "model." dropped, "layers.0." read as
// "midlayer.", vLLM's "draft_id_to_target_id" (offsets, as d2t) read as "d2t".
Status NormalizeNames(const std::string& where, const TensorMap& in, TensorMap* out,
                      std::string* form) {
  std::map<std::string, std::string> original;
  bool prefixed = false, layers0 = false, vllm_map = false;
  for (const auto& [name, tensor] : in) {
    std::string n = name;
    if (n.rfind("model.", 0) == 0) {
      n = n.substr(6);
      prefixed = true;
    }
    if (n.rfind("layers.0.", 0) == 0) {
      n = "midlayer." + n.substr(9);
      layers0 = true;
    }
    if (n == "draft_id_to_target_id") {
      n = "d2t";
      vllm_map = true;
    }
    auto [it, fresh] = original.emplace(n, name);
    if (!fresh) {
      return Status::InvalidArgument(where + ": tensors " + it->second + " and " + name +
                                     " are both " + n);
    }
    (*out)[n] = tensor;
  }
  std::vector<std::string> parts;
  if (prefixed) parts.push_back("model. prefix dropped");
  if (layers0) parts.push_back("layers.0. read as midlayer.");
  if (vllm_map) parts.push_back("draft_id_to_target_id read as d2t");
  *form = parts.empty() ? "as published (midlayer.*)" : "";
  for (const std::string& p : parts) *form += (form->empty() ? "" : ", ") + p;
  return Status::OK();
}

// Checks a carried embed_tokens.weight against the target's and drops it: the head reads the
// target's own. Equal means bit-equal once the target's is rounded to the file's dtype.
Status CheckEmbedding(const std::string& where, const LlamaModel& target, TensorMap* tensors,
                      std::string* report) {
  auto it = tensors->find("embed_tokens.weight");
  if (it == tensors->end()) {
    *report = "absent";
    return Status::OK();
  }
  const at::Tensor file = it->second;
  const at::Tensor mine = target.embedding().to(at::kCPU);
  if (file.sizes() != mine.sizes()) {
    return Status::InvalidArgument(where + ": tensor embed_tokens.weight has shape " +
                                   ShapeString(file.sizes()) + ", the target's embedding " +
                                   ShapeString(mine.sizes()));
  }
  if (!file.is_floating_point()) {
    return Status::InvalidArgument(where + ": tensor embed_tokens.weight is " +
                                   DtypeName(file.scalar_type()));
  }
  bool equal = at::equal(mine.to(file.scalar_type()), file);
  if (!equal && mine.scalar_type() != at::kFloat) {  // a 16-bit target: compare in its dtype
    equal = at::equal(mine, file.to(mine.scalar_type()));
  }
  if (!equal) {
    const at::Tensor diff = (file.to(at::kFloat) - mine.to(at::kFloat)).abs();
    const int64_t rows = (diff.amax(1) > 0).sum().item<int64_t>();
    return Status::InvalidArgument(
        where + ": tensor embed_tokens.weight differs from the target's embedding (" +
        std::to_string(rows) + " of " + std::to_string(file.size(0)) + " rows, max |diff| " +
        std::to_string(diff.max().item<double>()) + ", compared in " +
        DtypeName(file.scalar_type()) +
        "): the head was trained for another target (or with an embedding of its own, which "
        "this head does not have)");
  }
  *report = "equal to the target's (" + DtypeName(file.scalar_type()) + ")";
  tensors->erase(it);
  return Status::OK();
}

// Rebuilds the half of the vocabulary map that a file leaves out (the draft vocabulary is the
// ascending target ids that t2d marks; d2t[d] = id_d - d).
Status CompleteVocabularyMap(const std::string& where, const Eagle3Config& config,
                             TensorMap* tensors, std::string* report) {
  const int64_t V = config.layer.vocab_size;
  const bool has_d2t = tensors->count("d2t"), has_t2d = tensors->count("t2d");
  if (has_d2t && has_t2d) {
    *report = "d2t + t2d";
  } else if (has_d2t) {
    const at::Tensor d2t = (*tensors)["d2t"];
    if (d2t.dim() != 1 || !at::isIntegralType(d2t.scalar_type(), false)) {
      return Status::InvalidArgument(where + ": tensor d2t must be a 1-D integer tensor, is " +
                                     DtypeName(d2t.scalar_type()) + " " +
                                     ShapeString(d2t.sizes()));
    }
    const at::Tensor ids = d2t.to(at::kLong) + at::arange(d2t.size(0), at::kLong);
    if (ids.numel() > 0 && (ids.min().item<int64_t>() < 0 || ids.max().item<int64_t>() >= V)) {
      return Status::InvalidArgument(where + ": tensor d2t maps a draft id outside the target "
                                     "vocabulary 0.." + std::to_string(V - 1));
    }
    (*tensors)["t2d"] = at::zeros({V}, at::kBool).index_fill_(0, ids, true);
    *report = "d2t (t2d rebuilt)";
  } else if (has_t2d) {
    const at::Tensor t2d = (*tensors)["t2d"];
    if (t2d.sizes() != at::IntArrayRef({V})) {
      return Status::InvalidArgument(where + ": tensor t2d has shape " +
                                     ShapeString(t2d.sizes()) + ", expected [" +
                                     std::to_string(V) + "] (vocab_size)");
    }
    const at::Tensor ids = at::nonzero(t2d.to(at::kBool)).flatten();
    (*tensors)["d2t"] = ids - at::arange(ids.size(0), at::kLong);
    *report = "t2d (d2t rebuilt)";
  } else {
    *report = "none (the full vocabulary)";
  }
  return Status::OK();
}

}  // namespace

Status CheckHeadOutputDir(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return Status::OK();
  if (!fs::is_directory(dir, ec)) return Status::InvalidArgument(dir + ": not a directory");
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (IsOtherWeightsFile(name)) {
      return Status::InvalidArgument(dir + "/" + name +
                                     ": another weights file in the output directory (a loader "
                                     "could read it instead of or beside model.safetensors)");
    }
  }
  if (ec) return Status::IOError(dir + ": " + ec.message());
  return Status::OK();
}

Status ExportEagle3Head(const Eagle3Head& head, const std::string& dir,
                        const Eagle3ExportOptions& options) {
  at::ScalarType type = at::kHalf;
  SPECLOOP_RETURN_IF_ERROR(ParseExportDtype(options.dtype, &type));
  SPECLOOP_RETURN_IF_ERROR(CheckHeadOutputDir(dir));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::IOError(dir + ": " + ec.message());
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (auto& [name, t] : head.NamedWeights()) {
    const at::Tensor cpu = t.to(at::kCPU);
    tensors.emplace_back(name, cpu.is_floating_point() ? cpu.to(type).contiguous() : cpu);
  }
  if (options.with_embedding) {
    tensors.emplace_back("embed_tokens.weight",
                         head.target().embedding().to(at::kCPU).to(type).contiguous());
  }
  SPECLOOP_RETURN_IF_ERROR(WriteSafetensors(dir + "/model.safetensors", tensors));
  Eagle3Config config = head.config();
  config.layer.torch_dtype = options.dtype;
  return WriteFileAtomically(dir + "/config.json", config.ToJson());
}

Status ImportEagle3Head(const std::string& dir, const LlamaModel& target,
                        std::unique_ptr<Eagle3Head>* out, Eagle3ImportReport* report) {
  Eagle3ImportReport r;
  TensorMap stored;
  SPECLOOP_RETURN_IF_ERROR(ReadHeadWeights(dir, &stored));
  Eagle3Config config;
  if (Status s = Eagle3Config::FromDir(dir, &config); !s.ok()) {
    const std::string hint = ArchitectureHint(dir, stored);
    return hint.empty() ? s : Status::NotSupported(s.message() + hint);
  }
  r.aux_ids_form = AuxIdsForm(dir);
  const std::string where = dir + "/model.safetensors";
  TensorMap tensors;
  SPECLOOP_RETURN_IF_ERROR(NormalizeNames(where, stored, &tensors, &r.names_form));
  std::set<std::string> dtypes;
  for (const auto& [name, t] : tensors) {
    if (t.is_floating_point()) dtypes.insert(DtypeName(t.scalar_type()));
  }
  for (const std::string& d : dtypes) r.weights_dtype += (r.weights_dtype.empty() ? "" : ", ") + d;
  SPECLOOP_RETURN_IF_ERROR(CheckEmbedding(where, target, &tensors, &r.embedding));
  SPECLOOP_RETURN_IF_ERROR(CompleteVocabularyMap(where, config, &tensors, &r.vocabulary_map));
  LoadOptions load;
  load.device = target.device().str();
  load.dtype = "float32";
  const std::string renamed =
      r.names_form.rfind("as published", 0) == 0 ? "" : " (names as read: " + r.names_form + ")";
  SPECLOOP_RETURN_IF_ERROR(
      Eagle3Head::FromTensors(config, tensors, target, load, out).Annotate(where + renamed));
  if (report) *report = std::move(r);
  return Status::OK();
}

}  // namespace specloop
