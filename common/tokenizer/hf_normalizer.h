// HfNormalizer: the "normalizer" of a Hugging Face tokenizer.json, applied as tokenizers.js
// applies it to each stretch of text between added tokens. Supported, alone or in a Sequence
// (run in order):
// - NFC (Qwen2/3);
// - Prepend: a string before the text (Llama 2 and Mistral 7B prepend "▁");
// - Replace with a String pattern: every occurrence, left to right without overlap, replaced by
//   the content (" " -> "▁").
// Any other normalizer (NFD, NFKC, Lowercase, Strip, BertNormalizer, Precompiled, ...), a Regex
// pattern, an empty pattern or a content with "$" (a JavaScript replacement pattern) is
// NotSupported, named.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/base/status.h"

namespace specloop {

class HfNormalizer {
 public:
  // From the "normalizer" value of tokenizer.json (null: none). NotSupported as above.
  static Status Parse(const nlohmann::json& normalizer, HfNormalizer* out);

  // Whether the file has a normalizer at all (tokenizers.js then matches "normalized" added
  // tokens after normalizing; an empty Sequence counts as one).
  bool present() const { return present_; }
  // `text` normalized. REQUIRES: `text` is valid UTF-8 (the result is too).
  std::string Apply(std::string_view text) const;

 private:
  struct Step {
    enum class Kind { kNfc, kPrepend, kReplace } kind;
    std::string pattern, content;  // Prepend: content; Replace: pattern -> content
  };
  bool present_ = false;
  std::vector<Step> steps_;
};

// NFC of valid UTF-8 (utf8proc; ASCII runs are copied through).
std::string Nfc(std::string_view text);

// `text` with every occurrence of `pattern` (non-empty), left to right, replaced by `content`.
std::string ReplaceAll(std::string_view text, std::string_view pattern, std::string_view content);

}  // namespace specloop
