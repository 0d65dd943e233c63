#include "common/tokenizer/generation_config.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include <nlohmann/json.hpp>

#include "common/tokenizer/json_int.h"
#include "common/tokenizer/model_config.h"

namespace specloop {

using nlohmann::json;

namespace {

Status Bad(const std::string& path, const char* key, const std::string& what, const json& v) {
  return Status::InvalidArgument(path + ": \"" + key + "\" must be " + what + ", got " +
                                 v.dump(-1, ' ', false, json::error_handler_t::replace));
}

// The value of `key`, or null when absent or null.
const json* Find(const json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

Status ReadNumber(const json& j, const char* key, const std::string& path, double lo,
                  bool lo_open, double hi, const std::string& what,
                  std::optional<double>* out) {
  const json* v = Find(j, key);
  if (v == nullptr) return Status::OK();
  if (!v->is_number()) return Bad(path, key, what, *v);
  const double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || (lo_open && d == lo) || d > hi) return Bad(path, key, what, *v);
  *out = d;
  return Status::OK();
}

Status ReadInt(const json& j, const char* key, const std::string& path, int lo,
               const std::string& what, std::optional<int>* out) {
  const json* v = Find(j, key);
  if (v == nullptr) return Status::OK();
  int i = 0;
  if (!JsonToInt(*v, &i) || i < lo) return Bad(path, key, what, *v);
  *out = i;
  return Status::OK();
}

// A key this engine does not implement: noted when its value is not `neutral`.
void NoteUnsupported(const json& j, const char* key, double neutral,
                     std::vector<std::string>* out) {
  const json* v = Find(j, key);
  if (v == nullptr || (v->is_number() && v->get<double>() == neutral)) return;
  out->push_back(std::string(key) + " " + v->dump(-1, ' ', false, json::error_handler_t::replace));
}

std::string Number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

}  // namespace

Status GenerationConfig::FromJson(const std::string& text, const std::string& path,
                                  GenerationConfig* out) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::InvalidArgument(path + ": not valid JSON");
  if (!j.is_object()) return Status::InvalidArgument(path + ": must be a JSON object");
  GenerationConfig c;
  c.present = true;
  // Bounded by float's range: a request holds its temperature in a float.
  SPECLOOP_RETURN_IF_ERROR(ReadNumber(j, "temperature", path, 0, false,
                                      std::numeric_limits<float>::max(),
                                      "a number >= 0 within float's range", &c.temperature));
  SPECLOOP_RETURN_IF_ERROR(
      ReadNumber(j, "top_p", path, 0, /*lo_open=*/true, 1, "a number in (0, 1]", &c.top_p));
  SPECLOOP_RETURN_IF_ERROR(ReadInt(j, "top_k", path, -1, "an integer >= -1", &c.top_k));
  if (const json* v = Find(j, "do_sample")) {
    if (!v->is_boolean()) return Bad(path, "do_sample", "a boolean", *v);
    c.do_sample = v->get<bool>();
  }
  SPECLOOP_RETURN_IF_ERROR(
      ReadInt(j, "max_new_tokens", path, 1, "an integer >= 1", &c.max_new_tokens));
  SPECLOOP_RETURN_IF_ERROR(
      ReadInt(j, "bos_token_id", path, 0, "a token id (an integer >= 0)", &c.bos_token_id));
  if (const json* v = Find(j, "eos_token_id")) {
    const std::string what = "a token id or a list of token ids (integers >= 0)";
    int id = 0;
    if (v->is_array()) {
      for (const json& e : *v) {
        if (!JsonToInt(e, &id) || id < 0) return Bad(path, "eos_token_id", what, *v);
        c.eos_token_ids.push_back(id);
      }
    } else if (JsonToInt(*v, &id) && id >= 0) {
      c.eos_token_ids.push_back(id);
    } else {
      return Bad(path, "eos_token_id", what, *v);
    }
  }
  NoteUnsupported(j, "repetition_penalty", 1.0, &c.unsupported);
  NoteUnsupported(j, "min_p", 0.0, &c.unsupported);
  *out = std::move(c);
  return Status::OK();
}

Status GenerationConfig::FromDir(const std::string& dir, GenerationConfig* out) {
  const std::string path = dir + "/generation_config.json";
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    *out = GenerationConfig();
    return Status::OK();
  }
  std::string text;
  SPECLOOP_RETURN_IF_ERROR(ReadFileToString(path, &text));
  return FromJson(text, path, out);
}

Status ParseGenerationConfigMode(const std::string& text, GenerationConfigMode* out) {
  if (text == "auto") {
    *out = GenerationConfigMode::kAuto;
  } else if (text == "ignore") {
    *out = GenerationConfigMode::kIgnore;
  } else {
    return Status::InvalidArgument("--generation-config takes auto or ignore, got '" + text + "'");
  }
  return Status::OK();
}

Status ResolveGenerationDefaults(const GenerationConfig& config, GenerationConfigMode mode,
                                 const std::vector<int>& model_eos, int vocab_size,
                                 GenerationDefaults* out) {
  GenerationDefaults d;
  for (int id : config.eos_token_ids) {
    if (id >= vocab_size) {
      return Status::InvalidArgument("generation_config.json: \"eos_token_id\" " +
                                     std::to_string(id) + " is outside the vocabulary (" +
                                     std::to_string(vocab_size) + " tokens)");
    }
    if (std::find(model_eos.begin(), model_eos.end(), id) == model_eos.end() &&
        std::find(d.eos_token_ids.begin(), d.eos_token_ids.end(), id) == d.eos_token_ids.end()) {
      d.eos_token_ids.push_back(id);
    }
  }
  if (mode == GenerationConfigMode::kIgnore || !config.present) {
    *out = std::move(d);
    return Status::OK();
  }
  const bool sampling_keys = config.temperature || config.top_p || config.top_k;
  if (config.do_sample == false) {
    d.sampling.temperature = 0.0f;
    d.source = "generation_config.json";
    if (sampling_keys) {
      std::string keys;
      if (config.temperature) keys += "temperature ";
      if (config.top_p) keys += "top_p ";
      if (config.top_k) keys += "top_k ";
      d.not_applied.push_back(keys + "not applied: do_sample is false (greedy)");
    }
  } else if (sampling_keys) {
    d.source = "generation_config.json";
    if (config.temperature) d.sampling.temperature = static_cast<float>(*config.temperature);
    if (config.top_p) d.sampling.top_p = static_cast<float>(*config.top_p);
    if (config.top_k) d.sampling.top_k = std::max(0, *config.top_k);
  }
  if (config.max_new_tokens) d.max_tokens = *config.max_new_tokens;
  for (const std::string& u : config.unsupported) {
    d.not_applied.push_back(u + " is not applied (not implemented)");
  }
  *out = std::move(d);
  return Status::OK();
}

std::string GenerationDefaults::Describe() const {
  std::string s = "temperature " + Number(sampling.temperature) + ", top_p " +
                  Number(sampling.top_p) + ", top_k " +
                  (sampling.top_k > 0 ? std::to_string(sampling.top_k) : std::string("off"));
  if (max_tokens > 0) s += ", max_tokens " + std::to_string(max_tokens);
  s += " (" + source + ")";
  if (!eos_token_ids.empty()) {
    s += "; extra EOS ids";
    for (int id : eos_token_ids) s += " " + std::to_string(id);
  }
  return s;
}

}  // namespace specloop
