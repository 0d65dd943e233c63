#include "serve/completion_params.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace specloop {

using json = nlohmann::json;

json ApiError::ToJson() const {
  json e = {{"message", message}, {"type", type}};
  e["param"] = param.empty() ? json(nullptr) : json(param);
  e["code"] = code.empty() ? json(nullptr) : json(code);
  return {{"error", e}};
}

json GenerationDefaultsJson(const GenerationDefaults& d) {
  json j = SamplingJson(d.sampling);
  j.erase("seed");
  j["max_tokens"] = d.max_tokens > 0 ? json(d.max_tokens) : json(nullptr);
  j["eos_token_ids"] = d.eos_token_ids;
  j["source"] = d.source;
  return j;
}

namespace {
// A float parameter as the decimal it was written as (0.6f shows as 0.6, not 0.6000000238).
double Decimal(float v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.7g", v);
  return std::strtod(buf, nullptr);
}
}  // namespace

json SamplingJson(const SamplingParams& s) {
  return {{"temperature", Decimal(s.temperature)},
          {"top_p", Decimal(s.top_p)},
          {"top_k", s.top_k > 0 ? json(s.top_k) : json(nullptr)},
          {"seed", s.seed}};
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

// Parses `body` into *body_json (a JSON object) and reads the fields /v1/completions and
// /v1/chat/completions share: model, n, sampling, seed, max_tokens (and for chat
// max_completion_tokens), stop, stream, ignore_eos, domain. *max_tokens gets the requested
// count, or -1 when the request gives none.
bool ParseCommonFields(const std::string& body, const std::string& header_domain,
                       const CompletionLimits& limits, uint64_t default_seed, bool chat,
                       json* body_json, CompletionParams* p, int64_t* max_tokens,
                       ApiError* error) {
  *body_json = json::parse(body, nullptr, /*allow_exceptions=*/false);
  const json& j = *body_json;
  if (j.is_discarded()) return Fail(error, 400, "request body is not valid JSON");
  if (!j.is_object()) return Fail(error, 400, "request body must be a JSON object");
  // model
  p->model = limits.model_name;
  if (auto it = j.find("model"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return Fail(error, 400, "model must be a string", "model");
    if (it->get<std::string>() != limits.model_name) {
      return Fail(error, 404,
                  "The model '" + it->get<std::string>() + "' does not exist; this server "
                  "serves '" + limits.model_name + "'",
                  "model", "model_not_found");
    }
  }

  // Unsupported options that change the response shape.
  int64_t n = 1;
  bool present = false;
  if (!GetInteger(j, "n", &n, &present, error)) return false;
  if (n != 1) return Fail(error, 400, "only n = 1 is supported", "n");
  const std::string range = "[0, " + std::to_string(kMaxTopLogprobs) + "]";
  if (chat) {
    // logprobs: true, with top_logprobs alternatives (none when absent).
    bool logprobs = false;
    if (!GetBool(j, "logprobs", &logprobs, error)) return false;
    int64_t top = 0;
    if (!GetInteger(j, "top_logprobs", &top, &present, error)) return false;
    if (present && !logprobs) {
      return Fail(error, 400, "top_logprobs needs logprobs: true", "top_logprobs");
    }
    if (top < 0 || top > kMaxTopLogprobs) {
      return Fail(error, 400, "top_logprobs must be an integer in " + range, "top_logprobs");
    }
    if (logprobs) p->logprobs = static_cast<int>(top);
  } else {
    bool echo = false;
    if (!GetBool(j, "echo", &echo, error)) return false;
    if (echo) return Fail(error, 400, "echo is not supported", "echo");
    // logprobs: the number of alternatives (the legacy completions API's integer).
    int64_t top = 0;
    if (!GetInteger(j, "logprobs", &top, &present, error)) return false;
    if (top < 0 || top > kMaxTopLogprobs) {
      return Fail(error, 400, "logprobs must be an integer in " + range, "logprobs");
    }
    if (present) p->logprobs = static_cast<int>(top);
  }
  if (!GetBool(j, "return_tokens_as_token_ids", &p->tokens_as_ids, error)) return false;

  // Sampling: what the request gives, else the model's defaults (limits.defaults).
  static const GenerationDefaults kPlain;
  const GenerationDefaults& defaults = limits.defaults ? *limits.defaults : kPlain;
  double temperature = defaults.sampling.temperature, top_p = defaults.sampling.top_p;
  if (!GetNumber(j, "temperature", &temperature, &present, error)) return false;
  if (present && (temperature < 0 || temperature > 2)) {
    return Fail(error, 400, "temperature must be in [0, 2]", "temperature");
  }
  if (!GetNumber(j, "top_p", &top_p, &present, error)) return false;
  if (!(top_p > 0 && top_p <= 1)) return Fail(error, 400, "top_p must be in (0, 1]", "top_p");
  int64_t top_k = defaults.sampling.top_k, seed = static_cast<int64_t>(default_seed);
  if (!GetInteger(j, "top_k", &top_k, &present, error)) return false;
  if (top_k == -1) top_k = 0;
  if (top_k < 0 || top_k > (1 << 30)) return Fail(error, 400, "top_k must be >= 0 (or -1)", "top_k");
  if (!GetInteger(j, "seed", &seed, &present, error)) return false;
  *max_tokens = -1;
  // Chat's max_completion_tokens (OpenAI's current name) wins over max_tokens.
  for (const char* key : chat ? std::vector<const char*>{"max_tokens", "max_completion_tokens"}
                              : std::vector<const char*>{"max_tokens"}) {
    int64_t v = 0;
    if (!GetInteger(j, key, &v, &present, error)) return false;
    if (!present) continue;
    if (v < 0) return Fail(error, 400, std::string(key) + " must be >= 0", key);
    if (v > limits.max_tokens_limit) {
      return Fail(error, 400, std::string(key) + " must be <= " +
                                  std::to_string(limits.max_tokens_limit), key);
    }
    *max_tokens = v;
  }
  p->generate.sampling = {static_cast<float>(temperature), static_cast<int>(top_k),
                          static_cast<float>(top_p), static_cast<uint64_t>(seed)};
  if (std::string e = p->generate.sampling.Validate(); !e.empty()) return Fail(error, 400, e);

  // stop
  if (auto it = j.find("stop"); it != j.end() && !it->is_null()) {
    if (it->is_string()) {
      p->stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      if (it->size() > 4) return Fail(error, 400, "stop takes at most 4 strings", "stop");
      for (const auto& s : *it) {
        if (!s.is_string()) return Fail(error, 400, "stop must be strings", "stop");
        p->stop.push_back(s.get<std::string>());
      }
    } else {
      return Fail(error, 400, "stop must be a string or an array of strings", "stop");
    }
    p->stop.erase(std::remove(p->stop.begin(), p->stop.end(), ""), p->stop.end());
  }

  if (!GetBool(j, "stream", &p->stream, error)) return false;
  bool ignore_eos = false;
  if (!GetBool(j, "ignore_eos", &ignore_eos, error)) return false;
  p->generate.stop_at_eos = !ignore_eos;
  if (!ignore_eos) p->stop_token_ids = defaults.eos_token_ids;

  // domain: body field, else header, else "default".
  p->domain = header_domain.empty() ? "default" : header_domain;
  if (auto it = j.find("domain"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return Fail(error, 400, "domain must be a string", "domain");
    p->domain = it->get<std::string>();
  }
  if (!ValidDomain(p->domain, limits.max_domain_bytes)) {
    return Fail(error, 400,
                "domain must be 1 to " + std::to_string(limits.max_domain_bytes) +
                    " characters of [A-Za-z0-9_.-]",
                "domain");
  }
  return true;
}

// Checks p->prompt (ids) against the context and sets max_tokens: the request's, else
// `default_max` (-1: all the room, up to the limit), or the model's max_new_tokens where lower,
// capped by the room left in the context.
bool FinishPrompt(const CompletionLimits& limits, int64_t max_tokens, int64_t default_max,
                  const char* param, CompletionParams* p, ApiError* error) {
  const ModelConfig& c = *limits.config;
  if (limits.defaults != nullptr && limits.defaults->max_tokens > 0) {
    default_max = default_max < 0 ? limits.defaults->max_tokens
                                  : std::min<int64_t>(default_max, limits.defaults->max_tokens);
  }
  if (p->prompt.empty()) return Fail(error, 400, std::string(param) + " must not be empty", param);
  const int64_t ctx = c.max_model_len;
  const int64_t plen = static_cast<int64_t>(p->prompt.size());
  if (plen >= ctx) {
    return Fail(error, 400,
                "This model's maximum context length is " + std::to_string(ctx) +
                    " tokens; the prompt has " + std::to_string(plen) + " tokens",
                param, "context_length_exceeded");
  }
  if (plen > limits.max_prompt_tokens) {
    return Fail(error, 400,
                "The prompt has " + std::to_string(plen) + " tokens; this server accepts at most " +
                    std::to_string(limits.max_prompt_tokens),
                param, "prompt_too_long");
  }
  if (max_tokens < 0) {
    max_tokens = std::min<int64_t>(ctx - plen, limits.max_tokens_limit);
    if (default_max >= 0) max_tokens = std::min(max_tokens, default_max);
  }
  if (plen + max_tokens > ctx) {
    return Fail(error, 400,
                "This model's maximum context length is " + std::to_string(ctx) +
                    " tokens; you requested " + std::to_string(plen + max_tokens) + " (" +
                    std::to_string(plen) + " in the prompt, " + std::to_string(max_tokens) +
                    " in the completion)",
                "max_tokens", "context_length_exceeded");
  }
  p->generate.max_tokens = static_cast<int>(max_tokens);
  return true;
}

// The messages of a chat request as the template sees them: role and content strings (text
// parts joined with "\n"), plus `name` when given. Roles: system, user, assistant, and
// developer (OpenAI's newer name for system, passed on as "system").
bool ParseMessages(const json& j, json* out, ApiError* error) {
  auto it = j.find("messages");
  if (it == j.end() || it->is_null()) return Fail(error, 400, "messages is required", "messages");
  if (!it->is_array()) return Fail(error, 400, "messages must be an array", "messages");
  if (it->empty()) return Fail(error, 400, "messages must not be empty", "messages");
  *out = json::array();
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return Fail(error, 400, where + " must be an object", "messages");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return Fail(error, 400, where + ".role must be a string", "messages");
    }
    std::string r = role->get<std::string>();
    if (r == "developer") r = "system";
    if (r != "system" && r != "user" && r != "assistant") {
      return Fail(error, 400,
                  where + ".role '" + role->get<std::string>() + "' is not supported (system, "
                  "user, assistant, developer; this server has no tool calling)",
                  "messages");
    }
    auto content = m.find("content");
    std::string text;
    if (content == m.end() || content->is_null()) {
      return Fail(error, 400, where + ".content is required", "messages");
    } else if (content->is_string()) {
      text = content->get<std::string>();
    } else if (content->is_array()) {
      for (size_t k = 0; k < content->size(); ++k) {
        const json& part = (*content)[k];
        if (!part.is_object() || !part.contains("type") || part.at("type") != "text" ||
            !part.contains("text") || !part.at("text").is_string()) {
          return Fail(error, 400,
                      where + ".content[" + std::to_string(k) + "] must be a text part "
                      "({\"type\": \"text\", \"text\": ...}); other parts are not supported",
                      "messages");
        }
        if (k) text += "\n";
        text += part.at("text").get<std::string>();
      }
    } else {
      return Fail(error, 400, where + ".content must be a string or an array of text parts",
                  "messages");
    }
    json msg = {{"role", r}, {"content", text}};
    if (auto name = m.find("name"); name != m.end() && !name->is_null()) {
      if (!name->is_string()) return Fail(error, 400, where + ".name must be a string", "messages");
      msg["name"] = *name;
    }
    if (auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null() &&
                                           !(calls->is_array() && calls->empty())) {
      return Fail(error, 400, where + ".tool_calls: tool calling is not supported", "messages");
    }
    out->push_back(std::move(msg));
  }
  return true;
}

}  // namespace

