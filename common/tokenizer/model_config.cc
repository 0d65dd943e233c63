#include "common/tokenizer/model_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/tokenizer/hf_tokenizer.h"
#include "common/tokenizer/json_int.h"

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

bool Convert(const json& v, int* out) { return JsonToInt(v, out); }
bool Convert(const json& v, std::vector<int>* out) {
  if (!v.is_array()) return false;
  std::vector<int> ids(v.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!JsonToInt(v[i], &ids[i])) return false;
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

// The families: architecture class and model_type.
struct Family {
  const char* model_type;
  const char* architecture;
};
constexpr Family kFamilies[] = {{"llama", "LlamaForCausalLM"},
                                {"qwen2", "Qwen2ForCausalLM"},
                                {"qwen3", "Qwen3ForCausalLM"},
                                {"mistral", "MistralForCausalLM"}};

// Keys every family's loader reads or knows to leave the forward unchanged: the sizes, ids and
// dtype it reads; training-only settings (dropout, initializer, pretraining_tp, which splits a
// product that sums to the same); and the generic PretrainedConfig fields older files store.
const std::set<std::string>& CommonKeys() {
  static const std::set<std::string> keys = {
      "architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size",
      "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
      "hidden_act", "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling",
      "rope_parameters", "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id",
      "unk_token_id", "torch_dtype", "dtype", "transformers_version", "_name_or_path",
      "use_cache", "initializer_range", "attention_dropout", "pretraining_tp",
      "_attn_implementation_autoset", "output_attentions", "output_hidden_states",
      "return_dict", "torchscript", "use_bfloat16", "pruned_heads", "tie_encoder_decoder",
      "is_encoder_decoder", "is_decoder", "add_cross_attention", "cross_attention_hidden_size",
      "chunk_size_feed_forward", "id2label", "label2id", "problem_type", "finetuning_task",
      "prefix", "sep_token_id", "decoder_start_token_id", "task_specific_params",
      "tokenizer_class", "tf_legacy_loss",
      // Generation defaults that old files keep in config.json (generation_config.json's job).
      "max_length", "min_length", "do_sample", "early_stopping", "num_beams",
      "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p", "typical_p",
      "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
      "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "output_scores",
      "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id",
      "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
      "begin_suppress_tokens"};
  return keys;
}

// The keys one family adds to CommonKeys().
std::set<std::string> FamilyKeys(const std::string& type) {
  // SmolLM2's nanotron exports add is_llama_config (a marker) and rope_interleaved (false: the
  // rotate_half layout transformers always uses; true is refused below).
  if (type == "llama") return {"attention_bias", "mlp_bias", "is_llama_config", "rope_interleaved"};
  if (type == "qwen2") {
    return {"sliding_window", "use_sliding_window", "max_window_layers", "layer_types",
            "use_mrope"};
  }
  if (type == "qwen3") {
    return {"attention_bias", "sliding_window", "use_sliding_window", "max_window_layers",
            "layer_types"};
  }
  return {"sliding_window"};  // mistral
}

std::string FamilyList() {
  std::string r;
  for (const Family& f : kFamilies) r += std::string(r.empty() ? "" : ", ") + f.architecture;
  return r;
}

// The family from `architectures` and `model_type` (either may be missing; none: llama).
Status ParseFamily(const json& j, std::string* type) {
  std::string arch, model_type;
  if (auto it = j.find("architectures"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || it->size() != 1 || !(*it)[0].is_string()) {
      return Status::NotSupported("config.json: \"architectures\" must name one class (" +
                                  FamilyList() + ")");
    }
    arch = (*it)[0].get<std::string>();
  }
  SPECLOOP_RETURN_IF_ERROR(Get(j, "model_type", &model_type, false));
  const Family* from_arch = nullptr;
  const Family* from_type = nullptr;
  for (const Family& f : kFamilies) {
    if (arch == f.architecture) from_arch = &f;
    if (model_type == f.model_type) from_type = &f;
  }
  if (!arch.empty() && !from_arch) {
    return Status::NotSupported("config.json: architecture " + arch + " (implemented: " +
                                FamilyList() + ")");
  }
  if (!model_type.empty() && !from_type) {
    return Status::NotSupported("config.json: model_type " + model_type +
                                " (implemented: llama, qwen2, qwen3, mistral)");
  }
  if (from_arch && from_type && from_arch != from_type) {
    return Status::NotSupported("config.json: architecture " + arch + " with model_type " +
                                model_type);
  }
  *type = from_arch ? from_arch->model_type : from_type ? from_type->model_type : "llama";
  return Status::OK();
}

// rope_scaling (or transformers 5's rope_parameters, which also carries rope_theta).
Status ParseRope(const json& j, ModelConfig* c) {
  const json* rope = nullptr;
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_object()) {
      return Status::InvalidArgument(std::string("config.json: \"") + key +
                                     "\" is not an object");
    }
    if (rope != nullptr) {
      return Status::NotSupported("config.json: both rope_scaling and rope_parameters");
    }
    rope = &*it;
  }
  if (rope == nullptr) return Status::OK();
  std::string type;
  SPECLOOP_RETURN_IF_ERROR(Get(*rope, "rope_type", &type, false));
  if (type.empty()) SPECLOOP_RETURN_IF_ERROR(Get(*rope, "type", &type, false));
  SPECLOOP_RETURN_IF_ERROR(Get(*rope, "rope_theta", &c->rope_theta, false));
  std::set<std::string> known = {"rope_type", "type", "rope_theta"};
  RopeScaling& r = c->rope_scaling;
  if (type == "default" || type.empty()) {
    type = "";
  } else if (type == "linear") {
    SPECLOOP_RETURN_IF_ERROR(Get(*rope, "factor", &r.factor, true));
    known.insert("factor");
  } else if (type == "llama3") {
    SPECLOOP_RETURN_IF_ERROR(Get(*rope, "factor", &r.factor, true));
    SPECLOOP_RETURN_IF_ERROR(Get(*rope, "low_freq_factor", &r.low_freq_factor, true));
    SPECLOOP_RETURN_IF_ERROR(Get(*rope, "high_freq_factor", &r.high_freq_factor, true));
    SPECLOOP_RETURN_IF_ERROR(Get(*rope, "original_max_position_embeddings",
                                 &r.original_max_position_embeddings, true));
    known.insert({"factor", "low_freq_factor", "high_freq_factor",
                  "original_max_position_embeddings"});
    if (!(r.high_freq_factor > r.low_freq_factor) || !(r.low_freq_factor > 0) ||
        r.original_max_position_embeddings <= 0) {
      return Status::InvalidArgument(
          "config.json: rope_scaling llama3 needs high_freq_factor > low_freq_factor > 0 and "
          "a positive original_max_position_embeddings");
    }
  } else {
    return Status::NotSupported("config.json: rope_scaling type \"" + type +
                                "\" (implemented: linear, llama3)");
  }
  if (!(r.factor > 0) || !std::isfinite(r.factor)) {
    return Status::InvalidArgument("config.json: rope_scaling factor must be positive");
  }
  for (const auto& item : rope->items()) {
    if (!known.count(item.key())) {
      return Status::NotSupported("config.json: rope_scaling key \"" + item.key() +
                                  "\" for type " + (type.empty() ? "default" : type));
    }
  }
  r.type = type;
  return Status::OK();
}

