// HfTokenizer: a Hugging Face `tokenizer.json` with a BPE model, encoded and decoded as
// tokenizers.js (@huggingface/tokenizers) does. Two kinds of file:
// - byte-level (a ByteLevel pre-tokenizer): Llama 3, Qwen2/3, Mistral-Nemo, SmolLM, GPT-2;
// - sentencepiece-style (no ByteLevel pre-tokenizer; usually byte_fallback): Llama 2,
//   TinyLlama, Mistral 7B, Gemma, and newer files with a Metaspace pre-tokenizer.
// Encoding a text:
//
// 1. Invalid UTF-8 becomes U+FFFD (ToValidUtf8: what the text would be as a JavaScript or
//    Python string).
// 2. Added tokens are cut out, leftmost-longest, as whole tokens; lstrip/rstrip trim the
//    JavaScript whitespace beside them; single_word is ignored, as tokenizers.js does. A
//    stretch of text that is exactly an added token's text is that token. Special ones only
//    when `parse_special` (the default, unless tokenizer_config.json sets
//    "split_special_tokens"); otherwise their text is ordinary text.
// 3. The normalizer (HfNormalizer: NFC, Prepend, Replace) runs on each stretch between added
//    tokens (so Llama 2's "▁" is prepended to each); "normalized" added tokens are then cut out
//    of the normalized text the same way.
// 4. The pre-tokenizers cut it into pieces, in order: Split (a regex, "Isolated"), Digits
//    (runs of, or single, \p{N} characters), ByteLevel (the GPT-2 regex when use_regex;
//    add_prefix_space on each piece), Metaspace (spaces become the replacement; it is
//    prepended to a piece not starting with it under prepend_scheme "always", or "first" in
//    the first stretch of the text, counting added tokens; `split` is ignored, as tokenizers.js
//    does).
// 5. Each piece is merged by BPE, the adjacent pair with the lowest merge rank first, leftmost
//    on ties: byte-level files over the piece's bytes (ByteBpe), sentencepiece-style ones over
//    its characters, with byte fallback, fuse_unk and the unknown token (SpBpe). With
//    "ignore_merges" a piece that is itself in the vocabulary is one token.
//
// Decoding joins each id's bytes (HfDecoder: the GPT-2 byte map reversed, or "▁" -> " " and
// "<0xNN>" -> that byte); a non-special added token decodes as its text does, a special token
// to "" (like skip_special_tokens). The Strip or Metaspace decoder of a sentencepiece-style file
// drops one leading space at the start of the text, which Tokenizer::Decode, decoding each id
// after its predecessor as streaming does, reads as "at the first id or after BOS". So Decode
// equals tokenizers.js's decode (skip_special_tokens) of the ids cut before each BOS, each part
// decoded alone, except that a part whose first id (after its BOS) is another special token
// keeps its first leading space: where tokenizers.js drops no space after a BOS inside the ids
// and drops one after a special token at the start, Decode does the opposite.
// Decode(Encode(x, false)) == Normalize(ToValidUtf8(x)) for every x without added-token text,
// unless byte tokens are left as text (a Metaspace decoder without ByteFallback, as
// tokenizers.js decodes it).
//
// Not implemented (Open returns NotSupported, naming it): other models (Unigram, WordPiece),
// byte_fallback with a ByteLevel pre-tokenizer, normalizers, pre-tokenizers and decoders other
// than the above, Split behaviours other than Isolated, tokenizer_config.json's remove_space
// and do_lowercase_and_remove_accent.
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

#include <nlohmann/json_fwd.hpp>

