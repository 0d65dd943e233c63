// HfDecoder: the "decoder" of a Hugging Face tokenizer.json, as what each token adds to the
// decoded text (the per-id surfaces Tokenizer::Decode joins) and whether the text then loses one
// leading space. Two kinds:
// - byte-level (files with a ByteLevel pre-tokenizer; decoder ByteLevel or none): a token's
//   characters map back to bytes through GPT-2's byte-to-unicode table;
// - sentencepiece-style: Metaspace ("▁" -> " ", the first token's leading space dropped), or a
//   Sequence of Replace steps (String patterns; Metaspace counts as one), then ByteFallback (a
//   token spelled "<0xNN>" becomes that byte), then Fuse, then Strip of one leading " ".
//   Joining raw bytes equals tokenizers.js's text wherever its ByteFallback sees valid UTF-8
//   (every encoded text); elsewhere ToValidUtf8 of the joined bytes equals it.
// Anything else (WordPiece, BPEDecoder, CTC, no decoder for a sentencepiece-style file, a Regex
// pattern, Replace after ByteFallback, a step after Fuse other than that Strip, Strip of more
// than one leading character or of trailing ones) is NotSupported, named.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/base/status.h"

namespace specloop {

class HfDecoder {
 public:
  // From the "decoder" value of tokenizer.json; `byte_level`: the file's pre-tokenizer is
  // ByteLevel.
  static Status Parse(const nlohmann::json& decoder, bool byte_level, HfDecoder* out);

  // The bytes `token` (as the vocabulary or an added token spells it) decodes to.
  std::string Surface(const std::string& token) const;
  // Whether the decoded text loses one leading space.
  bool strips_leading_space() const { return strip_leading_space_; }
  // `text` with the per-token Replace steps applied (for HfTokenizer::Normalize).
  std::string Replace(std::string_view text) const;

 private:
  struct ReplaceStep {
    std::string pattern, content;
  };
  bool byte_level_ = false;
  std::vector<ReplaceStep> replace_;
  bool byte_fallback_ = false;
  bool strip_leading_space_ = false;
};

// The bytes a byte-level vocabulary spelling stands for (GPT-2's byte-to-unicode map
// reversed); false when it has a character outside the map.
bool ByteLevelToBytes(const std::string& piece, std::string* bytes);

// The byte tokenizers.js's ByteFallback decoder reads from `token`: a token of 6 UTF-16 units,
// "<0x" + two units + ">", whose two units JavaScript's parseInt(_, 16) reads as a number
// (mod 256); -1 for any other token.
int ByteFallbackValue(std::string_view token);

// Whether `cp` is JavaScript whitespace (what String.prototype.trim and parseInt skip: Unicode
// Zs, tab, line terminators, VT, FF, U+FEFF; not U+0085).
bool IsJsWhiteSpace(int cp);

}  // namespace specloop
