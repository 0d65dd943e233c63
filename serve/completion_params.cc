#include "serve/completion_params.h"

#include <algorithm>
#include <cmath>

namespace specloop {

using json = nlohmann::json;

json ApiError::ToJson() const {
  json e = {{"message", message}, {"type", type}};
  e["param"] = param.empty() ? json(nullptr) : json(param);
  e["code"] = code.empty() ? json(nullptr) : json(code);
  return {{"error", e}};
}

namespace {

bool Fail(ApiError* error, int status, std::string message, std::string param = "",
          std::string code = "") {
  error->status = status;
  error->message = std::move(message);
  error->param = std::move(param);
  error->code = std::move(code);
  if (status == 404) error->type = "invalid_request_error";
  return false;
}

bool ValidDomain(const std::string& d, size_t max_bytes) {
  if (d.empty() || d.size() > max_bytes) return false;
  return std::all_of(d.begin(), d.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '-' || c == '.';
  });
}

// Reads an optional number field into *v; false (with *error filled) on a wrong type.
bool GetNumber(const json& j, const char* key, double* v, bool* present, ApiError* error) {
  *present = false;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return true;
  if (!it->is_number()) return Fail(error, 400, std::string(key) + " must be a number", key);
  *v = it->get<double>();
  if (!std::isfinite(*v)) return Fail(error, 400, std::string(key) + " must be finite", key);
  *present = true;
  return true;
}

bool GetInteger(const json& j, const char* key, int64_t* v, bool* present, ApiError* error) {
  *present = false;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return true;
  if (!it->is_number_integer()) {
    // 16.0 is an integer in JSON's eyes for some clients; accept integral floats.
    if (it->is_number_float()) {
      const double d = it->get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) {
        *v = static_cast<int64_t>(d);
        *present = true;
        return true;
      }
    }
    return Fail(error, 400, std::string(key) + " must be an integer", key);
  }
  *v = it->is_number_unsigned() ? static_cast<int64_t>(it->get<uint64_t>()) : it->get<int64_t>();
  *present = true;
  return true;
}

bool GetBool(const json& j, const char* key, bool* v, ApiError* error) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return true;
  if (!it->is_boolean()) return Fail(error, 400, std::string(key) + " must be a boolean", key);
  *v = it->get<bool>();
  return true;
}

}  // namespace

