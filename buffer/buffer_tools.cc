#include "buffer/buffer_tools.h"

#include <filesystem>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "common/base/half.h"
#include "buffer/keys.h"
#include "buffer/record_codec.h"
#include "buffer/rocksdb_options.h"
#include "buffer/salvage_iterator.h"
#include "buffer/replay_buffer.h"
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
    return OpenSecondary(dir, tmp_, &db_, &handles_, &wal_damaged_);
  }
  // Records lost with damaged WAL records (0 when the WAL read cleanly).
  Status WalLoss(uint64_t* missing) const {
    *missing = 0;
    return wal_damaged_ ? MissingSeqs(db_, handles_, missing) : Status::OK();
  }
  bool wal_damaged() const { return wal_damaged_; }
  rocksdb::DB* db() const { return db_; }
  rocksdb::ColumnFamilyHandle* records() const { return handles_[0]; }
  rocksdb::ColumnFamilyHandle* index() const { return handles_[1]; }
  // Records (cf 0) or index (cf 1), stepping over damaged blocks.
  std::unique_ptr<SalvagingIterator> Salvaging(int cf) const {
    rocksdb::DB* d = db_;
    rocksdb::ColumnFamilyHandle* h = handles_[cf];
    return std::make_unique<SalvagingIterator>(
        [d, h] { return d->NewIterator(rocksdb::ReadOptions(), h); },
        cf == 0 ? kRecordKeySize : kRecordKeySize + 64);
  }

 private:
  std::string tmp_;
  rocksdb::DB* db_ = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
  bool wal_damaged_ = false;
};

// Adds up the damage of the records' table files that meet the stretches `it` stepped over
// (each file once): records lost to *lost, file paths to *files.
void CountRecordDamage(rocksdb::DB* db, const std::vector<DamagedRange>& ranges,
                       std::set<uint64_t>* seen, uint64_t* lost,
                       std::vector<std::string>* files) {
  for (const DamagedRange& r : ranges) {
    for (const auto& m : LiveTableFiles(db, rocksdb::kDefaultColumnFamilyName, r.after,
                                        r.to_end ? std::string() : r.resume)) {
      if (!seen->insert(m.file_number).second) continue;
      FileDamage fd;
      if (!ScanTableFile(m, &fd).ok() || !fd.damaged()) continue;
      *lost += fd.lost();
      files->push_back(fd.file);
    }
  }
}

}  // namespace

std::string DescribeKey(std::string_view key) {
  uint64_t t = 0, seq = 0;
  uint32_t w = 0;
  if (ParseRecordKey(key, &t, &w, &seq)) {
    return std::to_string(t) + "/" + std::to_string(w) + "/" + std::to_string(seq);
  }
  std::string_view domain, rk;
  if (ParseDomainIndexKey(key, &domain, &rk) && ParseRecordKey(rk, &t, &w, &seq)) {
    return std::string(domain) + ":" + DescribeKey(rk);
  }
  static const char* kHex = "0123456789abcdef";
  std::string out = "0x";
  for (unsigned char c : key) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return key.empty() ? std::string("(start)") : out;
}

