#include "buffer/buffer_tools.h"

#include <filesystem>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "common/base/half.h"
#include "buffer/keys.h"
#include "buffer/record_codec.h"
#include "buffer/rocksdb_options.h"
#include "common/base/remove_tree.h"

namespace specloop {

namespace {

std::string_view View(const rocksdb::Slice& s) { return std::string_view(s.data(), s.size()); }

// A secondary instance in a temporary directory, removed with it.
class SecondaryDb {
 public:
  ~SecondaryDb() {
    CloseDb(db_, &handles_);
    if (!tmp_.empty()) (void)RemoveTree(tmp_);
  }
  Status Open(const std::string& dir) {
    if (!std::filesystem::exists(dir + "/CURRENT")) {
      return Status::NotFound("not a replay buffer (no CURRENT file): " + dir);
    }
    SPECLOOP_RETURN_IF_ERROR(MakeTempDir("tool", &tmp_));
    return OpenSecondary(dir, tmp_, &db_, &handles_);
  }
  rocksdb::DB* db() const { return db_; }
  rocksdb::ColumnFamilyHandle* records() const { return handles_[0]; }
  rocksdb::ColumnFamilyHandle* index() const { return handles_[1]; }

 private:
  std::string tmp_;
  rocksdb::DB* db_ = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
};

}  // namespace

Status ComputeBufferStats(const std::string& dir, BufferStats* stats) {
  *stats = BufferStats();
  SecondaryDb sdb;
  SPECLOOP_RETURN_IF_ERROR(sdb.Open(dir));
  std::unique_ptr<rocksdb::Iterator> it(sdb.db()->NewIterator(rocksdb::ReadOptions(),
                                                              sdb.records()));
  Record r;
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    if (!DecodeRecord(View(it->value()), &r).ok()) {
      stats->corrupt++;
      continue;
    }
    stats->records++;
    stats->steps += r.steps.size();
    stats->value_bytes += it->value().size();
    if (stats->records == 1 || r.time_us < stats->min_time_us) stats->min_time_us = r.time_us;
    stats->max_time_us = std::max(stats->max_time_us, r.time_us);
    stats->domains[r.domain]++;
    stats->draft_versions[r.draft_version]++;
  }
  SPECLOOP_RETURN_IF_ERROR(FromRocks(it->status(), "scanning " + dir));
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.is_regular_file(ec)) stats->disk_bytes += e.file_size(ec);
  }
  return Status::OK();
}

