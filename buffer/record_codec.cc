#include "buffer/record_codec.h"

#include <cstring>
#include <limits>

#include "buffer/crc32c.h"

namespace specloop {

namespace {

// ---- writing ----

inline void PutVarint64(std::string* out, uint64_t v) {
  char buf[10];
  int n = 0;
  while (v >= 0x80) {
    buf[n++] = static_cast<char>(v | 0x80);
    v >>= 7;
  }
  buf[n++] = static_cast<char>(v);
  out->append(buf, n);
}

inline char* EncodeVarint32(char* p, uint32_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<char>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<char>(v);
  return p;
}

inline void PutFixed32(std::string* out, uint32_t v) {
  char b[4] = {static_cast<char>(v), static_cast<char>(v >> 8), static_cast<char>(v >> 16),
               static_cast<char>(v >> 24)};
  out->append(b, 4);
}

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline void PutString(std::string* out, const std::string& s) {
  PutVarint64(out, s.size());
  out->append(s);
}

// Appends n int32 values as varint32 through one resize.
void PutTokenArray(std::string* out, const int32_t* v, size_t n) {
  const size_t old = out->size();
  out->resize(old + n * 5);
  char* start = &(*out)[old];
  char* p = start;
  for (size_t i = 0; i < n; i++) p = EncodeVarint32(p, static_cast<uint32_t>(v[i]));
  out->resize(old + (p - start));
}

void PutHalfArray(std::string* out, const uint16_t* v, size_t n) {
  const size_t old = out->size();
  out->resize(old + n * 2);
  char* p = &(*out)[old];
  for (size_t i = 0; i < n; i++) {
    p[2 * i] = static_cast<char>(v[i]);
    p[2 * i + 1] = static_cast<char>(v[i] >> 8);
  }
}

// ---- reading: every accessor checks the remaining length first ----

class Reader {
 public:
  explicit Reader(std::string_view d) : p_(d.data()), end_(d.data() + d.size()) {}
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }

  bool Varint64(uint64_t* v) {
    uint64_t result = 0;
    for (int shift = 0; shift <= 63 && p_ < end_; shift += 7) {
      const uint64_t byte = static_cast<unsigned char>(*p_++);
      if (shift == 63 && byte > 1) return false;  // overflows 64 bits
      result |= (byte & 0x7f) << shift;
      if (!(byte & 0x80)) {
        *v = result;
        return true;
      }
    }
    return false;
  }
  bool Varint32(uint32_t* v) {
    uint32_t result = 0;
    for (int shift = 0; shift <= 28 && p_ < end_; shift += 7) {
      const uint32_t byte = static_cast<unsigned char>(*p_++);
      if (shift == 28 && byte > 0x0f) return false;  // overflows 32 bits
      result |= (byte & 0x7f) << shift;
      if (!(byte & 0x80)) {
        *v = result;
        return true;
      }
    }
    return false;
  }
  bool Fixed32(uint32_t* v) {
    if (remaining() < 4) return false;
    const unsigned char* u = reinterpret_cast<const unsigned char*>(p_);
    *v = u[0] | (u[1] << 8) | (u[2] << 16) | (static_cast<uint32_t>(u[3]) << 24);
    p_ += 4;
    return true;
  }
  bool Float(float* f) {
    uint32_t u;
    if (!Fixed32(&u)) return false;
    std::memcpy(f, &u, 4);
    return true;
  }
  bool String(std::string* s, size_t max_len) {
    uint32_t n;
    if (!Varint32(&n) || n > max_len || n > remaining()) return false;
    s->assign(p_, n);
    p_ += n;
    return true;
  }
  // Reads a count and checks that `n * min_bytes_each` more bytes can still follow, so a
  // corrupt count never triggers a huge allocation.
  bool Count(uint32_t* n, size_t min_bytes_each) {
    if (!Varint32(n)) return false;
    return static_cast<uint64_t>(*n) * min_bytes_each <= remaining();
  }
  bool TokenArray(std::vector<int32_t>* v, size_t n) {
    if (n > remaining()) return false;  // each varint is >= 1 byte
    v->resize(n);
    for (size_t i = 0; i < n; i++) {
      uint32_t t;
      if (!Varint32(&t)) return false;
      (*v)[i] = static_cast<int32_t>(t);
    }
    return true;
  }
  bool HalfArray(std::vector<uint16_t>* v, size_t n) {
    if (n > remaining() / 2) return false;
    v->resize(n);
    const unsigned char* u = reinterpret_cast<const unsigned char*>(p_);
    for (size_t i = 0; i < n; i++) (*v)[i] = static_cast<uint16_t>(u[2 * i] | (u[2 * i + 1] << 8));
    p_ += 2 * n;
    return true;
  }

 private:
  const char* p_;
  const char* end_;
};

Status Corrupt(const char* what) { return Status::Corruption(std::string("replay record: ") + what); }

}  // namespace

