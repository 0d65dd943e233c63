#include "common/tokenizer/bpe_tokenizer.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <queue>

#include "common/tokenizer/model_config.h"

namespace specloop {

namespace {

const char kSpaceMarker[] = "\xE2\x96\x81";  // U+2581, sentencepiece's visible space

// A minimal protobuf wire-format reader: enough for sentencepiece's ModelProto.
class ProtoReader {
 public:
  ProtoReader(const char* p, size_t n) : p_(p), end_(p + n) {}
  bool done() const { return p_ >= end_; }
  bool ok() const { return ok_; }

  // Reads the next field's number and wire type; false at the end or on malformed input.
  bool Next(uint32_t* field, uint32_t* wire) {
    if (done() || !ok_) return false;
    uint64_t key = Varint();
    *field = static_cast<uint32_t>(key >> 3);
    *wire = static_cast<uint32_t>(key & 7);
    return ok_;
  }
  uint64_t Varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p_ >= end_) break;
      const uint8_t b = static_cast<uint8_t>(*p_++);
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    ok_ = false;
    return 0;
  }
  std::string_view Bytes() {
    const uint64_t n = Varint();
    if (!ok_ || n > static_cast<uint64_t>(end_ - p_)) {
      ok_ = false;
      return {};
    }
    std::string_view s(p_, n);
    p_ += n;
    return s;
  }
  float Fixed32Float() {
    if (end_ - p_ < 4) {
      ok_ = false;
      return 0;
    }
    float f;
    std::memcpy(&f, p_, 4);
    p_ += 4;
    return f;
  }
  void Skip(uint32_t wire) {
    switch (wire) {
      case 0: Varint(); break;
      case 1: p_ += 8; break;
      case 2: Bytes(); break;
      case 5: p_ += 4; break;
      default: ok_ = false;
    }
    if (p_ > end_) ok_ = false;
  }

 private:
  const char* p_;
  const char* end_;
  bool ok_ = true;
};

bool ReadLlama2cPiece(std::ifstream& in, float* score, std::string* piece) {
  int32_t len = 0;
  if (!in.read(reinterpret_cast<char*>(score), 4)) return false;
  if (!in.read(reinterpret_cast<char*>(&len), 4) || len < 0 || len > (1 << 16)) return false;
  piece->resize(len);
  return static_cast<bool>(in.read(piece->data(), len));
}

// "<0xAB>" -> 0xAB; -1 for anything else.
int ParseBytePiece(const std::string& p) {
  unsigned int b = 0;
  if (p.size() == 6 && std::sscanf(p.c_str(), "<0x%02X>", &b) == 1) return static_cast<int>(b);
  return -1;
}

// Length of the valid UTF-8 sequence at s[i], or 0 when invalid (sentencepiece's DecodeUTF8:
// no overlong forms, no surrogates, nothing above U+10FFFF).
size_t ValidUtf8Length(const std::string& s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const size_t left = s.size() - i;
  const auto cont = [&](size_t k) { return k < left && (b(k) & 0xC0) == 0x80; };
  if (b(0) < 0x80) return 1;
  uint32_t cp;
  if ((b(0) & 0xE0) == 0xC0 && cont(1)) {
    cp = ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    return cp >= 0x80 ? 2 : 0;
  }
  if ((b(0) & 0xF0) == 0xE0 && cont(1) && cont(2)) {
    cp = ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    return cp >= 0x800 && (cp < 0xD800 || cp >= 0xE000) ? 3 : 0;
  }
  if ((b(0) & 0xF8) == 0xF0 && cont(1) && cont(2) && cont(3)) {
    cp = ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
    return cp >= 0x10000 && cp <= 0x10FFFF ? 4 : 0;
  }
  return 0;
}

}  // namespace

Status CountLlama2cPieces(const std::string& path, int* count) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("cannot open " + path);
  int32_t max_len = 0;
  if (!in.read(reinterpret_cast<char*>(&max_len), 4)) return Status::Corruption(path + ": empty");
  float score;
  std::string piece;
  int n = 0;
  while (ReadLlama2cPiece(in, &score, &piece)) ++n;
  if (!in.eof() || in.gcount() != 0) {
    return Status::Corruption(path + ": malformed piece " + std::to_string(n));
  }
  *count = n;
  return Status::OK();
}

