#include "buffer/keys.h"

namespace specloop {

namespace {
void PutBigEndian(std::string* out, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; i--) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t GetBigEndian(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}
}  // namespace

std::string RecordKey(uint64_t time_us, uint32_t worker_id, uint64_t seq) {
  std::string k;
  k.reserve(kRecordKeySize);
  PutBigEndian(&k, time_us, 8);
  PutBigEndian(&k, worker_id, 4);
  PutBigEndian(&k, seq, 8);
  return k;
}

std::string TimeKey(uint64_t time_us) {
  std::string k;
  PutBigEndian(&k, time_us, 8);
  return k;
}

bool ParseRecordKey(std::string_view key, uint64_t* time_us, uint32_t* worker_id, uint64_t* seq) {
  if (key.size() != kRecordKeySize) return false;
  if (time_us) *time_us = GetBigEndian(key.data(), 8);
  if (worker_id) *worker_id = static_cast<uint32_t>(GetBigEndian(key.data() + 8, 4));
  if (seq) *seq = GetBigEndian(key.data() + 12, 8);
  return true;
}

std::string DomainPrefix(std::string_view domain) {
  std::string k(domain);
  k.push_back('\0');
  return k;
}

std::string DomainIndexKey(std::string_view domain, std::string_view record_key) {
  std::string k = DomainPrefix(domain);
  k.append(record_key);
  return k;
}

bool ParseDomainIndexKey(std::string_view key, std::string_view* domain,
                         std::string_view* record_key) {
  if (key.size() < kRecordKeySize + 1) return false;
  const size_t nul = key.size() - kRecordKeySize - 1;
  if (key[nul] != '\0') return false;
  *domain = key.substr(0, nul);
  *record_key = key.substr(nul + 1);
  return true;
}

}  // namespace specloop
