#include "common/model/eagle3_config.h"

#include <limits>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/tokenizer/json_int.h"

namespace specloop {

using nlohmann::json;

namespace {

// SGLang's class (its only EAGLE-3 entry); vLLM's registry maps it and vLLM's own class name
// Eagle3LlamaForCausalLM to the same model, so both are read and the first is written.
constexpr const char* kArchitecture = "LlamaForCausalLMEagle3";
constexpr const char* kVllmArchitecture = "Eagle3LlamaForCausalLM";
constexpr int kAuxLayers = 3;  // fc reads 3 x target_hidden_size in vLLM and SGLang

bool IsEagle3Architecture(const json& j) {
  auto it = j.find("architectures");
  return it != j.end() && it->is_array() && it->size() == 1 && (*it)[0].is_string() &&
         ((*it)[0] == kArchitecture || (*it)[0] == kVllmArchitecture);
}

// A key that may be absent or null (then *present is false), else an int.
Status OptionalInt(const json& j, const char* key, int* out, bool* present) {
  *present = false;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::OK();
  if (!JsonToInt(*it, out)) {
    return Status::InvalidArgument(std::string("config.json: \"") + key + "\" is not an integer");
  }
  *present = true;
  return Status::OK();
}

// `name`'s list of aux layer ids: kAuxLayers distinct ints, ascending, each in [min, max].
Status ParseIds(const json& v, const std::string& name, int min, int max, std::vector<int>* out) {
  if (!v.is_array()) return Status::InvalidArgument("config.json: " + name + " is not a list");
  if (v.size() != kAuxLayers) {
    return Status::NotSupported("config.json: " + name + " lists " + std::to_string(v.size()) +
                                " layers; an EAGLE-3 head fuses exactly 3");
  }
  std::vector<int> ids(v.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!JsonToInt(v[i], &ids[i])) {
      return Status::InvalidArgument("config.json: " + name + " holds a non-integer");
    }
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0) {
      return Status::InvalidArgument("config.json: " + name + ": layer " + std::to_string(ids[i]) +
                                     " is negative");
    }
    if (ids[i] < min) {  // min is 1 only in vLLM's form
      return Status::InvalidArgument(
          "config.json: " + name +
          ": layer 0 would be the embedding, which vLLM's Llama "
          "forward does not capture (ids count the layers whose inputs are the features)");
    }
    if (ids[i] > max) {  // SGLang's form is shifted by one into an int
      return Status::InvalidArgument("config.json: " + name + ": layer " + std::to_string(ids[i]) +
                                     " is out of range");
    }
    for (size_t k = 0; k < i; ++k) {
      if (ids[k] == ids[i]) {
        return Status::InvalidArgument("config.json: " + name + " lists layer " +
                                       std::to_string(ids[i]) + " twice");
      }
    }
  }
  for (size_t i = 1; i < ids.size(); ++i) {
    if (ids[i] < ids[i - 1]) {
      return Status::InvalidArgument("config.json: " + name +
                                     " must be ascending (vLLM and SGLang concatenate the "
                                     "features in layer order, whatever the listed order)");
    }
  }
  *out = std::move(ids);
  return Status::OK();
}

std::string IdList(const std::vector<int>& ids) { return json(ids).dump(); }