Status BpeTokenizer::OpenLlama2c(const std::string& path, int vocab_size,
                                 std::unique_ptr<Tokenizer>* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("cannot open " + path);
  std::unique_ptr<BpeTokenizer> t(new BpeTokenizer());
  int32_t max_token_length = 0;
  if (!in.read(reinterpret_cast<char*>(&max_token_length), 4)) {
    return Status::Corruption(path + ": no header");
  }
  t->pieces_.resize(vocab_size);
  t->scores_.resize(vocab_size);
  t->surfaces_.resize(vocab_size);
  for (int id = 0; id < vocab_size; ++id) {
    if (!ReadLlama2cPiece(in, &t->scores_[id], &t->pieces_[id])) {
      return Status::Corruption(path + ": truncated at piece " + std::to_string(id) + " of " +
                                std::to_string(vocab_size));
    }
  }
  // run.c merges into any piece of the vocabulary and falls back to ids 3 + byte.
  t->mergeable_.assign(vocab_size, true);
  t->byte_ids_.resize(256);
  for (int b = 0; b < 256; ++b) t->byte_ids_[b] = 3 + b < vocab_size ? 3 + b : -1;
  for (int id = 0; id < vocab_size; ++id) {
    const int byte = ParseBytePiece(t->pieces_[id]);
    if (id < 3) continue;  // <unk>, <s>, </s> print nothing
    t->surfaces_[id] = byte >= 0 ? std::string(1, static_cast<char>(byte)) : t->pieces_[id];
  }
  t->bos_id_ = 1;
  t->Finish();
  *out = std::move(t);
  return Status::OK();
}

Status BpeTokenizer::OpenSentencePiece(const std::string& path, std::unique_ptr<Tokenizer>* out) {
  std::string data;
  SPECLOOP_RETURN_IF_ERROR(ReadFileToString(path, &data));
  std::unique_ptr<BpeTokenizer> t(new BpeTokenizer());
  enum Type { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };
  std::vector<int> types;
  int model_type = 1;  // UNIGRAM is the proto default
  bool byte_fallback = false, escape_whitespaces = true;
  std::string normalizer = "identity";
  bool has_charsmap = false;
  t->remove_extra_whitespaces_ = true;
  t->replace_invalid_utf8_ = true;
  t->bos_id_ = 1;

  ProtoReader model(data.data(), data.size());
  uint32_t field, wire;
  while (model.Next(&field, &wire)) {
    if (field == 1 && wire == 2) {  // SentencePiece
      std::string_view msg = model.Bytes();
      ProtoReader pr(msg.data(), msg.size());
      std::string piece;
      float score = 0;
      int type = kNormal;
      while (pr.Next(&field, &wire)) {
        if (field == 1 && wire == 2) piece = std::string(pr.Bytes());
        else if (field == 2 && wire == 5) score = pr.Fixed32Float();
        else if (field == 3 && wire == 0) type = static_cast<int>(pr.Varint());
        else pr.Skip(wire);
      }
      if (!pr.ok()) return Status::Corruption(path + ": malformed piece " + std::to_string(types.size()));
      t->pieces_.push_back(std::move(piece));
      t->scores_.push_back(score);
      types.push_back(type);
    } else if (field == 2 && wire == 2) {  // TrainerSpec
      std::string_view msg = model.Bytes();
      ProtoReader tr(msg.data(), msg.size());
      while (tr.Next(&field, &wire)) {
        if (field == 3 && wire == 0) model_type = static_cast<int>(tr.Varint());
        else if (field == 35 && wire == 0) byte_fallback = tr.Varint() != 0;
        else if (field == 40 && wire == 0) t->unk_id_ = static_cast<int>(tr.Varint());
        else if (field == 41 && wire == 0) t->bos_id_ = static_cast<int>(tr.Varint());
        else tr.Skip(wire);
      }
      if (!tr.ok()) return Status::Corruption(path + ": malformed trainer_spec");
    } else if (field == 3 && wire == 2) {  // NormalizerSpec
      std::string_view msg = model.Bytes();
      ProtoReader nr(msg.data(), msg.size());
      while (nr.Next(&field, &wire)) {
        if (field == 1 && wire == 2) normalizer = std::string(nr.Bytes());
        else if (field == 2 && wire == 2) has_charsmap = !nr.Bytes().empty();
        else if (field == 3 && wire == 0) t->add_dummy_prefix_ = nr.Varint() != 0;
        else if (field == 4 && wire == 0) t->remove_extra_whitespaces_ = nr.Varint() != 0;
        else if (field == 5 && wire == 0) escape_whitespaces = nr.Varint() != 0;
        else nr.Skip(wire);
      }
      if (!nr.ok()) return Status::Corruption(path + ": malformed normalizer_spec");
    } else {
      model.Skip(wire);
    }
  }
  if (!model.ok()) return Status::Corruption(path + ": not a sentencepiece model");
  if (t->pieces_.empty()) return Status::Corruption(path + ": no pieces");
  if (model_type != 2) return Status::NotSupported(path + ": only BPE sentencepiece models");
  if (has_charsmap && normalizer != "identity") {
    return Status::NotSupported(path + ": normalization " + normalizer);
  }
  t->space_marker_ = escape_whitespaces ? kSpaceMarker : " ";

  const int n = static_cast<int>(t->pieces_.size());
  t->mergeable_.resize(n);
  t->surfaces_.resize(n);
  t->byte_ids_.assign(256, -1);
  for (int id = 0; id < n; ++id) {
    const std::string& p = t->pieces_[id];
    t->mergeable_[id] = types[id] == kNormal || types[id] == kUserDefined;
    if (types[id] == kByte) {
      const int b = ParseBytePiece(p);
      if (b < 0) return Status::Corruption(path + ": byte piece " + p);
      if (byte_fallback) t->byte_ids_[b] = id;
      t->surfaces_[id] = std::string(1, static_cast<char>(b));
    } else if (types[id] == kUnknown) {
      t->surfaces_[id] = " \xE2\x81\x87 ";  // sentencepiece renders <unk> as " ⁇ "
    } else if (types[id] != kControl) {
      std::string s;
      for (size_t i = 0; i < p.size(); ++i) {
        if (p.compare(i, 3, kSpaceMarker) == 0) {
          s += ' ';
          i += 2;
        } else {
          s += p[i];
        }
      }
      t->surfaces_[id] = std::move(s);
    }
  }
  t->Finish();
  *out = std::move(t);
  return Status::OK();
}