// sliding_window per family: Mistral slides on every layer when sliding_window is set; Qwen2
// and Qwen3 only with use_sliding_window, on the layers from max_window_layers on (or those
// that layer_types names "sliding_attention").
Status ParseSlidingWindow(const json& j, ModelConfig* c) {
  int window = 0;
  SPECLOOP_RETURN_IF_ERROR(Get(j, "sliding_window", &window, false));
  if (c->model_type == "mistral") {
    if (!j.contains("sliding_window")) window = 4096;  // MistralConfig's default
    c->sliding_window = window;
  } else if (c->model_type == "qwen2" || c->model_type == "qwen3") {
    bool use = false;
    SPECLOOP_RETURN_IF_ERROR(Get(j, "use_sliding_window", &use, false));
    int max_window_layers = 28;  // Qwen2Config's and Qwen3Config's default
    SPECLOOP_RETURN_IF_ERROR(Get(j, "max_window_layers", &max_window_layers, false));
    if (!j.contains("sliding_window")) window = 4096;
    bool slides = use && window > 0 && max_window_layers < c->num_hidden_layers;
    if (auto it = j.find("layer_types"); it != j.end() && !it->is_null()) {
      if (!it->is_array() || static_cast<int>(it->size()) != c->num_hidden_layers) {
        return Status::InvalidArgument("config.json: layer_types must list every layer");
      }
      slides = false;
      for (const json& t : *it) {
        if (t == "sliding_attention") {
          slides = true;
        } else if (t != "full_attention") {
          return Status::NotSupported("config.json: layer type " + t.dump());
        }
      }
      if (slides && window <= 0) {
        return Status::InvalidArgument("config.json: sliding layers without a sliding_window");
      }
    }
    c->sliding_window = slides ? window : 0;
  }
  if (c->sliding_window < 0) {
    return Status::InvalidArgument("config.json: sliding_window must be positive");
  }
  return Status::OK();
}

}  // namespace