#include "common/tokenizer/byte_bpe.h"
#include "common/tokenizer/hf_decoder.h"
#include "common/tokenizer/hf_normalizer.h"
#include "common/tokenizer/regex_splitter.h"
#include "common/tokenizer/sp_bpe.h"
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

  // `text` as decoding its ids gives it back: the normalizer's output, and for a
  // sentencepiece-style file with the Metaspace replacement and the decoder's Replace and
  // leading-space Strip applied. Decode(Encode(x, false)) == Normalize(ToValidUtf8(x)) for x
  // without added-token text. REQUIRES: `text` is valid UTF-8.
  std::string Normalize(std::string_view text) const;

  bool parse_special_by_default() const { return parse_special_by_default_; }
  // The ids EncodeWithSpecialTokens puts before / after the text.
  const std::vector<int>& prefix_ids() const { return prefix_ids_; }
  const std::vector<int>& suffix_ids() const { return suffix_ids_; }
  // The token as the vocabulary spells it (byte-level characters, e.g. "Ġthe"; "▁the" and
  // "<0x0A>" in sentencepiece-style files); "" for ids outside the vocabulary.
  std::string Piece(int id) const;
  bool IsSpecial(int id) const;

 private:
  struct AddedToken {
    std::string content;
    std::string match;  // what the splitter looks for: content, or normalized content
    int id = -1;
    bool special = false, lstrip = false, rstrip = false, normalized = false;
  };
  struct PreTokenizerStep {
    std::unique_ptr<RegexSplitter> splitter;  // null: no split
    bool add_prefix_space = false;            // ByteLevel's
    bool metaspace = false;                   // Metaspace: the fields below
    std::string replacement, str_rep;         // str_rep replaces " " and is what is prepended
    enum class Prepend { kAlways, kFirst, kNever } prepend = Prepend::kAlways;
  };
  // Added tokens to cut out in one pass, by first byte of `match`, longest first.
  struct AddedSet {
    std::vector<int> by_first_byte[256];  // indices into added_
  };

  HfTokenizer() = default;
  Status Parse(const std::string& json_text, const std::string& config_text);
  Status ParsePreTokenizer(const nlohmann::json& pre);
  Status ParseModel(const nlohmann::json& model, const nlohmann::json& added_tokens);
  Status ParseAddedTokens(const nlohmann::json& added_tokens, const nlohmann::json& config);

  // Appends the ids of a section between added tokens (after normalization); `section_index`:
  // its place among the text's sections and added tokens (for Metaspace's "first").
  void EncodeSection(std::string_view text, int section_index, std::vector<int>* ids) const;
  // Appends the byte-level BPE ids of one pre-tokenized piece.
  void EncodePiece(std::string_view piece, std::vector<int>* ids) const;
  // The added token whose content or normalized content is exactly `s` (as tokenizers.js's
  // added_tokens_map), among those `parse_special` admits; nullptr if none.
  const AddedToken* FindAdded(std::string_view s, bool parse_special) const;
  // Splits `text` at the added tokens of `set` (leftmost-longest) as tokenizers.js does; calls
  // `on_text(text, section_index)` for the text between them and `on_token(id)` for each token.
  template <typename OnText, typename OnToken>
  void SplitAdded(std::string_view text, const AddedSet& set, bool parse_special,
                  OnText on_text, OnToken on_token) const;

  std::vector<std::string> pieces_;            // id -> vocabulary spelling
  bool byte_level_ = true;                     // else sentencepiece-style
  ByteBpe bpe_;                                // the byte-level model, over bytes
  SpBpe sp_bpe_;                               // the sentencepiece-style model
  // Ids of byte-level pieces already merged. Filled until kPieceCacheSize entries; a caller that
  // finds the lock taken merges without it (never waits).
  static constexpr size_t kPieceCacheSize = 50000;
  mutable std::mutex cache_mu_;
  mutable std::deque<std::string> cache_keys_;  // GUARDED_BY(cache_mu_)
  mutable std::unordered_map<std::string_view, std::vector<int>> cache_;  // GUARDED_BY(cache_mu_)
  bool ignore_merges_ = false;
  int unk_id_ = -1;                            // for bytes without a token; -1: dropped
  HfNormalizer normalizer_;
  HfDecoder decoder_;
  std::vector<PreTokenizerStep> pre_tokenizer_;
  std::vector<AddedToken> added_;              // in file order
  // content and normalized content -> index into added_ (later tokens override).
  std::unordered_map<std::string_view, int> added_by_text_;
  size_t longest_added_ = 0;                   // bytes of the longest key of added_by_text_
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