bool ParseCompletionRequest(const std::string& body, const std::string& header_domain,
                            const CompletionLimits& limits, uint64_t default_seed,
                            CompletionParams* out, ApiError* error) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Fail(error, 400, "request body is not valid JSON");
  if (!j.is_object()) return Fail(error, 400, "request body must be a JSON object");
  CompletionParams p;

  // model
  p.model = limits.model_name;
  if (auto it = j.find("model"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return Fail(error, 400, "model must be a string", "model");
    if (it->get<std::string>() != limits.model_name) {
      return Fail(error, 404,
                  "The model '" + it->get<std::string>() + "' does not exist; this server "
                  "serves '" + limits.model_name + "'",
                  "model", "model_not_found");
    }
  }

  // prompt
  auto pit = j.find("prompt");
  if (pit == j.end() || pit->is_null()) return Fail(error, 400, "prompt is required", "prompt");
  if (pit->is_array()) {
    if (pit->size() != 1 || !(*pit)[0].is_string()) {
      return Fail(error, 400, "prompt must be a string or an array of exactly one string",
                  "prompt");
    }
    p.prompt_text = (*pit)[0].get<std::string>();
  } else if (pit->is_string()) {
    p.prompt_text = pit->get<std::string>();
  } else {
    return Fail(error, 400, "prompt must be a string", "prompt");
  }

  // Unsupported options that change the response shape.
  int64_t n = 1;
  bool present = false;
  if (!GetInteger(j, "n", &n, &present, error)) return false;
  if (n != 1) return Fail(error, 400, "only n = 1 is supported", "n");
  bool echo = false;
  if (!GetBool(j, "echo", &echo, error)) return false;
  if (echo) return Fail(error, 400, "echo is not supported", "echo");
  if (auto it = j.find("logprobs"); it != j.end() && !it->is_null() &&
                                    !(it->is_number_integer() && it->get<int64_t>() == 0)) {
    return Fail(error, 400, "logprobs is not supported", "logprobs");
  }

  // Sampling.
  double temperature = 1.0, top_p = 1.0;
  if (!GetNumber(j, "temperature", &temperature, &present, error)) return false;
  if (temperature < 0 || temperature > 2) {
    return Fail(error, 400, "temperature must be in [0, 2]", "temperature");
  }
  if (!GetNumber(j, "top_p", &top_p, &present, error)) return false;
  if (!(top_p > 0 && top_p <= 1)) return Fail(error, 400, "top_p must be in (0, 1]", "top_p");
  int64_t top_k = 0, seed = static_cast<int64_t>(default_seed), max_tokens = 16;
  if (!GetInteger(j, "top_k", &top_k, &present, error)) return false;
  if (top_k == -1) top_k = 0;
  if (top_k < 0 || top_k > (1 << 30)) return Fail(error, 400, "top_k must be >= 0 (or -1)", "top_k");
  if (!GetInteger(j, "seed", &seed, &present, error)) return false;
  bool max_tokens_given = false;
  if (!GetInteger(j, "max_tokens", &max_tokens, &max_tokens_given, error)) return false;
  if (max_tokens < 0) return Fail(error, 400, "max_tokens must be >= 0", "max_tokens");
  if (max_tokens > limits.max_tokens_limit) {
    return Fail(error, 400,
                "max_tokens must be <= " + std::to_string(limits.max_tokens_limit),
                "max_tokens");
  }
  p.generate.sampling = {static_cast<float>(temperature), static_cast<int>(top_k),
                         static_cast<float>(top_p), static_cast<uint64_t>(seed)};
  if (std::string e = p.generate.sampling.Validate(); !e.empty()) return Fail(error, 400, e);

  // stop
  if (auto it = j.find("stop"); it != j.end() && !it->is_null()) {
    if (it->is_string()) {
      p.stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      if (it->size() > 4) return Fail(error, 400, "stop takes at most 4 strings", "stop");
      for (const auto& s : *it) {
        if (!s.is_string()) return Fail(error, 400, "stop must be strings", "stop");
        p.stop.push_back(s.get<std::string>());
      }
    } else {
      return Fail(error, 400, "stop must be a string or an array of strings", "stop");
    }
    p.stop.erase(std::remove(p.stop.begin(), p.stop.end(), ""), p.stop.end());
  }

  if (!GetBool(j, "stream", &p.stream, error)) return false;
  bool ignore_eos = false;
  if (!GetBool(j, "ignore_eos", &ignore_eos, error)) return false;
  p.generate.stop_at_eos = !ignore_eos;

  // domain: body field, else header, else "default".
  p.domain = header_domain.empty() ? "default" : header_domain;
  if (auto it = j.find("domain"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return Fail(error, 400, "domain must be a string", "domain");
    p.domain = it->get<std::string>();
  }
  if (!ValidDomain(p.domain, limits.max_domain_bytes)) {
    return Fail(error, 400,
                "domain must be 1 to " + std::to_string(limits.max_domain_bytes) +
                    " characters of [A-Za-z0-9_.-]",
                "domain");
  }

  // Tokenize and check the context.
  const ModelConfig& c = *limits.config;
  p.prompt = limits.tokenizer->Encode(p.prompt_text);
  if (c.add_bos_token) p.prompt.insert(p.prompt.begin(), c.bos_token_id);
  if (p.prompt.empty()) return Fail(error, 400, "prompt must not be empty", "prompt");
  const int64_t ctx = c.max_position_embeddings;
  const int64_t plen = static_cast<int64_t>(p.prompt.size());
  if (plen >= ctx) {
    return Fail(error, 400,
                "This model's maximum context length is " + std::to_string(ctx) +
                    " tokens; the prompt has " + std::to_string(plen) + " tokens",
                "prompt", "context_length_exceeded");
  }
  if (plen > limits.max_prompt_tokens) {
    return Fail(error, 400,
                "The prompt has " + std::to_string(plen) + " tokens; this server accepts at most " +
                    std::to_string(limits.max_prompt_tokens),
                "prompt", "prompt_too_long");
  }
  if (!max_tokens_given) max_tokens = std::min<int64_t>(max_tokens, ctx - plen);
  if (plen + max_tokens > ctx) {
    return Fail(error, 400,
                "This model's maximum context length is " + std::to_string(ctx) +
                    " tokens; you requested " + std::to_string(plen + max_tokens) + " (" +
                    std::to_string(plen) + " in the prompt, " + std::to_string(max_tokens) +
                    " in the completion)",
                "max_tokens", "context_length_exceeded");
  }
  p.generate.max_tokens = static_cast<int>(max_tokens);
  *out = std::move(p);
  return true;
}

}  // namespace specloop