// The aux layers in vLLM's form (inputs of those layers) from the top-level list and/or
// eagle_config's (SGLang's: outputs of those layers); empty when neither names any.
Status ParseAuxLayers(const json& j, std::vector<int>* aux) {
  std::vector<int> top, nested;
  bool has_top = false, has_nested = false;
  if (auto it = j.find("eagle_aux_hidden_state_layer_ids"); it != j.end() && !it->is_null()) {
    SPECLOOP_RETURN_IF_ERROR(ParseIds(*it, "eagle_aux_hidden_state_layer_ids", 1,
                                      std::numeric_limits<int>::max(), &top));
    has_top = true;
  }
  if (auto it = j.find("eagle_config"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) {
      return Status::InvalidArgument("config.json: \"eagle_config\" is not an object");
    }
    for (const auto& item : it->items()) {
      if (item.key() == "eagle_aux_hidden_state_layer_ids") {
        if (item.value().is_null()) continue;
        SPECLOOP_RETURN_IF_ERROR(ParseIds(item.value(),
                                          "eagle_config.eagle_aux_hidden_state_layer_ids", 0,
                                          std::numeric_limits<int>::max() - 1, &nested));
        for (int& id : nested) ++id;  // output of layer k = input of layer k + 1
        has_nested = true;
      } else if (item.key() == "use_aux_hidden_state") {
        if (!item.value().is_boolean()) {
          return Status::InvalidArgument(
              "config.json: eagle_config.use_aux_hidden_state is not a boolean");
        }
        if (!item.value().get<bool>()) {
          return Status::NotSupported(
              "config.json: eagle_config.use_aux_hidden_state false (a head without fc that "
              "reads one hidden state)");
        }
      } else {
        return Status::NotSupported("config.json: eagle_config key \"" + item.key() +
                                    "\" is not implemented");
      }
    }
  }
  if (has_top && has_nested && top != nested) {
    std::vector<int> nested_sglang = nested;
    for (int& id : nested_sglang) --id;
    return Status::InvalidArgument("config.json: eagle_aux_hidden_state_layer_ids " + IdList(top) +
                                   " (vLLM: inputs of those layers) and eagle_config's " +
                                   IdList(nested_sglang) +
                                   " (SGLang: outputs of those layers) name different layers");
  }
  *aux = has_top ? top : nested;
  return Status::OK();
}

}  // namespace

Status Eagle3Config::FromJson(const std::string& json_text, Eagle3Config* out) {
  const json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Status::InvalidArgument("config.json is not a JSON object");
  if (!IsEagle3Architecture(j)) {
    auto it = j.find("architectures");
    return Status::NotSupported(
        std::string("config.json: an EAGLE-3 head's architectures must be [\"") + kArchitecture +
        "\"] (or [\"" + kVllmArchitecture + "\"]), not " +
        (it == j.end() ? std::string("absent") : it->dump()));
  }
  if (auto it = j.find("model_type"); it != j.end() && !it->is_null() && *it != "llama") {
    return Status::NotSupported("config.json: model_type " + it->dump() +
                                " (an EAGLE-3 head's layer is a Llama layer: model_type llama)");
  }

  Eagle3Config c;
  bool has_draft_vocab = false, has_target_hidden = false;
  SPECLOOP_RETURN_IF_ERROR(
      OptionalInt(j, "draft_vocab_size", &c.draft_vocab_size, &has_draft_vocab));
  SPECLOOP_RETURN_IF_ERROR(
      OptionalInt(j, "target_hidden_size", &c.target_hidden_size, &has_target_hidden));
  if (auto it = j.find("norm_before_residual"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) {
      return Status::InvalidArgument("config.json: \"norm_before_residual\" is not a boolean");
    }
    c.norm_before_residual = it->get<bool>();
  }
  SPECLOOP_RETURN_IF_ERROR(ParseAuxLayers(j, &c.aux_layers));
  // Qwen-style keys that SpecForge's and others' heads carry with model_type llama: harmless
  // while no layer slides (vLLM would apply a sliding_window that is set).
  if (auto it = j.find("sliding_window"); it != j.end() && !it->is_null()) {
    return Status::NotSupported("config.json: sliding_window " + it->dump() +
                                " in an EAGLE-3 head (sliding-window attention)");
  }
  if (auto it = j.find("use_sliding_window"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) {
      return Status::InvalidArgument("config.json: \"use_sliding_window\" is not a boolean");
    }
    if (it->get<bool>()) {
      return Status::NotSupported("config.json: use_sliding_window true in an EAGLE-3 head");
    }
  }
  if (auto it = j.find("max_window_layers"); it != j.end() && !it->is_null()) {
    int unused;
    if (!JsonToInt(*it, &unused)) {
      return Status::InvalidArgument("config.json: \"max_window_layers\" is not an integer");
    }
  }

  // The layer: what is left is a Llama config, parsed (and refused key by key) as one.
  json layer = j;
  for (const char* key : {"draft_vocab_size", "target_hidden_size", "norm_before_residual",
                          "eagle_aux_hidden_state_layer_ids", "eagle_config", "sliding_window",
                          "use_sliding_window", "max_window_layers"}) {
    layer.erase(key);
  }
  layer["architectures"] = {"LlamaForCausalLM"};
  SPECLOOP_RETURN_IF_ERROR(ModelConfig::FromJson(layer.dump(), &c.layer));

  if (c.layer.num_hidden_layers != 1) {
    return Status::NotSupported("config.json: num_hidden_layers " +
                                std::to_string(c.layer.num_hidden_layers) +
                                " (an EAGLE-3 head has one decoder layer)");
  }
  if (c.layer.tie_word_embeddings) {
    return Status::NotSupported(
        "config.json: tie_word_embeddings in an EAGLE-3 head (its lm_head is its own)");
  }
  if (!has_target_hidden) c.target_hidden_size = c.layer.hidden_size;
  if (c.target_hidden_size != c.layer.hidden_size) {
    return Status::NotSupported(
        "config.json: target_hidden_size " + std::to_string(c.target_hidden_size) +
        " differs from the head's hidden_size " + std::to_string(c.layer.hidden_size) +
        " (a head of another width than its target would need an embedding of its own)");
  }
  if (!has_draft_vocab) c.draft_vocab_size = c.layer.vocab_size;
  if (c.draft_vocab_size <= 0 || c.draft_vocab_size > c.layer.vocab_size) {
    return Status::InvalidArgument("config.json: draft_vocab_size " +
                                   std::to_string(c.draft_vocab_size) + " outside 1.." +
                                   std::to_string(c.layer.vocab_size) + " (vocab_size)");
  }
  *out = std::move(c);
  return Status::OK();
}

