// RegexSplitter: the "Isolated" split of Hugging Face pre-tokenizers. Every match of a pattern
// becomes a piece, and so does every stretch of text between matches; the pieces concatenate
// back to the input.
//
// Patterns are written for the Rust `tokenizers` crate (Oniguruma syntax) and compiled with
// PCRE2 (UTF, Unicode properties, JIT). Two constructs are rewritten so that matches agree with
// the reference implementations:
// - `\s` and `\S` mean the Unicode White_Space property (as in Oniguruma and tokenizers.js;
//   PCRE2's own `\s` misses U+0085).
// - inline case-insensitive groups `(?i:...)` fold ASCII letters only (as tokenizers.js does;
//   PCRE2 would also match U+017F LONG S for `s`); character classes inside them keep PCRE2's
//   Unicode folding.
// Thread-safe for concurrent const calls.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"

namespace specloop {

class RegexSplitter {
 public:
  // InvalidArgument when `pattern` does not compile (the message carries PCRE2's reason).
  // `literal`: the pattern is a plain string to split on, not a regex.
  static Status Compile(const std::string& pattern, bool literal,
                        std::unique_ptr<RegexSplitter>* out);
  ~RegexSplitter();

  // Appends the pieces of `text` to `*pieces` (views into `text`; empty pieces are dropped).
  // REQUIRES: `text` is valid UTF-8.
  void Split(std::string_view text, std::vector<std::string_view>* pieces) const;

 private:
  RegexSplitter() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The pattern with `\s`/`\S` and `(?i:...)` rewritten as described above (exposed for tests).
std::string TranslateOnigurumaPattern(const std::string& pattern);

}  // namespace specloop
