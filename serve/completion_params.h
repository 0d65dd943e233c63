// Parsing and validation of a `POST /v1/completions` or `POST /v1/chat/completions` body into
// CompletionParams, with the OpenAI-style error a client gets for bad input. Runs on HTTP
// handler threads: it renders chat templates and tokenizes (ChatTemplate and Tokenizer are
// thread-safe for const calls) and never touches a model.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "common/chat/chat_template.h"
#include "common/tokenizer/generation_config.h"
#include "common/tokenizer/model_config.h"
#include "common/tokenizer/tokenizer.h"
#include "serve/request.h"

namespace specloop {

// An error response: HTTP status and the OpenAI error object
// {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field, or empty
  std::string code;   // e.g. "model_not_found", "context_length_exceeded", or empty

  nlohmann::json ToJson() const;
};

// What parsing needs to know about the served model.
struct CompletionLimits {
  std::string model_name;     // the id /v1/models lists; requests may name it or omit it
  const ModelConfig* config = nullptr;       // context limit, BOS
  const Tokenizer* tokenizer = nullptr;
  // The model's chat template (chat requests only). Default: null, the plain default template.
  const ChatTemplate* chat_template = nullptr;
  // Largest max_tokens accepted. Default: no limit beyond the context.
  int max_tokens_limit = 1 << 30;
  // Longest prompt in tokens (BOS included). Default: no limit beyond the context.
  int max_prompt_tokens = 1 << 30;
  // Longest accepted domain label, in bytes. Default: 64.
  size_t max_domain_bytes = 64;
  // What a request that omits temperature, top_p, top_k or max_tokens gets, and the extra
  // stop ids (the model's generation_config.json; common/tokenizer/generation_config.h).
  // Default: null, the plain defaults (temperature 1, top_p 1, top_k off) and none.
  const GenerationDefaults* defaults = nullptr;
};

// Most alternatives per position a request may ask for (`logprobs` / `top_logprobs`), as OpenAI.
constexpr int kMaxTopLogprobs = 20;

// The defaults in force, as /v1/models and `specloop generate --json` show them:
// {"temperature", "top_p", "top_k" (null: off), "max_tokens" (null: the API's own default),
//  "eos_token_ids" (the extra ones), "source"}.
nlohmann::json GenerationDefaultsJson(const GenerationDefaults& d);
// A request's sampling, as its response shows it: {"temperature", "top_p", "top_k" (null: off),
// "seed"}.
nlohmann::json SamplingJson(const SamplingParams& s);

// Parses `body` (JSON text). `header_domain`: the X-Domain header ("" if none); a `domain`
// field in the body wins over it. `default_seed`: the seed used when the body gives none.
// Returns true and fills *out (request_id left empty), or returns false and fills *error:
// 400 for malformed JSON, wrong types, out-of-range values, unsupported options and a prompt
// (plus max_tokens) over the context limit; 404 for an unknown model.
//
// Fields: prompt (a string, an array of one string, or token ids: an array of ids, or an array
// of one such array, used as they are, no BOS added, each id within the vocabulary),
// max_tokens (default 16, or the model's max_new_tokens where lower; >= 0), temperature
// [0, 2], top_p (0, 1], top_k (>= 0; -1 = off) (defaults: limits.defaults, else 1, 1, off;
// temperature 0 = greedy), stop (string or array of at most 4 strings), seed (integer), stream
// (bool), domain (string of [A-Za-z0-9_.-]), ignore_eos (bool, as vLLM; it also drops the
// extra stop ids), n (only 1), echo (only false), logprobs (null or an integer in [0, 20]: the
// chosen token's log-prob and that many alternatives per position), return_tokens_as_token_ids
// (bool, as vLLM: tokens shown as "token_id:ID"). Other fields are ignored, as
// OpenAI-compatible servers do.
bool ParseCompletionRequest(const std::string& body, const std::string& header_domain,
                            const CompletionLimits& limits, uint64_t default_seed,
                            CompletionParams* out, ApiError* error);

// Parses a chat request: as ParseCompletionRequest, with `messages` instead of `prompt`,
// rendered by limits.chat_template (ChatTemplate::Render) and tokenized by EncodeChatPrompt
// (one BOS, whether or not the template writes it); out->prompt_text is the rendered prompt.
//
// Fields beyond the shared ones (model, temperature, top_p, top_k, stop, seed, stream, domain,
// ignore_eos, n): messages (required, non-empty; role system, user, assistant or developer,
// the last passed to the template as system; content a string or an array of
// {"type": "text", "text"} parts, joined with "\n"; name), max_completion_tokens (wins over
// max_tokens; with neither, the room left in the context up to the server's limit),
// add_generation_prompt (default true), chat_template_kwargs (extra template variables, as
// vLLM), logprobs (bool) with top_logprobs (null or an integer in [0, 20]; only with logprobs
// true), return_tokens_as_token_ids. Errors (400): no or empty messages, wrong roles or types,
// tool calls, tools, a response_format other than text, and the template's own errors
// (code "chat_template_error", e.g. roles that do not alternate for Mistral's template).
bool ParseChatCompletionRequest(const std::string& body, const std::string& header_domain,
                                const CompletionLimits& limits, uint64_t default_seed,
                                CompletionParams* out, ApiError* error);

}  // namespace specloop
