// Tokenizers (common/tokenizer/tokenizer.h) on arbitrary input: the sentencepiece BPE of target-6m
// and the llama2.c tokenizer of stories260K, from ../shared. The first byte picks the tokenizer;
// the rest is read twice: as text to encode (every id below vocab_size) and as little-endian int32
// ids to decode, any value included (out-of-range ids decode to ""). Decoding id by id (as
// streaming does) must give the same text as decoding all at once, and CompleteUtf8Prefix must cut
// inside the text.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/tokenizer/bpe_tokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

using namespace specloop;

namespace {

const Tokenizer& Pick(uint8_t selector) {
  static const std::unique_ptr<Tokenizer> sentencepiece = [] {
    std::unique_ptr<Tokenizer> t;
    FUZZ_CHECK(Tokenizer::Load(fuzz::SharedDir() + "/models/target-6m", &t).ok());
    return t;
  }();
  static const std::unique_ptr<Tokenizer> llama2c = [] {
    std::unique_ptr<Tokenizer> t;
    FUZZ_CHECK(BpeTokenizer::OpenLlama2c(fuzz::SharedDir() + "/models/stories260K/tok512.bin",
                                         512, &t).ok());
    return t;
  }();
  return selector & 1 ? *llama2c : *sentencepiece;
}

void CheckDecode(const Tokenizer& tok, const std::vector<int>& ids, int prev) {
  const std::string text = tok.Decode(ids, prev);
  std::string streamed;
  int last = prev;
  for (int id : ids) {
    streamed += tok.Decode({id}, last);
    last = id;
  }
  FUZZ_CHECK(streamed == text);
  FUZZ_CHECK(CompleteUtf8Prefix(text) <= text.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Tokenizer& tok = Pick(data[0]);
  ++data, --size;

  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::vector<int> encoded = tok.Encode(text);
  for (int id : encoded) FUZZ_CHECK(id >= 0 && id < tok.vocab_size());
  CheckDecode(tok, encoded, -1);

  std::vector<int> ids(size / 4);
  if (!ids.empty()) std::memcpy(ids.data(), data, ids.size() * 4);
  CheckDecode(tok, ids, ids.empty() ? -1 : ids[0]);
  return 0;
}
