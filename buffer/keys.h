// Key layout of a buffer directory (one RocksDB database, two column families):
//
//   "default"    record key -> encoded record (buffer/record_codec.h)
//   "by_domain"  domain + '\0' + record key -> "" (index: one domain in time order)
//   "meta"       "next_seq" -> big-endian fixed64: one past the largest seq written
//
// record key = big-endian fixed64 time_us | big-endian fixed32 worker_id | big-endian fixed64 seq
// (20 bytes), so byte order is time order and a time range is a key range. `seq` is the
// writer's per-buffer sequence number: it makes keys unique and names a record's durability.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace specloop {

constexpr size_t kRecordKeySize = 20;
constexpr const char* kIndexColumnFamily = "by_domain";
constexpr const char* kMetaColumnFamily = "meta";
constexpr const char* kNextSeqKey = "next_seq";

std::string RecordKey(uint64_t time_us, uint32_t worker_id, uint64_t seq);
// The 8-byte prefix of every record key at `time_us`: record keys >= TimeKey(t) have time >= t.
std::string TimeKey(uint64_t time_us);
// False when `key` is not kRecordKeySize bytes.
bool ParseRecordKey(std::string_view key, uint64_t* time_us, uint32_t* worker_id, uint64_t* seq);

// domain + '\0': the prefix of a domain's index keys.
std::string DomainPrefix(std::string_view domain);
std::string DomainIndexKey(std::string_view domain, std::string_view record_key);
// Splits an index key into domain and record key; false when malformed.
bool ParseDomainIndexKey(std::string_view key, std::string_view* domain,
                         std::string_view* record_key);

}  // namespace specloop