void BpeTokenizer::Finish() {
  for (size_t id = 0; id < pieces_.size(); ++id) {
    if (mergeable_[id]) index_.emplace(pieces_[id], static_cast<int>(id));
  }
}

int BpeTokenizer::Lookup(std::string_view s) const {
  auto it = index_.find(s);
  return it == index_.end() ? -1 : it->second;
}

std::vector<int> BpeTokenizer::Encode(const std::string& text) const {
  // Normalize: optional whitespace cleanup, dummy prefix, space marker.
  std::string valid;
  if (replace_invalid_utf8_) {
    for (size_t i = 0; i < text.size();) {
      const size_t n = ValidUtf8Length(text, i);
      valid.append(n ? text.substr(i, n) : "\xEF\xBF\xBD");
      i += n ? n : 1;
    }
  }
  const std::string& input = replace_invalid_utf8_ ? valid : text;
  std::string spaced;
  if (remove_extra_whitespaces_) {
    for (char ch : input) {
      if (ch == ' ' && (spaced.empty() || spaced.back() == ' ')) continue;
      spaced += ch;
    }
    while (!spaced.empty() && spaced.back() == ' ') spaced.pop_back();
  } else {
    spaced = input;
  }
  if (spaced.empty()) return {};
  if (add_dummy_prefix_) spaced.insert(spaced.begin(), ' ');
  std::string norm;
  for (char ch : spaced) {
    if (ch == ' ') norm += space_marker_;
    else norm += ch;
  }

  // Symbols: UTF-8 code points (a lead byte and at most 3 continuation bytes), linked in order.
  struct Symbol {
    int prev, next;
    size_t begin, len;  // bytes of norm; len 0 once merged away
  };
  std::vector<Symbol> sym;
  for (size_t i = 0; i < norm.size();) {
    size_t j = i + 1;
    while (j < norm.size() && (static_cast<unsigned char>(norm[j]) & 0xC0) == 0x80 && j - i < 4) ++j;
    const int k = static_cast<int>(sym.size());
    sym.push_back({k - 1, k + 1, i, j - i});
    i = j;
  }
  sym.back().next = -1;

  // Agenda of candidate merges: highest score first, leftmost on ties.
  struct Pair {
    float score;
    int left, right;
    size_t len;  // joined length when queued; a mismatch later means the entry is stale
    bool operator<(const Pair& o) const {
      return score < o.score || (score == o.score && left > o.left);
    }
  };
  std::priority_queue<Pair> agenda;
  const std::string_view all(norm);
  auto maybe_push = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const size_t len = sym[left].len + sym[right].len;
    const int id = Lookup(all.substr(sym[left].begin, len));
    if (id >= 0) agenda.push({scores_[id], left, right, len});
  };
  for (int i = 0; i + 1 < static_cast<int>(sym.size()); ++i) maybe_push(i, i + 1);
  while (!agenda.empty()) {
    const Pair top = agenda.top();
    agenda.pop();
    Symbol& l = sym[top.left];
    Symbol& r = sym[top.right];
    if (l.len == 0 || r.len == 0 || l.next != top.right || l.len + r.len != top.len) continue;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = top.left;
    maybe_push(l.prev, top.left);
    maybe_push(top.left, l.next);
  }

  std::vector<int> ids;
  for (int i = 0; i >= 0; i = sym[i].next) {
    const std::string_view s = all.substr(sym[i].begin, sym[i].len);
    if (int id = Lookup(s); id >= 0) {
      ids.push_back(id);
    } else if (byte_ids_[static_cast<unsigned char>(s[0])] >= 0) {
      for (unsigned char b : s) ids.push_back(byte_ids_[b]);
    } else {
      ids.push_back(unk_id_);
    }
  }
  return ids;
}

}  // namespace specloop