std::string RecordToJson(const Record& r) {
  using nlohmann::json;
  json steps = json::array();
  for (const SpecStep& s : r.steps) {
    json ids = json::array(), lps = json::array();
    const size_t k = s.draft_tokens.size();
    for (size_t j = 0; j <= k; j++) {
      json idj = json::array(), lpj = json::array();
      for (size_t i = 0; i < r.top_k; i++) {
        idj.push_back(s.topk_ids[j * r.top_k + i]);
        lpj.push_back(HalfToFloat(s.topk_logprobs[j * r.top_k + i]));
      }
      ids.push_back(std::move(idj));
      lps.push_back(std::move(lpj));
    }
    steps.push_back({{"start_pos", s.start_pos},
                     {"draft_tokens", s.draft_tokens},
                     {"num_accepted", s.num_accepted},
                     {"topk_ids", std::move(ids)},
                     {"topk_logprobs", std::move(lps)},
                     {"tail_mass", s.tail_mass}});
  }
  json j = {{"time_us", r.time_us},
            {"domain", r.domain},
            {"request_id", r.request_id},
            {"worker_id", r.worker_id},
            {"draft_version", r.draft_version},
            {"target_id", r.target_id},
            {"sampling",
             {{"temperature", r.sampling.temperature},
              {"top_k", r.sampling.top_k},
              {"top_p", r.sampling.top_p},
              {"seed", r.sampling.seed}}},
            {"prompt_len", r.prompt_len},
            {"tokens", r.tokens},
            {"top_k", r.top_k},
            {"steps", std::move(steps)}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

Status ExportJsonl(const std::string& dir, const ExportOptions& options, std::ostream& out,
                   uint64_t* count) {
  *count = 0;
  SecondaryDb sdb;
  SPECLOOP_RETURN_IF_ERROR(sdb.Open(dir));
  const std::string prefix = options.domain ? DomainPrefix(*options.domain) : std::string();
  std::unique_ptr<rocksdb::Iterator> it(sdb.db()->NewIterator(
      rocksdb::ReadOptions(), options.domain ? sdb.index() : sdb.records()));
  Record r;
  for (it->Seek(prefix + TimeKey(options.since_us));
       it->Valid() && it->key().starts_with(prefix); it->Next()) {
    std::string_view value_view;
    rocksdb::PinnableSlice value;
    if (options.domain) {
      const std::string key(View(it->key()).substr(prefix.size()));
      SPECLOOP_RETURN_IF_ERROR(FromRocks(
          sdb.db()->Get(rocksdb::ReadOptions(), sdb.records(), key, &value), "reading record"));
      value_view = View(value);
    } else {
      value_view = View(it->value());
    }
    SPECLOOP_RETURN_IF_ERROR(DecodeRecord(value_view, &r));
    out << RecordToJson(r) << '\n';
    ++*count;
  }
  SPECLOOP_RETURN_IF_ERROR(FromRocks(it->status(), "scanning " + dir));
  out.flush();
  return out ? Status::OK() : Status::IOError("writing export");
}

Status VerifyBuffer(const std::string& dir, VerifyReport* report) {
  *report = VerifyReport();
  SecondaryDb sdb;
  SPECLOOP_RETURN_IF_ERROR(sdb.Open(dir));
  auto problem = [&](const std::string& p) {
    if (report->problems.size() < 20) report->problems.push_back(p);
  };
  rocksdb::Status rs = sdb.db()->VerifyChecksum();
  if (!rs.ok() && !rs.IsNotSupported()) {
    return FromRocks(rs, "RocksDB block checksums of " + dir);
  }
  std::set<std::string> indexed;  // index keys expected from the records
  {
    std::unique_ptr<rocksdb::Iterator> it(sdb.db()->NewIterator(rocksdb::ReadOptions(),
                                                                sdb.records()));
    Record r;
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      report->records++;
      const std::string_view key = View(it->key());
      Status s = DecodeRecord(View(it->value()), &r);
      if (!s.ok()) {
        report->corrupt_records++;
        problem("record #" + std::to_string(report->records) + ": " + s.ToString());
        continue;
      }
      uint64_t t = 0;
      uint32_t w = 0;
      if (!ParseRecordKey(key, &t, &w, nullptr) || t != r.time_us || w != r.worker_id) {
        report->bad_keys++;
        problem("record #" + std::to_string(report->records) + ": key does not match record");
        continue;
      }
      indexed.insert(DomainIndexKey(r.domain, key));
    }
    SPECLOOP_RETURN_IF_ERROR(FromRocks(it->status(), "scanning records of " + dir));
  }
  {
    std::unique_ptr<rocksdb::Iterator> it(sdb.db()->NewIterator(rocksdb::ReadOptions(),
                                                                sdb.index()));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      report->index_entries++;
      if (indexed.erase(it->key().ToString()) == 0) {
        report->dangling_index++;
        problem("index entry without its record");
      }
    }
    SPECLOOP_RETURN_IF_ERROR(FromRocks(it->status(), "scanning index of " + dir));
  }
  report->unindexed_records = indexed.size();
  if (!indexed.empty()) problem(std::to_string(indexed.size()) + " records missing from index");
  if (!report->ok()) return Status::Corruption("replay buffer " + dir + " failed verification");
  return Status::OK();
}

}  // namespace specloop
