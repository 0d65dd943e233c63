#include "common/tokenizer/model_config.h"

#include <fstream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/tokenizer/hf_tokenizer.h"

namespace specloop {

using nlohmann::json;

Status ReadFileToString(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Status::IOError("cannot read " + path);
  *out = ss.str();
  return Status::OK();
}

namespace {

// A JSON integer that fits an int. nlohmann's get<int>() would convert 1e300 or 2^40 (undefined
// behaviour, or a silently different number).
bool ToInt(const json& v, int* out) {
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int>::max())) return false;
  } else if (!v.is_number_integer() || v.get<int64_t>() < std::numeric_limits<int>::min() ||
             v.get<int64_t>() > std::numeric_limits<int>::max()) {
    return false;
  }
  *out = static_cast<int>(v.get<int64_t>());
  return true;
}

bool Convert(const json& v, int* out) { return ToInt(v, out); }
bool Convert(const json& v, std::vector<int>* out) {
  if (!v.is_array()) return false;
  std::vector<int> ids(v.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!ToInt(v[i], &ids[i])) return false;
  }
  *out = std::move(ids);
  return true;
}
template <typename T>
bool Convert(const json& v, T* out) {
  try {
    *out = v.get<T>();
  } catch (const json::exception&) {
    return false;
  }
  return true;
}

template <typename T>
Status Get(const json& j, const char* key, T* out, bool required) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    return required ? Status::InvalidArgument(std::string("config.json lacks \"") + key + "\"")
                    : Status::OK();
  }
  if (!Convert(*it, out)) {
    return Status::InvalidArgument(std::string("config.json: \"") + key +
                                   "\" has the wrong type or is out of range");
  }
  return Status::OK();
}

}  // namespace

Status ModelConfig::FromJson(const std::string& text, ModelConfig* out) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Status::InvalidArgument("config.json is not a JSON object");
  ModelConfig c;
  SPECLOOP_RETURN_IF_ERROR(Get(j, "model_type", &c.model_type, false));
  SPECLOOP_RETURN_IF_ERROR(Get(j, "vocab_size", &c.vocab_size, true));
  SPECLOOP_RETURN_IF_ERROR(Get(j, "hidden_size", &c.hidden_size, true));
  SPECLOOP_RETURN_IF_ERROR(Get(j, "intermediate_size", &c.intermediate_size, true));
  SPECLOOP_RETURN_IF_ERROR(Get(j, "num_hidden_layers", &c.num_hidden_layers, true));
  SPECLOOP_RETURN_IF_ERROR(Get(j, "num_attention_heads", &c.num_attention_heads, true));
  c.num_key_value_heads = c.num_attention_heads;
  SPECLOOP_RETURN_IF_ERROR(Get(j, "num_key_value_heads", &c.num_key_value_heads, false));
  SPECLOOP_RETURN_IF_ERROR(Get(j, "head_dim", &c.head_dim, false));
  SPECLOOP_RETURN_IF_ERROR(Get(j, "max_position_embeddings", &c.max_position_embeddings, false));
  SPECLOOP_RETURN_IF_ERROR(Get(j, "rms_norm_eps", &c.rms_norm_eps, false));
  SPECLOOP_RETURN_IF_ERROR(Get(j, "rope_theta", &c.rope_theta, false));
  SPECLOOP_RETURN_IF_ERROR(Get(j, "tie_word_embeddings", &c.tie_word_embeddings, false));
  SPECLOOP_RETURN_IF_ERROR(Get(j, "bos_token_id", &c.bos_token_id, false));
  SPECLOOP_RETURN_IF_ERROR(Get(j, "torch_dtype", &c.torch_dtype, false));
  if (auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
    if (it->is_number_integer()) {
      int eos = 0;
      SPECLOOP_RETURN_IF_ERROR(Get(j, "eos_token_id", &eos, true));
      c.eos_token_ids = {eos};
    } else if (it->is_array()) {
      SPECLOOP_RETURN_IF_ERROR(Get(j, "eos_token_id", &c.eos_token_ids, true));
    } else {
      return Status::InvalidArgument("config.json: \"eos_token_id\" has the wrong type");
    }
  }

  // What the forward does not implement is refused, never silently ignored.
  if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null()) {
    return Status::NotSupported("config.json: rope_scaling is not supported");
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    bool bias = false;
    SPECLOOP_RETURN_IF_ERROR(Get(j, key, &bias, false));
    if (bias) return Status::NotSupported(std::string("config.json: ") + key + " is not supported");
  }
  std::string act = "silu";
  SPECLOOP_RETURN_IF_ERROR(Get(j, "hidden_act", &act, false));
  if (act != "silu") return Status::NotSupported("config.json: hidden_act " + act);

  if (c.vocab_size <= 0 || c.hidden_size <= 0 || c.intermediate_size <= 0 ||
      c.num_hidden_layers <= 0 || c.num_attention_heads <= 0 || c.num_key_value_heads <= 0 ||
      c.max_position_embeddings <= 0) {
    return Status::InvalidArgument("config.json: sizes must be positive");
  }
  if (c.head_dim == 0) {
    if (c.hidden_size % c.num_attention_heads != 0) {
      return Status::InvalidArgument("config.json: hidden_size not divisible by heads");
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.head_dim <= 0 || c.head_dim % 2 != 0) {
    return Status::InvalidArgument("config.json: head_dim must be positive and even");
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return Status::InvalidArgument(
        "config.json: num_attention_heads must be a multiple of num_key_value_heads");
  }
  *out = c;
  return Status::OK();
}

