// Accounting for a damaged buffer. Table files: each live file is read on its own
// (rocksdb::SstFileReader, block checksums verified) with a SalvagingIterator, so a damaged
// data block costs exactly its own entries. WAL: a damaged WAL record is a lost write batch,
// which RocksDB cannot count; the records' sequence numbers (buffer/keys.h) can.
// Internal to buffer/ (verify, repair, ReplayReader).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <rocksdb/db.h>

#include "buffer/salvage_iterator.h"
#include "common/base/status.h"

namespace specloop {

struct FileDamage {
  std::string file;           // path of the table file
  std::string column_family;  // "default" (records), "by_domain" (index) or "meta"
  uint64_t file_number = 0;
  bool unopenable = false;    // footer, index or properties unreadable: nothing read
  uint64_t entries = 0;       // live entries the file holds (its properties, less deletions)
  uint64_t readable = 0;      // entries read from it
  std::vector<DamagedRange> ranges;  // stretches stepped over
  std::string error;          // the first RocksDB error seen
  // Entries lost in damaged blocks (all of them when the file cannot be opened).
  uint64_t lost() const { return entries > readable ? entries - readable : 0; }
  bool damaged() const { return unopenable || !ranges.empty() || lost() > 0; }
};

// Reads one live table file; *out describes it (damaged() false when intact). IOError only
// when the file cannot be read at all for a reason other than corruption.
Status ScanTableFile(const rocksdb::LiveFileMetaData& meta, FileDamage* out);

// The live table files of `db` whose column family is `column_family` (empty: all) and whose
// key range meets [lo, hi] (empty strings: unbounded).
std::vector<rocksdb::LiveFileMetaData> LiveTableFiles(rocksdb::DB* db,
                                                      const std::string& column_family,
                                                      const std::string& lo,
                                                      const std::string& hi);

// Records missing from the sequence of `db` (opened as buffer/rocksdb_options.h does: handles
// records, index, meta): next_seq (meta) less the records at or above the smallest seq
// present. Meant for a buffer read past a damaged WAL record, where the writes lost are the
// gaps; records that retention dropped are below the smallest seq and not counted.
Status MissingSeqs(rocksdb::DB* db, const std::vector<rocksdb::ColumnFamilyHandle*>& handles,
                   uint64_t* missing);

}  // namespace specloop
