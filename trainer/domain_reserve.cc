#include "trainer/domain_reserve.h"

#include <algorithm>

#include "buffer/record_codec.h"

namespace specloop {
namespace trainer {

bool DomainReserve::Wants(const std::string& key, const std::string& domain,
                          uint64_t time_us) const {
  if (per_domain_ == 0 || where_.count(key)) return false;
  const auto d = domains_.find(domain);
  // Not when older than every record held of a full domain.
  return d == domains_.end() || d->second.size() < per_domain_ ||
         time_us > d->second.front().time_us;
}

void DomainReserve::Insert(const std::string& key, const std::string& domain, uint64_t time_us,
                           std::string encoded) {
  std::vector<Entry>& held = domains_[domain];
  bytes_ += encoded.size();
  where_[key] = domain;
  const auto at = std::upper_bound(
      held.begin(), held.end(), time_us, [](uint64_t t, const Entry& x) { return t < x.time_us; });
  held.insert(at, Entry{time_us, key, std::move(encoded)});
  if (held.size() > per_domain_) {
    bytes_ -= held.front().encoded.size();
    where_.erase(held.front().key);
    held.erase(held.begin());
  }
}

Status DomainReserve::Add(const std::string& key, const Record& record) {
  if (!Wants(key, record.domain, record.time_us)) return Status::OK();
  std::string encoded;
  SPECLOOP_RETURN_IF_ERROR(EncodeRecord(record, &encoded));
  Insert(key, record.domain, record.time_us, std::move(encoded));
  return Status::OK();
}

void DomainReserve::AddEncoded(const std::string& key, const std::string& domain,
                               uint64_t time_us, std::string_view encoded) {
  if (Wants(key, domain, time_us)) Insert(key, domain, time_us, std::string(encoded));
}

Status DomainReserve::Get(const std::string& key, Record* record) const {
  const auto w = where_.find(key);
  if (w == where_.end()) return Status::NotFound("not in the reserve: " + key);
  for (const Entry& e : domains_.at(w->second)) {
    if (e.key == key) return DecodeRecord(e.encoded, record);
  }
  return Status::NotFound("not in the reserve: " + key);
}

Status DomainReserve::Sample(const std::string& domain, Rng* rng, Record* record) const {
  const auto d = domains_.find(domain);
  if (d == domains_.end() || d->second.empty()) {
    return Status::NotFound("no record of domain " + domain + " in the reserve");
  }
  const std::vector<Entry>& held = d->second;
  const size_t i = std::min(held.size() - 1, static_cast<size_t>(rng->Uniform() * held.size()));
  return DecodeRecord(held[i].encoded, record);
}

std::vector<std::string> DomainReserve::Domains() const {
  std::vector<std::string> out;
  for (const auto& [d, held] : domains_) {
    if (!held.empty()) out.push_back(d);
  }
  return out;
}

size_t DomainReserve::size(const std::string& domain) const {
  const auto d = domains_.find(domain);
  return d == domains_.end() ? 0 : d->second.size();
}

}  // namespace trainer
}  // namespace specloop