Status ModelConfig::FromDir(const std::string& dir, ModelConfig* out) {
  std::string text;
  SPECLOOP_RETURN_IF_ERROR(ReadFileToString(dir + "/config.json", &text));
  SPECLOOP_RETURN_IF_ERROR(FromJson(text, out).Annotate(dir + "/config.json"));
  std::string tok;
  if (ReadFileToString(dir + "/tokenizer_config.json", &tok).ok()) {
    json j = json::parse(tok, nullptr, false);
    if (j.is_object() && j.contains("add_bos_token") && j["add_bos_token"].is_boolean()) {
      out->add_bos_token = j["add_bos_token"].get<bool>();
    }
  }
  bool hf_bos;  // a tokenizer.json says through its post-processor
  if (HfTokenizerAddsBos(dir, &hf_bos).ok()) out->add_bos_token = hf_bos;
  return Status::OK();
}

std::string ModelConfig::ToJson() const {
  json j = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", model_type},
      {"vocab_size", vocab_size},
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_hidden_layers", num_hidden_layers},
      {"num_attention_heads", num_attention_heads},
      {"num_key_value_heads", num_key_value_heads},
      {"head_dim", head_dim},
      {"hidden_act", "silu"},
      {"max_position_embeddings", max_position_embeddings},
      {"rms_norm_eps", rms_norm_eps},
      {"rope_theta", rope_theta},
      {"tie_word_embeddings", tie_word_embeddings},
      {"bos_token_id", bos_token_id},
      {"torch_dtype", torch_dtype},
  };
  if (eos_token_ids.size() == 1) {
    j["eos_token_id"] = eos_token_ids[0];
  } else {
    j["eos_token_id"] = eos_token_ids;
  }
  return j.dump(2) + "\n";
}

Status CheckDraftCompatible(const ModelConfig& target, const ModelConfig& draft) {
  if (target.vocab_size != draft.vocab_size) {
    return Status::InvalidArgument("draft vocabulary of " + std::to_string(draft.vocab_size) +
                                   " tokens, target's of " + std::to_string(target.vocab_size));
  }
  if (target.bos_token_id != draft.bos_token_id || target.eos_token_ids != draft.eos_token_ids) {
    return Status::InvalidArgument("draft and target disagree on BOS/EOS ids");
  }
  return Status::OK();
}

bool ModelConfig::IsEos(int token) const {
  for (int e : eos_token_ids) {
    if (e == token) return true;
  }
  return false;
}

}  // namespace specloop
