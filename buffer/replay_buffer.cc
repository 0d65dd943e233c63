#include "buffer/replay_buffer.h"

#include <algorithm>
#include <mutex>

#include <rocksdb/convenience.h>
#include <rocksdb/metadata.h>
#include <rocksdb/write_batch.h>

#include "buffer/keys.h"
#include "buffer/record_codec.h"
#include "buffer/rocksdb_options.h"

namespace specloop {

Status ReplayBuffer::Open(const BufferOptions& options, const std::string& dir,
                          std::unique_ptr<ReplayBuffer>* buffer) {
  if (options.retention_slack < 0 || options.retention_slack >= 1) {
    return Status::InvalidArgument("retention_slack must be in [0, 1)");
  }
  rocksdb::Options opt = MakeDbOptions(options);
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(opt, dir, ColumnFamilies(opt), &handles, &db);
  if (!s.ok()) return FromRocks(s, "opening replay buffer " + dir);
  std::unique_ptr<ReplayBuffer> b(new ReplayBuffer());
  b->options_ = options;
  b->db_ = db;
  b->records_cf_ = handles[0];
  b->index_cf_ = handles[1];
  b->meta_cf_ = handles[2];
  std::string v;
  s = db->Get(rocksdb::ReadOptions(), b->meta_cf_, kNextSeqKey, &v);
  if (s.ok() && v.size() == 8) {
    for (char c : v) b->next_seq_ = (b->next_seq_ << 8) | static_cast<unsigned char>(c);
  } else if (!s.IsNotFound()) {
    return s.ok() ? Status::Corruption("bad next_seq in " + dir)
                  : FromRocks(s, "reading next_seq of " + dir);
  }
  *buffer = std::move(b);
  return Status::OK();
}

ReplayBuffer::~ReplayBuffer() {
  if (db_ == nullptr) return;
  Flush().ok();  // best effort: the WAL already holds everything written
  std::vector<rocksdb::ColumnFamilyHandle*> handles = {records_cf_, index_cf_, meta_cf_};
  CloseDb(db_, &handles);
}

Status ReplayBuffer::Write(const std::vector<SequencedRecord>& records, bool sync,
                           uint64_t* bytes) {
  rocksdb::WriteBatch batch;
  std::string value;
  uint64_t total = 0, max_seq = 0;
  for (const SequencedRecord& sr : records) {
    max_seq = std::max(max_seq, sr.seq);
    value.clear();
    SPECLOOP_RETURN_IF_ERROR(EncodeRecord(sr.record, &value));
    const std::string key = RecordKey(sr.record.time_us, sr.record.worker_id, sr.seq);
    rocksdb::Status s = batch.Put(records_cf_, key, value);
    if (s.ok()) s = batch.Put(index_cf_, DomainIndexKey(sr.record.domain, key), rocksdb::Slice());
    if (!s.ok()) return FromRocks(s, "building write batch");
    total += key.size() + value.size();
  }
  if (!records.empty()) {
    const std::string next = RecordKey(0, 0, max_seq + 1).substr(12);  // big-endian fixed64
    rocksdb::Status s = batch.Put(meta_cf_, kNextSeqKey, next);
    if (!s.ok()) return FromRocks(s, "building write batch");
  }
  rocksdb::WriteOptions wo;
  wo.sync = sync;
  SPECLOOP_RETURN_IF_ERROR(FromRocks(db_->Write(wo, &batch), "writing replay records"));
  if (bytes) *bytes = total;
  return Status::OK();
}

Status ReplayBuffer::Get(const std::string& key, Record* record) {
  rocksdb::PinnableSlice value;
  SPECLOOP_RETURN_IF_ERROR(
      FromRocks(db_->Get(rocksdb::ReadOptions(), records_cf_, key, &value), "reading record"));
  return DecodeRecord(std::string_view(value.data(), value.size()), record);
}

uint64_t ReplayBuffer::ApproximateBytes() {
  uint64_t total = 0;
  for (auto* cf : {records_cf_, index_cf_}) {
    uint64_t v = 0;
    if (db_->GetIntProperty(cf, "rocksdb.live-sst-files-size", &v)) total += v;
    if (db_->GetIntProperty(cf, "rocksdb.cur-size-all-mem-tables", &v)) total += v;
  }
  return total;
}

BufferMemory ReplayBuffer::MemoryUsage() {
  BufferMemory m;
  for (auto* cf : {records_cf_, index_cf_, meta_cf_}) {
    uint64_t v = 0;
    if (db_->GetIntProperty(cf, "rocksdb.cur-size-all-mem-tables", &v)) m.memtables += v;
    if (db_->GetIntProperty(cf, "rocksdb.estimate-table-readers-mem", &v)) m.table_readers += v;
  }
  // The column families share one block cache (the default one).
  uint64_t v = 0;
  if (db_->GetIntProperty(records_cf_, "rocksdb.block-cache-usage", &v)) m.block_cache = v;
  return m;
}

Status ReplayBuffer::Flush() {
  rocksdb::FlushOptions fo;
  SPECLOOP_RETURN_IF_ERROR(FromRocks(db_->Flush(fo, {records_cf_, index_cf_, meta_cf_}), "flushing"));
  return FromRocks(db_->SyncWAL(), "syncing WAL");
}

Status ReplayBuffer::EnforceRetention(uint64_t now_us, RetentionResult* result) {
  std::lock_guard<std::mutex> lock(retention_mu_);
  RetentionResult r;
  r.bytes_before = r.bytes_after = ApproximateBytes();

  uint64_t oldest = 0, newest = 0;
  {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), records_cf_));
    it->SeekToFirst();
    if (!it->Valid()) {
      if (result) *result = r;
      return FromRocks(it->status(), "retention scan");
    }
    ParseRecordKey(std::string_view(it->key().data(), it->key().size()), &oldest, nullptr,
                   nullptr);
    it->SeekToLast();
    if (it->Valid()) {
      ParseRecordKey(std::string_view(it->key().data(), it->key().size()), &newest, nullptr,
                     nullptr);
    }
    SPECLOOP_RETURN_IF_ERROR(FromRocks(it->status(), "retention scan"));
  }

  uint64_t cut = 0;  // drop every record with time_us < cut
  if (options_.max_age_seconds > 0 && now_us > options_.max_age_seconds * 1000000ull) {
    cut = now_us - options_.max_age_seconds * 1000000ull;
  }
  // SST files of the records wholly older than the oldest visible record are already deleted
  // (by an earlier step's range tombstone) and only wait for compaction: not counted as live.
  const std::string oldest_key = TimeKey(oldest);
  rocksdb::ColumnFamilyMetaData meta;
  db_->GetColumnFamilyMetaData(records_cf_, &meta);
  std::vector<const rocksdb::SstFileMetaData*> files;
  uint64_t dead = 0;
  for (const auto& level : meta.levels) {
    for (const auto& f : level.files) {
      if (f.largestkey < oldest_key) {
        dead += f.size;
      } else {
        files.push_back(&f);
      }
    }
  }
  const uint64_t live = r.bytes_before > dead ? r.bytes_before - dead : 0;
  if (options_.max_bytes > 0 && live > options_.max_bytes) {
    // Drop whole SST files, oldest first (by their newest key), until enough is gone: the cut falls on a file
    // boundary so DeleteFilesInRange reclaims the space at once, without a compaction.
    const uint64_t target =
        static_cast<uint64_t>(options_.max_bytes * (1.0 - options_.retention_slack));
    const uint64_t to_drop = live - target;
    std::sort(files.begin(), files.end(), [](const auto* a, const auto* b) {
      // By largest key: a flushed file holding an earlier step's range tombstone starts at the
      // tombstone ("") but ends with new records, and must not count as old.
      return a->largestkey < b->largestkey;
    });
    uint64_t acc = 0, size_cut = 0;
    for (const auto* f : files) {
      if (f->largestkey.size() < 8) continue;
      acc += f->size;
      uint64_t t = 0;
      for (int i = 0; i < 8; i++) t = (t << 8) | static_cast<unsigned char>(f->largestkey[i]);
      size_cut = std::max(size_cut, t + 1);
      if (acc >= to_drop) break;
    }
    cut = std::max(cut, std::min(size_cut, newest + 1));
  }
  if (cut <= oldest) {
    if (result) *result = r;
    return Status::OK();
  }
  const std::string cut_key = TimeKey(cut);

  // One atomic batch: the records and, per domain, their index entries.
  rocksdb::WriteBatch batch;
  rocksdb::Status s = batch.DeleteRange(records_cf_, rocksdb::Slice(), cut_key);
  {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), index_cf_));
    for (it->SeekToFirst(); s.ok() && it->Valid();) {
      std::string_view domain, rk;
      const std::string_view key(it->key().data(), it->key().size());
      if (!ParseDomainIndexKey(key, &domain, &rk)) {
        it->Next();  // not ours; leave it
        continue;
      }
      const std::string prefix = DomainPrefix(domain);
      s = batch.DeleteRange(index_cf_, prefix, prefix + cut_key);
      std::string next = std::string(domain);
      next.push_back('\x01');  // just past every key with prefix domain + '\0'
      it->Seek(next);
    }
    if (s.ok()) s = it->status();
  }
  if (s.ok()) s = db_->Write(rocksdb::WriteOptions(), &batch);
  SPECLOOP_RETURN_IF_ERROR(FromRocks(s, "deleting old records"));

  // Reclaim space now: files wholly inside the range go at once. Files it cannot delete
  // (level 0, or busy in a compaction) are compacted away when they hold more than a slack's
  // worth of dead bytes; non-exclusively, so automatic compactions and writes go on.
  rocksdb::Slice cut_slice(cut_key);
  s = rocksdb::DeleteFilesInRange(db_, records_cf_, nullptr, &cut_slice, /*include_end=*/false);
  if (s.ok()) {
    db_->GetColumnFamilyMetaData(records_cf_, &meta);
    uint64_t stuck = 0;
    for (const auto& level : meta.levels) {
      for (const auto& f : level.files) {
        if (f.smallestkey < cut_key) stuck += f.size;
      }
    }
    if (stuck > 0 && (options_.max_bytes == 0 ||
                      stuck > options_.max_bytes * options_.retention_slack / 2)) {
      rocksdb::CompactRangeOptions co;
      co.exclusive_manual_compaction = false;
      co.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForceOptimized;
      s = db_->CompactRange(co, records_cf_, nullptr, &cut_slice);
    }
  }
  SPECLOOP_RETURN_IF_ERROR(FromRocks(s, "reclaiming dropped records"));
  r.cut_time_us = cut;
  r.bytes_after = ApproximateBytes();
  if (result) *result = r;
  return Status::OK();
}

}  // namespace specloop
