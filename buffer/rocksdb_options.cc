#include "buffer/rocksdb_options.h"

#include <algorithm>

#include "buffer/keys.h"

namespace specloop {

rocksdb::Options MakeDbOptions(const BufferOptions& o) {
  rocksdb::Options opt;
  opt.create_if_missing = o.create_if_missing;
  opt.create_missing_column_families = true;
  uint64_t wbs = o.write_buffer_size;
  if (o.max_bytes > 0) wbs = std::min<uint64_t>(wbs, o.max_bytes / 16);
  wbs = std::max<uint64_t>(wbs, 256 << 10);
  opt.write_buffer_size = wbs;
  // Small files: retention drops whole files, so their size is its granularity.
  opt.target_file_size_base = std::max<uint64_t>(wbs / 4, 256 << 10);
  opt.max_bytes_for_level_base = 8 * wbs;
  // The index column family fills slowly; without this cap its memtable would keep every old
  // WAL file alive.
  opt.max_total_wal_size = 4 * wbs;
  opt.max_background_jobs = 2;
  opt.compression = o.compress ? rocksdb::kLZ4Compression : rocksdb::kNoCompression;
  opt.wal_recovery_mode = rocksdb::WALRecoveryMode::kPointInTimeRecovery;
  opt.keep_log_file_num = 3;
  opt.max_log_file_size = 1 << 20;
  opt.max_open_files = -1;  // required by secondaries; harmless on the primary
  return opt;
}

std::vector<rocksdb::ColumnFamilyDescriptor> ColumnFamilies(const rocksdb::Options& options) {
  return {rocksdb::ColumnFamilyDescriptor(rocksdb::kDefaultColumnFamilyName, options),
          rocksdb::ColumnFamilyDescriptor(kIndexColumnFamily, options),
          rocksdb::ColumnFamilyDescriptor(kMetaColumnFamily, options)};
}

Status FromRocks(const rocksdb::Status& s, const std::string& context) {
  if (s.ok()) return Status::OK();
  const std::string msg = context + ": " + s.ToString();
  if (s.IsNotFound()) return Status::NotFound(msg);
  if (s.IsCorruption()) return Status::Corruption(msg);
  if (s.IsInvalidArgument()) return Status::InvalidArgument(msg);
  if (s.IsNotSupported()) return Status::NotSupported(msg);
  return Status::IOError(msg);
}

Status OpenSecondary(const std::string& dir, const std::string& secondary_dir, rocksdb::DB** db,
                     std::vector<rocksdb::ColumnFamilyHandle*>* handles, bool* wal_damaged) {
  if (wal_damaged) *wal_damaged = false;
  BufferOptions bo;
  bo.create_if_missing = false;
  rocksdb::Options opt = MakeDbOptions(bo);
  opt.create_missing_column_families = false;
  rocksdb::Status s =
      rocksdb::DB::OpenAsSecondary(opt, dir, secondary_dir, ColumnFamilies(opt), handles, db);
  if (s.IsCorruption()) {
    // A damaged WAL record (a secondary replays the WAL strictly, whatever the recovery mode):
    // open read-only, which honours kSkipAnyCorruptedRecords and reads the writes after it.
    opt.wal_recovery_mode = rocksdb::WALRecoveryMode::kSkipAnyCorruptedRecords;
    s = rocksdb::DB::OpenForReadOnly(opt, dir, ColumnFamilies(opt), handles, db);
    if (!s.ok()) return FromRocks(s, "opening buffer " + dir + " past a damaged WAL");
    if (wal_damaged) *wal_damaged = true;
    return Status::OK();
  }
  if (!s.ok()) return FromRocks(s, "opening buffer " + dir + " as secondary");
  s = (*db)->TryCatchUpWithPrimary();
  if (!s.ok()) {
    CloseDb(*db, handles);
    *db = nullptr;
    return FromRocks(s, "catching up with " + dir);
  }
  return Status::OK();
}

void CloseDb(rocksdb::DB* db, std::vector<rocksdb::ColumnFamilyHandle*>* handles) {
  if (db == nullptr) return;
  for (auto* h : *handles) db->DestroyColumnFamilyHandle(h).PermitUncheckedError();
  handles->clear();
  db->Close().PermitUncheckedError();
  delete db;
}

}  // namespace specloop

#include <cstdlib>

namespace specloop {
Status MakeTempDir(const std::string& tag, std::string* path) {
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/specloop-" + tag + "-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) return Status::IOError("mkdtemp " + tmpl);
  *path = tmpl;
  return Status::OK();
}
}  // namespace specloop
