// Parsing and validation of a `POST /v1/completions` or `POST /v1/chat/completions` body into
// CompletionParams, with the OpenAI-style error a client gets for bad input. Runs on HTTP
// handler threads: it renders chat templates and tokenizes (ChatTemplate and Tokenizer are
// thread-safe for const calls) and never touches a model.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "common/chat/chat_template.h"
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
};

// Parses `body` (JSON text). `header_domain`: the X-Domain header ("" if none); a `domain`
// field in the body wins over it. `default_seed`: the seed used when the body gives none.
// Returns true and fills *out (request_id left empty), or returns false and fills *error:
// 400 for malformed JSON, wrong types, out-of-range values, unsupported options and a prompt
// (plus max_tokens) over the context limit; 404 for an unknown model.
//
// Fields: prompt (string, or an array of one string), max_tokens (default 16, >= 0),
// temperature [0, 2] (default 1; 0 = greedy), top_p (0, 1], top_k (>= 0; -1 = off), stop
// (string or array of at most 4 strings), seed (integer), stream (bool), domain (string of
// [A-Za-z0-9_.-]), ignore_eos (bool, as vLLM), n (only 1), echo (only false), logprobs (only
// null/0). Other fields are ignored, as OpenAI-compatible servers do.
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
// vLLM), logprobs (only false). Errors (400): no or empty messages, wrong roles or types,
// tool calls, tools, a response_format other than text, and the template's own errors
// (code "chat_template_error", e.g. roles that do not alternate for Mistral's template).
bool ParseChatCompletionRequest(const std::string& body, const std::string& header_domain,
                                const CompletionLimits& limits, uint64_t default_seed,
                                CompletionParams* out, ApiError* error);

}  // namespace specloop