Status ComputeBufferStats(const std::string& dir, BufferStats* stats) {
  *stats = BufferStats();
  SecondaryDb sdb;
  SPECLOOP_RETURN_IF_ERROR(sdb.Open(dir));
  auto it = sdb.Salvaging(0);
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
  SPECLOOP_RETURN_IF_ERROR(it->status().Annotate("scanning " + dir));
  std::set<uint64_t> seen;
  CountRecordDamage(sdb.db(), it->damaged(), &seen, &stats->damaged_block_records,
                    &stats->damaged_files);
  SPECLOOP_RETURN_IF_ERROR(sdb.WalLoss(&stats->damaged_wal_records));
  stats->wal_damaged = sdb.wal_damaged();
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
  auto it = sdb.Salvaging(options.domain ? 1 : 0);
  Record r;
  for (it->Seek(prefix + TimeKey(options.since_us));
       it->Valid() && it->key().starts_with(prefix); it->Next()) {
    std::string_view value_view;
    rocksdb::PinnableSlice value;
    if (options.domain) {
      const std::string key(View(it->key()).substr(prefix.size()));
      rocksdb::Status gs = sdb.db()->Get(rocksdb::ReadOptions(), sdb.records(), key, &value);
      if (gs.IsCorruption() || gs.IsNotFound()) continue;  // damaged; verify names it
      SPECLOOP_RETURN_IF_ERROR(FromRocks(gs, "reading record"));
      value_view = View(value);
    } else {
      value_view = View(it->value());
    }
    if (!DecodeRecord(value_view, &r).ok()) continue;  // damaged; verify names it
    out << RecordToJson(r) << '\n';
    ++*count;
  }
  SPECLOOP_RETURN_IF_ERROR(it->status().Annotate("scanning " + dir));
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
  // Every table file on its own: which are damaged, where, and what it costs.
  for (const auto& m : LiveTableFiles(sdb.db(), "", "", "")) {
    FileDamage fd;
    SPECLOOP_RETURN_IF_ERROR(ScanTableFile(m, &fd));
    if (!fd.damaged()) continue;
    const bool records = fd.column_family == rocksdb::kDefaultColumnFamilyName;
    (records ? report->damaged_block_records : report->damaged_index_entries) += fd.lost();
    if (fd.unopenable) {
      problem(fd.file + " (" + fd.column_family + "): unreadable, " + std::to_string(fd.lost()) +
              " entries lost: " + fd.error);
    }
    for (const DamagedRange& r : fd.ranges) {
      problem(fd.file + " (" + fd.column_family + "): damaged block after " +
              DescribeKey(r.after) + ", before " +
              (r.to_end ? std::string("the end") : DescribeKey(r.resume)) + ": " + r.error);
    }
    if (!fd.ranges.empty()) {
      problem(fd.file + ": " + std::to_string(fd.lost()) + " of " +
              std::to_string(fd.entries) + " entries lost");
    }
    report->damaged_files.push_back(std::move(fd));
  }
  if (sdb.wal_damaged()) {
    SPECLOOP_RETURN_IF_ERROR(sdb.WalLoss(&report->damaged_wal_records));
    report->wal_damaged = true;
    problem("WAL: damaged records skipped; " + std::to_string(report->damaged_wal_records) +
            " records missing from the sequence");
  }
  std::set<std::string> indexed;  // index keys expected from the records
  {
    auto it = sdb.Salvaging(0);
    Record r;
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      report->records++;
      const std::string_view key = View(it->key());
      Status s = DecodeRecord(View(it->value()), &r);
      if (!s.ok()) {
        report->corrupt_records++;
        problem("record " + DescribeKey(key) + ": " + s.ToString());
        continue;
      }
      uint64_t t = 0;
      uint32_t w = 0;
      if (!ParseRecordKey(key, &t, &w, nullptr) || t != r.time_us || w != r.worker_id) {
        report->bad_keys++;
        problem("record " + DescribeKey(key) + ": key does not match record");
        continue;
      }
      indexed.insert(DomainIndexKey(r.domain, key));
    }
    SPECLOOP_RETURN_IF_ERROR(it->status().Annotate("scanning records of " + dir));
  }
  {
    auto it = sdb.Salvaging(1);
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      report->index_entries++;
      if (indexed.erase(it->key().ToString()) == 0) {
        report->dangling_index++;
        std::string_view domain, rk;
        problem("index entry without its record" +
                (ParseDomainIndexKey(View(it->key()), &domain, &rk)
                     ? ": " + std::string(domain) + " " + DescribeKey(rk)
                     : std::string()));
      }
    }
    SPECLOOP_RETURN_IF_ERROR(it->status().Annotate("scanning index of " + dir));
  }
  report->unindexed_records = indexed.size();
  if (!indexed.empty()) problem(std::to_string(indexed.size()) + " records missing from index");
  if (!report->ok()) return Status::Corruption("replay buffer " + dir + " failed verification");
  return Status::OK();
}

Status RepairBuffer(const std::string& dir, const std::string& out_dir, RepairReport* report) {
  *report = RepairReport();
  if (std::filesystem::exists(out_dir)) {
    return Status::InvalidArgument("repair output " + out_dir + " exists; name a new directory");
  }
  SecondaryDb sdb;
  SPECLOOP_RETURN_IF_ERROR(sdb.Open(dir));
  std::unique_ptr<ReplayBuffer> out;
  SPECLOOP_RETURN_IF_ERROR(ReplayBuffer::Open(BufferOptions(), out_dir, &out));
  auto it = sdb.Salvaging(0);
  std::vector<SequencedRecord> batch;
  auto flush = [&]() -> Status {
    if (batch.empty()) return Status::OK();
    SPECLOOP_RETURN_IF_ERROR(out->Write(batch, /*sync=*/false));
    report->copied += batch.size();
    batch.clear();
    return Status::OK();
  };
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    SequencedRecord sr;
    uint64_t t = 0, seq = 0;
    uint32_t w = 0;
    if (!ParseRecordKey(View(it->key()), &t, &w, &seq) ||
        !DecodeRecord(View(it->value()), &sr.record).ok() || sr.record.time_us != t ||
        sr.record.worker_id != w) {
      report->undecodable++;
      continue;
    }
    sr.seq = seq;
    batch.push_back(std::move(sr));
    if (batch.size() == 256) SPECLOOP_RETURN_IF_ERROR(flush());
  }
  SPECLOOP_RETURN_IF_ERROR(it->status().Annotate("scanning records of " + dir));
  SPECLOOP_RETURN_IF_ERROR(flush());
  std::set<uint64_t> seen;
  CountRecordDamage(sdb.db(), it->damaged(), &seen, &report->damaged_block_records,
                    &report->damaged_files);
  SPECLOOP_RETURN_IF_ERROR(sdb.WalLoss(&report->damaged_wal_records));
  return out->Flush();
}

}  // namespace specloop