Status Eagle3Config::FromDir(const std::string& dir, Eagle3Config* out) {
  std::string text;
  SPECLOOP_RETURN_IF_ERROR(ReadFileToString(dir + "/config.json", &text));
  return FromJson(text, out).Annotate(dir + "/config.json");
}

std::string Eagle3Config::ToJson() const {
  json j = json::parse(layer.ToJson());
  j["architectures"] = {kArchitecture};
  j["draft_vocab_size"] = draft_vocab_size;
  j["target_hidden_size"] = target_hidden_size;
  j["norm_before_residual"] = norm_before_residual;
  // Both forms of the aux ids, so that each server reads the layers this head was trained on:
  // upstream vLLM reads only the top-level list (inputs of those layers; without it, its
  // default (2, L/2, L-3)), SGLang and SpecForge only eagle_config's (outputs of those layers:
  // SGLang captures the input of layer id + 1). use_aux_hidden_state is written because vLLM
  // defaults it to true and some SGLang versions to false.
  json eagle_config = {{"use_aux_hidden_state", true}};
  if (!aux_layers.empty()) {
    std::vector<int> outputs_of;
    for (const int l : aux_layers) outputs_of.push_back(l - 1);
    j["eagle_aux_hidden_state_layer_ids"] = aux_layers;
    eagle_config["eagle_aux_hidden_state_layer_ids"] = outputs_of;
  }
  j["eagle_config"] = eagle_config;
  return j.dump(2) + "\n";
}

bool IsEagle3Dir(const std::string& dir) {
  std::string text;
  if (!ReadFileToString(dir + "/config.json", &text).ok()) return false;
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && IsEagle3Architecture(j);
}

std::vector<int> DefaultAuxLayers(int num_layers) {
  const int l = num_layers;
  if (2 < l / 2 && l / 2 < l - 3) return {2, l / 2, l - 3};
  if (1 < l / 2 && l / 2 < l - 1) return {1, l / 2, l - 1};
  return {};
}

}  // namespace specloop