bool ParseCompletionRequest(const std::string& body, const std::string& header_domain,
                            const CompletionLimits& limits, uint64_t default_seed,
                            CompletionParams* out, ApiError* error) {
  json j;
  CompletionParams p;
  int64_t max_tokens = -1;
  if (!ParseCommonFields(body, header_domain, limits, default_seed, /*chat=*/false, &j, &p,
                         &max_tokens, error)) {
    return false;
  }
  // prompt: text (tokenized, BOS added when the model wants one), or token ids as given.
  auto pit = j.find("prompt");
  if (pit == j.end() || pit->is_null()) return Fail(error, 400, "prompt is required", "prompt");
  const json* ids = nullptr;
  if (pit->is_array() && !pit->empty() && (*pit)[0].is_number()) {
    ids = &*pit;
  } else if (pit->is_array() && pit->size() == 1 && (*pit)[0].is_array()) {
    ids = &(*pit)[0];
  } else if (pit->is_array()) {
    if (pit->size() != 1 || !(*pit)[0].is_string()) {
      return Fail(error, 400,
                  "prompt must be a string, token ids, or an array of exactly one of them",
                  "prompt");
    }
    p.prompt_text = (*pit)[0].get<std::string>();
  } else if (pit->is_string()) {
    p.prompt_text = pit->get<std::string>();
  } else {
    return Fail(error, 400, "prompt must be a string or token ids", "prompt");
  }
  if (ids != nullptr) {
    const int vocab = limits.config->vocab_size;
    for (const json& id : *ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab) {
        return Fail(error, 400,
                    "prompt token ids must be integers in [0, " + std::to_string(vocab) + ")",
                    "prompt");
      }
      p.prompt.push_back(static_cast<int>(id.get<int64_t>()));
    }
  } else {
    p.prompt = limits.tokenizer->Encode(p.prompt_text);
    if (limits.config->add_bos_token) {
      p.prompt.insert(p.prompt.begin(), limits.config->bos_token_id);
    }
  }
  if (!FinishPrompt(limits, max_tokens, /*default_max=*/16, "prompt", &p, error)) return false;
  *out = std::move(p);
  return true;
}

