// BpeTokenizer: score-ranked BPE, the encoding of sentencepiece BPE models and of llama2.c:
// text (optionally whitespace-normalized, with a dummy-prefix space and spaces replaced by a
// marker) is split into UTF-8 code points, then the adjacent pair whose joined piece has the
// highest score is merged, leftmost first on ties, until no joined pair is a piece. Symbols
// left that are not pieces fall back to byte pieces.
//
// Two file formats load into it:
// - sentencepiece `tokenizer.model` (a ModelProto, parsed here: libsentencepiece bundles a
//   protobuf that clashes with LibTorch's, so it is used only in tests, to cross-check);
//   BPE models with identity normalization only.
// - llama2.c `tokenizer.bin`: int32 max_token_length, then per piece float32 score, int32
//   length, bytes. Raw spaces, byte pieces at ids 3 + byte.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/tokenizer/tokenizer.h"

namespace specloop {

class BpeTokenizer : public Tokenizer {
 public:
  // Corruption for a malformed file, NotSupported for sentencepiece features not implemented
  // (unigram models, non-identity normalization).
  static Status OpenSentencePiece(const std::string& path, std::unique_ptr<Tokenizer>* out);
  // `vocab_size` pieces are read (the format does not record the count).
  static Status OpenLlama2c(const std::string& path, int vocab_size,
                            std::unique_ptr<Tokenizer>* out);

  std::vector<int> Encode(const std::string& text) const override;

 private:
  BpeTokenizer() = default;
  int Lookup(std::string_view s) const;
  // Fills index_ and surfaces_ from pieces_ and the per-id flags.
  void Finish();

  std::vector<std::string> pieces_;  // as stored (sentencepiece: with the space marker)
  std::vector<float> scores_;
  std::vector<bool> mergeable_;      // may be produced by a merge or match a code point
  std::vector<int> byte_ids_;        // byte value -> id; -1 when absent
  std::unordered_map<std::string_view, int> index_;  // mergeable piece -> id (first wins)
  std::string space_marker_ = " ";   // what a space becomes before matching
  bool add_dummy_prefix_ = true;
  bool remove_extra_whitespaces_ = false;
  bool replace_invalid_utf8_ = false;  // sentencepiece: each invalid byte becomes U+FFFD
  int unk_id_ = 0;
};

// Number of pieces in a llama2.c tokenizer file: reads to the end.
Status CountLlama2cPieces(const std::string& path, int* count);

}  // namespace specloop