Status EncodeRecord(const Record& r, std::string* out) {
  if (std::string err = ValidateRecord(r); !err.empty()) {
    return Status::InvalidArgument("replay record: " + err);
  }
  const size_t start = out->size();
  out->push_back(static_cast<char>(kRecordMagic));
  out->push_back(static_cast<char>(kRecordFormatVersion));
  PutFixed32(out, 0);  // checksum, filled in below
  PutVarint64(out, r.time_us);
  PutString(out, r.domain);
  PutString(out, r.request_id);
  PutVarint64(out, r.worker_id);
  PutVarint64(out, r.draft_version);
  PutString(out, r.target_id);
  PutFixed32(out, FloatBits(r.sampling.temperature));
  PutVarint64(out, static_cast<uint32_t>(r.sampling.top_k));
  PutFixed32(out, FloatBits(r.sampling.top_p));
  PutVarint64(out, r.sampling.seed);
  PutVarint64(out, r.prompt_len);
  PutVarint64(out, r.tokens.size());
  PutTokenArray(out, r.tokens.data(), r.tokens.size());
  PutVarint64(out, r.top_k);
  PutVarint64(out, r.steps.size());
  for (const SpecStep& s : r.steps) {
    PutVarint64(out, s.start_pos);
    PutVarint64(out, s.draft_tokens.size());
    PutTokenArray(out, s.draft_tokens.data(), s.draft_tokens.size());
    PutVarint64(out, s.num_accepted);
    PutTokenArray(out, s.topk_ids.data(), s.topk_ids.size());
    PutHalfArray(out, s.topk_logprobs.data(), s.topk_logprobs.size());
    for (float t : s.tail_mass) PutFixed32(out, FloatBits(t));
  }
  const uint32_t crc = crc32c::Value(out->data() + start + kRecordHeaderSize,
                                     out->size() - start - kRecordHeaderSize);
  for (int i = 0; i < 4; i++) (*out)[start + 2 + i] = static_cast<char>(crc >> (8 * i));
  return Status::OK();
}

Status CheckRecordChecksum(std::string_view data) {
  if (data.size() < kRecordHeaderSize) return Corrupt("truncated header");
  if (static_cast<uint8_t>(data[0]) != kRecordMagic) return Corrupt("bad magic byte");
  if (static_cast<uint8_t>(data[1]) != kRecordFormatVersion) {
    return Status::NotSupported("replay record: format version " +
                                std::to_string(static_cast<uint8_t>(data[1])));
  }
  const unsigned char* u = reinterpret_cast<const unsigned char*>(data.data());
  const uint32_t stored = u[2] | (u[3] << 8) | (u[4] << 16) | (static_cast<uint32_t>(u[5]) << 24);
  const uint32_t actual =
      crc32c::Value(data.data() + kRecordHeaderSize, data.size() - kRecordHeaderSize);
  if (stored != actual) return Corrupt("checksum mismatch");
  return Status::OK();
}

Status DecodeRecord(std::string_view data, Record* r) {
  SPECLOOP_RETURN_IF_ERROR(CheckRecordChecksum(data));
  Reader in(data.substr(kRecordHeaderSize));
  uint32_t top_k_sampling = 0, n_tokens = 0, n_steps = 0;
  uint64_t worker = 0;
  if (!in.Varint64(&r->time_us) || !in.String(&r->domain, 255) ||
      !in.String(&r->request_id, data.size()) || !in.Varint64(&worker) ||
      worker > std::numeric_limits<uint32_t>::max() || !in.Varint64(&r->draft_version) ||
      !in.String(&r->target_id, data.size()) || !in.Float(&r->sampling.temperature) ||
      !in.Varint32(&top_k_sampling) || !in.Float(&r->sampling.top_p) ||
      !in.Varint64(&r->sampling.seed) || !in.Varint32(&r->prompt_len) ||
      !in.Count(&n_tokens, 1) || !in.TokenArray(&r->tokens, n_tokens)) {
    return Corrupt("truncated or malformed header fields");
  }
  r->worker_id = static_cast<uint32_t>(worker);
  r->sampling.top_k = static_cast<int>(top_k_sampling);
  if (r->domain.find('\0') != std::string::npos) return Corrupt("domain holds a NUL byte");
  if (r->prompt_len > n_tokens) return Corrupt("prompt_len exceeds the token count");
  // A step takes at least 4 bytes (start, k, accepted, one id) plus K*3 for position 0.
  if (!in.Varint32(&r->top_k) || !in.Count(&n_steps, 4)) return Corrupt("truncated step count");
  if (n_steps > 0 && r->top_k > in.remaining()) return Corrupt("top_k exceeds the record");
  r->steps.resize(n_steps);
  for (uint32_t i = 0; i < n_steps; i++) {
    SpecStep& s = r->steps[i];
    uint32_t k = 0;
    if (!in.Varint32(&s.start_pos) || !in.Count(&k, 1) || !in.TokenArray(&s.draft_tokens, k) ||
        !in.Varint32(&s.num_accepted)) {
      return Corrupt("truncated step");
    }
    if (s.num_accepted > k) return Corrupt("num_accepted exceeds k");
    const uint64_t n = (static_cast<uint64_t>(k) + 1) * r->top_k;
    // Each top-K entry needs >= 3 bytes (varint id + fp16), each tail 4.
    if (n * 3 + (static_cast<uint64_t>(k) + 1) * 4 > in.remaining()) {
      return Corrupt("step larger than the record");
    }
    if (!in.TokenArray(&s.topk_ids, n) || !in.HalfArray(&s.topk_logprobs, n)) {
      return Corrupt("truncated top-K arrays");
    }
    s.tail_mass.resize(k + 1);
    for (uint32_t j = 0; j <= k; j++) {
      if (!in.Float(&s.tail_mass[j])) return Corrupt("truncated tail mass");
    }
  }
  if (in.remaining() != 0) return Corrupt("trailing bytes");
  return Status::OK();
}

}  // namespace specloop
