#include "common/tokenizer/tokenizer.h"

#include <sys/stat.h>

#include "common/tokenizer/bpe_tokenizer.h"
#include "common/tokenizer/hf_tokenizer.h"
#include "common/tokenizer/model_config.h"

namespace specloop {

namespace {

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

}  // namespace

Status Tokenizer::Load(const std::string& dir, std::unique_ptr<Tokenizer>* out) {
  if (Exists(dir + "/tokenizer.json")) {
    // A tokenizer.json that is not supported (Unigram, ...) gives way to a tokenizer.model.
    std::unique_ptr<HfTokenizer> hf;
    Status s = HfTokenizer::Open(dir, &hf);
    if (s.ok()) *out = std::move(hf);
    if (s.code() != Status::Code::kNotSupported || !Exists(dir + "/tokenizer.model")) return s;
  }
  if (Exists(dir + "/tokenizer.model")) {
    return BpeTokenizer::OpenSentencePiece(dir + "/tokenizer.model", out);
  }
  if (Exists(dir + "/tokenizer.bin")) {
    ModelConfig config;
    SPECLOOP_RETURN_IF_ERROR(ModelConfig::FromDir(dir, &config));
    return BpeTokenizer::OpenLlama2c(dir + "/tokenizer.bin", config.vocab_size, out);
  }
  return Status::NotFound(dir + ": no tokenizer.json, tokenizer.model or tokenizer.bin");
}

std::string Tokenizer::Decode(const std::vector<int>& ids, int prev) const {
  std::string text;
  for (int id : ids) {
    if (id >= 0 && id < vocab_size()) {
      const std::string& s = surfaces_[id];
      const bool at_start = drop_leading_space_ && (prev < 0 || prev == bos_id_);
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

namespace {

// Length of the valid UTF-8 sequence at text[i], 0 when invalid; `*incomplete` when the bytes
// run out before the sequence could be judged (a valid start of one). WHATWG's rules: no
// overlong forms, no surrogates, nothing above U+10FFFF.
size_t Utf8SequenceAt(std::string_view text, size_t i, bool* incomplete) {
  *incomplete = false;
  const unsigned char c = text[i];
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= text.size()) {
      *incomplete = true;
      return 0;
    }
    const unsigned char b = text[i + k];
    if (b < lo || b > hi) return 0;  // the maximal subpart ends before b
    lo = 0x80;
    hi = 0xBF;
  }
  return need + 1;
}

// Length of the maximal subpart at text[i] that an invalid sequence replaces: the lead byte and
// the continuation bytes that were still acceptable.
size_t InvalidSubpartAt(std::string_view text, size_t i) {
  size_t n = 1;
  while (i + n < text.size()) {
    bool incomplete;
    // A longer prefix is acceptable when the sequence truncated there would be incomplete.
    if (Utf8SequenceAt(text.substr(0, i + n + 1), i, &incomplete) == 0 && incomplete) {
      ++n;
    } else {
      break;
    }
  }
  return n;
}

constexpr char kReplacement[] = "\xEF\xBF\xBD";

}  // namespace

std::string ToValidUtf8(std::string_view text) {
  std::string out(text);
  RepairUtf8(&out, true);
  return out;
}

size_t RepairUtf8(std::string* text, bool final) {
  const std::string_view in(*text);
  std::string out;
  bool changed = false;
  size_t i = 0, copied = 0;  // in[copied, i) is valid and not yet copied into out
  size_t complete = in.size();
  while (i < in.size()) {
    if (static_cast<unsigned char>(in[i]) < 0x80) {
      ++i;
      continue;
    }
    bool incomplete;
    const size_t len = Utf8SequenceAt(in, i, &incomplete);
    if (len > 0) {
      i += len;
      continue;
    }
    if (incomplete && !final) {  // the next bytes may complete it: hold back
      complete = i;
      break;
    }
    if (!changed) out.reserve(in.size() + 8);
    changed = true;
    out.append(in, copied, i - copied);
    out += kReplacement;
    i += incomplete ? in.size() - i : InvalidSubpartAt(in, i);
    copied = i;
  }
  if (!changed) return complete;
  const size_t prefix = out.size() + complete - copied;
  out.append(in, copied, std::string::npos);
  *text = std::move(out);
  return prefix;
}

}  // namespace specloop