bool ParseChatCompletionRequest(const std::string& body, const std::string& header_domain,
                                const CompletionLimits& limits, uint64_t default_seed,
                                CompletionParams* out, ApiError* error) {
  json j;
  CompletionParams p;
  int64_t max_tokens = -1;
  if (!ParseCommonFields(body, header_domain, limits, default_seed, /*chat=*/true, &j, &p,
                         &max_tokens, error)) {
    return false;
  }
  json messages;
  if (!ParseMessages(j, &messages, error)) return false;
  if (auto it = j.find("tools"); it != j.end() && !it->is_null() &&
                                 !(it->is_array() && it->empty())) {
    return Fail(error, 400, "tools are not supported", "tools");
  }
  if (auto it = j.find("response_format"); it != j.end() && !it->is_null() &&
      !(it->is_object() && it->contains("type") && it->at("type") == "text")) {
    return Fail(error, 400, "response_format other than text is not supported", "response_format");
  }
  ChatRenderOptions render;
  if (!GetBool(j, "add_generation_prompt", &render.add_generation_prompt, error)) return false;
  if (auto it = j.find("chat_template_kwargs"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) {
      return Fail(error, 400, "chat_template_kwargs must be an object", "chat_template_kwargs");
    }
    for (const char* reserved : {"messages", "add_generation_prompt"}) {
      if (it->contains(reserved)) {
        return Fail(error, 400, std::string("chat_template_kwargs may not set ") + reserved,
                    "chat_template_kwargs");
      }
    }
    render.variables = *it;
  }
  // Rendering is bounded by the body limit: a template writes little beyond its messages.
  render.max_prompt_bytes = std::max<size_t>(body.size() * 4, 1 << 20);
  static const std::unique_ptr<ChatTemplate> kDefault = ChatTemplate::Default();
  const ChatTemplate* tmpl = limits.chat_template ? limits.chat_template : kDefault.get();
  if (Status s = tmpl->Render(messages, render, &p.prompt_text); !s.ok()) {
    return Fail(error, 400, s.message(), "messages", "chat_template_error");
  }
  p.prompt = EncodeChatPrompt(p.prompt_text, tmpl->bos_token(), *limits.config, *limits.tokenizer);
  if (!FinishPrompt(limits, max_tokens, /*default_max=*/-1, "messages", &p, error)) return false;
  *out = std::move(p);
  return true;
}

}  // namespace specloop
