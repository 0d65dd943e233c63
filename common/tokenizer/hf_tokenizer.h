// HfTokenizer: a Hugging Face `tokenizer.json` with a byte-level BPE model, the tokenizer of
// Llama 3, Qwen2/3, Mistral-Nemo, SmolLM and GPT-2. Encoding a text:
//
// 1. Invalid UTF-8 becomes U+FFFD (ToValidUtf8: what the text would be as a JavaScript or
//    Python string).
// 2. Added tokens are cut out, leftmost-longest, as whole tokens (lstrip/rstrip trim the
//    whitespace beside them; single_word is ignored, as tokenizers.js does). Special ones only
//    when `parse_special` (the default, unless tokenizer_config.json sets
//    "split_special_tokens"); otherwise their text is ordinary text.
// 3. The normalizer (none or NFC) runs on the text between added tokens.
// 4. The pre-tokenizers cut it into pieces, in order: Split (a regex, "Isolated"), Digits
//    (runs of, or single, \p{N} characters), ByteLevel (the GPT-2 regex when use_regex;
//    add_prefix_space on each piece).
// 5. Each piece, as bytes, is merged by BPE: the adjacent pair with the lowest merge rank
//    first, leftmost on ties. With "ignore_merges" (Llama 3) a piece that is itself in the
//    vocabulary is one token.
//
// Decoding joins each id's bytes (the GPT-2 byte-to-unicode map reversed); a non-special
// added token decodes to its text, a special token to "" (like skip_special_tokens), so
// Decode(Encode(x, false)) == x for every valid UTF-8 x the normalizer leaves alone (NFC text
// for Qwen). No dummy-prefix space is dropped.
//
// Not implemented (Open returns NotSupported): other models (Unigram, WordPiece), byte_fallback,
// other normalizers and pre-tokenizers, Split behaviours other than Isolated.
// Thread-safe for concurrent const calls.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/tokenizer/byte_bpe.h"
#include "common/tokenizer/regex_splitter.h"
#include "common/tokenizer/tokenizer.h"

namespace specloop {

class HfTokenizer : public Tokenizer {
 public:
  // Reads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json. Corruption for a
  // malformed file, NotSupported for components not implemented (see above).
  static Status Open(const std::string& dir, std::unique_ptr<HfTokenizer>* out);

  // Encode(text, parse_special_by_default()).
  std::vector<int> Encode(const std::string& text) const override;
  // The ids of `text`, without the BOS/EOS of the post-processor.
  std::vector<int> Encode(const std::string& text, bool parse_special) const;
  // As Hugging Face's encode(text) with add_special_tokens: Encode(text) between the ids the
  // post-processor template puts before and after a single sequence (tokenizer_config.json's
  // add_bos_token / add_eos_token override the template's BOS / EOS).
  std::vector<int> EncodeWithSpecialTokens(const std::string& text) const;

  // `text` as the normalizer leaves it (NFC, or unchanged). Decode(Encode(x, false)) ==
  // Normalize(ToValidUtf8(x)).
  std::string Normalize(std::string_view text) const;

  bool parse_special_by_default() const { return parse_special_by_default_; }
  // The ids EncodeWithSpecialTokens puts before / after the text.
  const std::vector<int>& prefix_ids() const { return prefix_ids_; }
  const std::vector<int>& suffix_ids() const { return suffix_ids_; }
  // The token as the vocabulary spells it (byte-level characters, e.g. "Ġthe"); "" for ids
  // outside the vocabulary.
  std::string Piece(int id) const;
  bool IsSpecial(int id) const;

 private:
  struct AddedToken {
    std::string content;
    int id = -1;
    bool special = false, lstrip = false, rstrip = false, normalized = false;
  };
  struct PreTokenizerStep {
    std::unique_ptr<RegexSplitter> splitter;  // null: no split
    bool add_prefix_space = false;
  };
  // Added tokens to cut out in one pass, by first byte, longest first.
  struct AddedSet {
    std::vector<int> by_first_byte[256];  // indices into added_
  };

  HfTokenizer() = default;
  Status Parse(const std::string& json_text, const std::string& config_text);

  // Appends the ids of a section between added tokens (after normalization).
  void EncodeSection(std::string_view text, bool parse_special, std::vector<int>* ids) const;
  // Appends the BPE ids of one pre-tokenized piece.
  void EncodePiece(std::string_view piece, std::vector<int>* ids) const;
  // Splits `text` at the added tokens of `set` (leftmost-longest); calls `on_text` for the
  // text between them and `on_token` for each token.
  template <typename OnText, typename OnToken>
  void SplitAdded(std::string_view text, const AddedSet& set, bool parse_special,
                  OnText on_text, OnToken on_token) const;

  std::vector<std::string> pieces_;            // id -> vocabulary spelling
  ByteBpe bpe_;                                 // the model, over bytes
  // Ids of pieces already merged. Filled until kPieceCacheSize entries; a caller that finds the
  // lock taken merges without it (never waits).
  static constexpr size_t kPieceCacheSize = 50000;
  mutable std::mutex cache_mu_;
  mutable std::deque<std::string> cache_keys_;  // GUARDED_BY(cache_mu_)
  mutable std::unordered_map<std::string_view, std::vector<int>> cache_;  // GUARDED_BY(cache_mu_)
  bool ignore_merges_ = false;
  int unk_id_ = -1;                            // for bytes without a token; -1: dropped
  bool nfc_ = false;
  std::vector<PreTokenizerStep> pre_tokenizer_;
  std::vector<AddedToken> added_;
  AddedSet raw_added_, normalized_added_;  // matched before / after the normalizer
  std::vector<bool> special_;                      // id -> is a special added token
  bool parse_special_by_default_ = true;
  std::vector<int> prefix_ids_, suffix_ids_;
};

// Whether the Hugging Face tokenizer of DIR (tokenizer.json, tokenizer_config.json) puts a BOS
// before the text, for ModelConfig::add_bos_token: tokenizer_config.json's add_bos_token when
// set, else whether the post-processor template starts with a special token. NotFound when DIR
// has no tokenizer.json.
Status HfTokenizerAddsBos(const std::string& dir, bool* adds_bos);

}  // namespace specloop
