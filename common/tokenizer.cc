#include "common/tokenizer.h"

#include <sys/stat.h>

#include "common/bpe_tokenizer.h"
#include "common/model_config.h"

namespace specloop {

namespace {

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

}  // namespace

Status Tokenizer::Load(const std::string& dir, std::unique_ptr<Tokenizer>* out) {
  if (Exists(dir + "/tokenizer.model")) {
    return BpeTokenizer::OpenSentencePiece(dir + "/tokenizer.model", out);
  }
  if (Exists(dir + "/tokenizer.bin")) {
    ModelConfig config;
    SPECLOOP_RETURN_IF_ERROR(ModelConfig::FromDir(dir, &config));
    return BpeTokenizer::OpenLlama2c(dir + "/tokenizer.bin", config.vocab_size, out);
  }
  return Status::NotFound(dir + ": no tokenizer.model or tokenizer.bin");
}

std::string Tokenizer::Decode(const std::vector<int>& ids, int prev) const {
  std::string text;
  for (int id : ids) {
    if (id >= 0 && id < vocab_size()) {
      const std::string& s = surfaces_[id];
      const bool at_start = prev < 0 || prev == bos_id_;
      text.append(s, (at_start && !s.empty() && s[0] == ' ') ? 1 : 0);
    }
    prev = id;
  }
  return text;
}

size_t CompleteUtf8Prefix(const std::string& text) {
  // Look back at most 3 bytes for the lead byte of an unfinished sequence.
  const size_t n = text.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const unsigned char c = text[n - back];
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking
    size_t need = 1;
    if ((c & 0xE0) == 0xC0) need = 2;
    else if ((c & 0xF0) == 0xE0) need = 3;
    else if ((c & 0xF8) == 0xF0) need = 4;
    return need > back ? n - back : n;
  }
  return n;
}

}  // namespace specloop
