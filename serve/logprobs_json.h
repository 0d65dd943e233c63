// LogprobsJson: a request's TokenLogprob entries (token_logprobs.h) in the shapes the OpenAI
// API returns, chunk by chunk (a stream's chunks carry their own tokens' entries; a whole
// response is one chunk of all of them):
//
//   completions  choices[].logprobs = {"tokens": [text, ...], "token_logprobs": [lp, ...],
//                "top_logprobs": [{text: lp, ...} per token] ({} when N = 0),
//                "text_offset": [offset of each token in the completion's text, ...]};
//   chat         choices[].logprobs = {"content": [{"token", "logprob", "bytes",
//                "top_logprobs": [{"token", "logprob", "bytes"}, ...]}, ...]};
//   generate     `specloop generate --json`'s "logprobs": chat's, each token and alternative
//                with its "token_id" too.
//
// A token's text is its decoded bytes as the continuation of the token before it
// (Tokenizer::Decode), invalid UTF-8 replaced by U+FFFD (`bytes` keeps the raw bytes), or
// "token_id:ID" with tokens_as_ids (vLLM's return_tokens_as_token_ids). text_offset counts
// characters (code points, as Python's str indices that OpenAI and vLLM use), a piece that
// ends inside a UTF-8 sequence counting the characters it starts. Two alternatives with the
// same text share one key of the completions API's top_logprobs object: the likelier one's.
//
// Not thread-safe (one per response, on its HTTP handler thread).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/tokenizer/tokenizer.h"
#include "serve/token_logprobs.h"

namespace specloop {

class LogprobsJson {
 public:
  enum class Format { kCompletions, kChat, kGenerate };
  // `tokenizer` (not owned) must outlive this object. `prev`: the prompt's last id.
  LogprobsJson(const Tokenizer* tokenizer, int prev, Format format, bool tokens_as_ids);

  // The `logprobs` object of a chunk carrying `entries`, the next tokens of the output.
  nlohmann::json Chunk(const std::vector<TokenLogprob>& entries);

 private:
  // The raw bytes of `token` after `prev`.
  std::string Bytes(int token, int prev) const;
  std::string Text(int token, const std::string& bytes) const;

  const Tokenizer* tokenizer_;
  int prev_;
  const Format format_;
  const bool tokens_as_ids_;
  int64_t offset_ = 0;  // characters of the output before the next token
};

}  // namespace specloop
