// Tokenizer: text to token ids and back, for one model directory.
//
// Load() picks the tokenizer a directory ships: `tokenizer.json` (Hugging Face BPE, byte-level or
// sentencepiece-style, common/tokenizer/hf_tokenizer.h), `tokenizer.model` (sentencepiece) or
// `tokenizer.bin` (llama2.c's format, as `specloop convert llama2c` writes it), in that order (a
// tokenizer.json that is not supported gives way to a tokenizer.model beside it). Encode never
// adds BOS/EOS: callers add the model's BOS (ModelConfig::add_bos_token). Thread-safe for
// concurrent const calls.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"

namespace specloop {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Loads the tokenizer of model directory `dir`.
  static Status Load(const std::string& dir, std::unique_ptr<Tokenizer>* out);

  // The ids of `text`, with the tokenizer's own normalization (e.g. sentencepiece's dummy
  // prefix space); no BOS/EOS.
  virtual std::vector<int> Encode(const std::string& text) const = 0;

  // The text of `ids` as the continuation of `prev` (the id before ids[0], or -1 at the start
  // of a text): the leading space of the dummy prefix is dropped at the start or after BOS,
  // as sentencepiece and llama2.c do (not by tokenizers without a dummy prefix). Byte pieces
  // become raw bytes, so the result may end inside a UTF-8 sequence that the next ids complete.
  // Control ids (BOS, EOS; all special tokens of a tokenizer.json) decode to ""; ids outside
  // the vocabulary too.
  std::string Decode(const std::vector<int>& ids, int prev = -1) const;

  // Number of ids; every id the tokenizer emits is below it.
  int vocab_size() const { return static_cast<int>(surfaces_.size()); }

 protected:
  // The bytes each id decodes to (pieces with the space marker replaced, byte pieces as bytes).
  std::vector<std::string> surfaces_;
  int bos_id_ = 1;
  bool drop_leading_space_ = true;  // the tokenizer adds a dummy-prefix space
};

// Length of the longest prefix of `text` that does not end inside a UTF-8 sequence: streaming
// output holds back the rest until the next token completes it.
size_t CompleteUtf8Prefix(const std::string& text);

// `text` with each invalid UTF-8 sequence replaced by U+FFFD, one per maximal subpart, as the
// WHATWG decoder (Node, browsers) and Python's errors="replace" do. Valid text is unchanged.
std::string ToValidUtf8(std::string_view text);

// For streaming: replaces the invalid UTF-8 sequences of `*text` with U+FFFD, except a tail
// that the next bytes may still complete (kept as is unless `final`), and returns the length
// of the prefix before that tail. The prefix is valid UTF-8.
size_t RepairUtf8(std::string* text, bool final);

}  // namespace specloop
