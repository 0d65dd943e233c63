// DomainReserve: the trainer's own copy of the newest records of every domain it has seen, so
// that a domain keeps a floor in replay and in the held-out set after the buffer's retention
// (which drops the oldest records first, whatever their domain) has removed it, as happens to a
// domain that has gone idle while newer traffic fills the buffer.
//
// Records are held encoded (buffer/record_codec.h), `per_domain` of each domain at most: the
// newest by time_us. Memory is bounded by per_domain x domains x an encoded record's size
// (~15-40 KB at K = 64). The reserve lives in memory: a restarted trainer starts it afresh from
// what the buffer still holds. Torch-free.
//
// Thread safety: none (the trainer's loop owns it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "buffer/record.h"
#include "common/base/rng.h"
#include "common/base/status.h"

namespace specloop {
namespace trainer {

class DomainReserve {
 public:
  // per_domain = 0 holds nothing (Add() is a no-op).
  explicit DomainReserve(size_t per_domain) : per_domain_(per_domain) {}

  // Keeps `record` under `key` (unique within the reserve) when it is among the newest
  // per_domain of its domain, dropping that domain's oldest beyond the bound. A key already
  // held is left as it is. Error only when the record cannot be encoded.
  Status Add(const std::string& key, const Record& record);
  // Add() of a record as stored (buffer/record_codec.h), kept as these bytes without
  // re-encoding. REQUIRES: `encoded` decodes to a record of `domain` written at `time_us`.
  void AddEncoded(const std::string& key, const std::string& domain, uint64_t time_us,
                  std::string_view encoded);
  bool Contains(const std::string& key) const { return where_.count(key) > 0; }
  // The record held under `key`; NotFound when none is.
  Status Get(const std::string& key, Record* record) const;
  // A record of `domain`, drawn uniformly with `rng`; NotFound when none is held.
  Status Sample(const std::string& domain, Rng* rng, Record* record) const;
  // Every domain with a record held, in name order.
  std::vector<std::string> Domains() const;
  size_t size(const std::string& domain) const;
  size_t bytes() const { return bytes_; }  // encoded bytes held

 private:
  struct Entry {
    uint64_t time_us;
    std::string key, encoded;
  };
  // Whether a record of `domain` at `time_us` under a new `key` would be kept.
  bool Wants(const std::string& key, const std::string& domain, uint64_t time_us) const;
  void Insert(const std::string& key, const std::string& domain, uint64_t time_us,
              std::string encoded);

  const size_t per_domain_;
  std::map<std::string, std::vector<Entry>> domains_;  // each sorted by time_us, oldest first
  std::map<std::string, std::string> where_;           // key -> domain
  size_t bytes_ = 0;
};

}  // namespace trainer
}  // namespace specloop