Status ModelConfig::FromJson(const std::string& text, ModelConfig* out) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Status::InvalidArgument("config.json is not a JSON object");
  ModelConfig c;
  SPECLOOP_RETURN_IF_ERROR(ParseFamily(j, &c.model_type));
  if (j.contains("quantization_config")) {
    return Status::NotSupported("config.json: quantized checkpoints (quantization_config)");
  }
  const std::set<std::string> family_keys = FamilyKeys(c.model_type);
  for (const auto& item : j.items()) {
    if (!CommonKeys().count(item.key()) && !family_keys.count(item.key())) {
      return Status::NotSupported("config.json: key \"" + item.key() +
                                  "\" is not implemented for " + c.model_type +
                                  " models (it may change the forward)");
    }
  }
  SPECLOOP_RETURN_IF_ERROR(Get(j, "vocab_size", &c.vocab_size, true));
  SPECLOOP_RETURN_IF_ERROR(Get(j, "hidden_size", &c.hidden_size, true));
  SPECLOOP_RETURN_IF_ERROR(Get(j, "intermediate_size", &c.intermediate_size, true));
  SPECLOOP_RETURN_IF_ERROR(Get(j, "num_hidden_layers", &c.num_hidden_layers, true));
  SPECLOOP_RETURN_IF_ERROR(Get(j, "num_attention_heads", &c.num_attention_heads, true));
  c.num_key_value_heads = c.num_attention_heads;
  SPECLOOP_RETURN_IF_ERROR(Get(j, "num_key_value_heads", &c.num_key_value_heads, false));
  if (c.model_type == "qwen3") c.head_dim = 128;  // Qwen3Config's default
  SPECLOOP_RETURN_IF_ERROR(Get(j, "head_dim", &c.head_dim, false));
  if (c.model_type == "qwen2" || c.model_type == "qwen3") c.max_position_embeddings = 32768;
  if (c.model_type == "mistral") c.max_position_embeddings = 131072;
  SPECLOOP_RETURN_IF_ERROR(Get(j, "max_position_embeddings", &c.max_position_embeddings, false));
  SPECLOOP_RETURN_IF_ERROR(Get(j, "rms_norm_eps", &c.rms_norm_eps, false));
  SPECLOOP_RETURN_IF_ERROR(Get(j, "rope_theta", &c.rope_theta, false));
  SPECLOOP_RETURN_IF_ERROR(Get(j, "tie_word_embeddings", &c.tie_word_embeddings, false));
  SPECLOOP_RETURN_IF_ERROR(Get(j, "bos_token_id", &c.bos_token_id, false));
  SPECLOOP_RETURN_IF_ERROR(Get(j, "torch_dtype", &c.torch_dtype, false));
  SPECLOOP_RETURN_IF_ERROR(Get(j, "dtype", &c.torch_dtype, false));
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
  SPECLOOP_RETURN_IF_ERROR(ParseRope(j, &c));
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    bool bias = false;
    SPECLOOP_RETURN_IF_ERROR(Get(j, key, &bias, false));
    if (bias) {
      return Status::NotSupported(std::string("config.json: ") + key + " for " + c.model_type +
                                  " models");
    }
  }
  bool interleaved = false;
  SPECLOOP_RETURN_IF_ERROR(Get(j, "rope_interleaved", &interleaved, false));
  if (interleaved) return Status::NotSupported("config.json: rope_interleaved (GPT-J style RoPE)");
  bool mrope = false;
  SPECLOOP_RETURN_IF_ERROR(Get(j, "use_mrope", &mrope, false));
  if (mrope) return Status::NotSupported("config.json: use_mrope (multimodal RoPE)");
  c.qkv_bias = c.model_type == "qwen2";
  c.qk_norm = c.model_type == "qwen3";
  std::string act = "silu";
  SPECLOOP_RETURN_IF_ERROR(Get(j, "hidden_act", &act, false));
  if (act != "silu") return Status::NotSupported("config.json: hidden_act " + act);

  if (c.vocab_size <= 0 || c.hidden_size <= 0 || c.intermediate_size <= 0 ||
      c.num_hidden_layers <= 0 || c.num_attention_heads <= 0 || c.num_key_value_heads <= 0 ||
      c.max_position_embeddings <= 0) {
    return Status::InvalidArgument("config.json: sizes must be positive");
  }
  SPECLOOP_RETURN_IF_ERROR(ParseSlidingWindow(j, &c));
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
  if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta)) {
    return Status::InvalidArgument("config.json: rope_theta must be positive");
  }
  c.max_model_len = c.PositionLimit();
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
  const char* architecture = "LlamaForCausalLM";
  for (const Family& f : kFamilies) {
    if (model_type == f.model_type) architecture = f.architecture;
  }
  json j = {
      {"architectures", {architecture}},
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
  if (rope_scaling.type == "linear") {
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", rope_scaling.factor}};
  } else if (rope_scaling.type == "llama3") {
    j["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", rope_scaling.factor},
        {"low_freq_factor", rope_scaling.low_freq_factor},
        {"high_freq_factor", rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings}};
  }
  if (model_type == "mistral") {
    j["sliding_window"] = sliding_window > 0 ? json(sliding_window) : json(nullptr);
  } else if (model_type == "qwen2" || model_type == "qwen3") {
    j["use_sliding_window"] = sliding_window > 0;  // then every layer slides
    j["sliding_window"] = sliding_window > 0 ? json(sliding_window) : json(nullptr);
    j["max_window_layers"] = 0;
  }
  return j.dump(2) + "\n";
}

int ModelConfig::PositionLimit() const {
  return sliding_window > 0 ? std::min(sliding_window, max_position_embeddings)
                            : max_position_embeddings;
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
