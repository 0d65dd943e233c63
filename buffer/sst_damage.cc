#include "buffer/sst_damage.h"

#include <algorithm>
#include <cstdint>
#include <memory>

#include <rocksdb/sst_file_reader.h>
#include <rocksdb/table_properties.h>

#include "buffer/keys.h"

namespace specloop {

Status ScanTableFile(const rocksdb::LiveFileMetaData& meta, FileDamage* out) {
  *out = FileDamage();
  out->file = meta.directory + "/" + meta.relative_filename;
  out->column_family = meta.column_family_name;
  out->file_number = meta.file_number;
  out->entries = meta.num_entries >= meta.num_deletions ? meta.num_entries - meta.num_deletions
                                                        : 0;
  rocksdb::Options opt;
  rocksdb::SstFileReader reader(opt);
  rocksdb::Status s = reader.Open(out->file);
  if (!s.ok()) {
    if (!s.IsCorruption()) return Status::IOError("opening " + out->file + ": " + s.ToString());
    out->unopenable = true;
    out->error = s.ToString();
    return Status::OK();
  }
  if (auto props = reader.GetTableProperties()) {
    out->entries = props->num_entries >= props->num_deletions
                       ? props->num_entries - props->num_deletions
                       : 0;
  }
  rocksdb::ReadOptions ro;
  ro.verify_checksums = true;
  ro.fill_cache = false;
  // Index keys are a domain, '\0' and a record key: probes wide enough for long domains.
  SalvagingIterator it([&] { return reader.NewIterator(ro); }, kRecordKeySize + 64);
  for (it.SeekToFirst(); it.Valid(); it.Next()) out->readable++;
  if (!it.status().ok()) return it.status().Annotate("reading " + out->file);
  out->ranges = it.damaged();
  if (!out->ranges.empty()) out->error = out->ranges.front().error;
  return Status::OK();
}

std::vector<rocksdb::LiveFileMetaData> LiveTableFiles(rocksdb::DB* db,
                                                      const std::string& column_family,
                                                      const std::string& lo,
                                                      const std::string& hi) {
  std::vector<rocksdb::LiveFileMetaData> all, out;
  db->GetLiveFilesMetaData(&all);
  for (auto& m : all) {
    if (!column_family.empty() && m.column_family_name != column_family) continue;
    if (!hi.empty() && m.smallestkey > hi) continue;
    if (!lo.empty() && m.largestkey < lo) continue;
    out.push_back(std::move(m));
  }
  return out;
}

Status MissingSeqs(rocksdb::DB* db, const std::vector<rocksdb::ColumnFamilyHandle*>& handles,
                   uint64_t* missing) {
  *missing = 0;
  std::string next;
  rocksdb::Status s = db->Get(rocksdb::ReadOptions(), handles[2], kNextSeqKey, &next);
  if (s.IsNotFound()) return Status::OK();  // nothing ever written
  if (!s.ok()) return Status::IOError("reading next_seq: " + s.ToString());
  if (next.size() != 8) return Status::Corruption("next_seq is not 8 bytes");
  uint64_t next_seq = 0;
  for (unsigned char c : next) next_seq = next_seq << 8 | c;
  rocksdb::ReadOptions ro;
  ro.fill_cache = false;
  SalvagingIterator it([&] { return db->NewIterator(ro, handles[0]); }, kRecordKeySize);
  uint64_t present = 0, min_seq = UINT64_MAX;
  for (it.SeekToFirst(); it.Valid(); it.Next()) {
    uint64_t seq = 0;
    if (!ParseRecordKey(std::string_view(it.key().data(), it.key().size()), nullptr, nullptr,
                        &seq) ||
        seq >= next_seq) {
      continue;
    }
    present++;
    min_seq = std::min(min_seq, seq);
  }
  SPECLOOP_RETURN_IF_ERROR(it.status());
  if (present > 0 && next_seq - min_seq > present) *missing = next_seq - min_seq - present;
  return Status::OK();
}

}  // namespace specloop
