// RocksDB options shared by the primary (ReplayBuffer) and secondary (ReplayReader, tools)
// opens of a buffer directory. Internal to buffer/.
#pragma once

#include <string>
#include <vector>

#include <rocksdb/db.h>
#include <rocksdb/options.h>

#include "buffer/replay_buffer.h"
#include "common/base/status.h"

namespace specloop {

rocksdb::Options MakeDbOptions(const BufferOptions& options);
// Descriptors of the column families: "default" records, "by_domain" index, "meta".
std::vector<rocksdb::ColumnFamilyDescriptor> ColumnFamilies(const rocksdb::Options& options);
Status FromRocks(const rocksdb::Status& s, const std::string& context);

// Opens `dir` as a RocksDB secondary instance whose own files live in `secondary_dir` and
// catches it up once. handles[0] is records, handles[1] the index, handles[2] meta. When the
// WAL holds a damaged record (the open fails with Corruption) it opens `dir` read-only instead,
// skipping every damaged WAL record (kSkipAnyCorruptedRecords: the writes after it are read),
// and sets *wal_damaged (optional): such a handle cannot catch up (TryCatchUpWithPrimary is
// not supported), it holds the state at open.
Status OpenSecondary(const std::string& dir, const std::string& secondary_dir, rocksdb::DB** db,
                     std::vector<rocksdb::ColumnFamilyHandle*>* handles,
                     bool* wal_damaged = nullptr);
// Destroys the handles and deletes the db; null-safe.
void CloseDb(rocksdb::DB* db, std::vector<rocksdb::ColumnFamilyHandle*>* handles);

}  // namespace specloop

namespace specloop {
// Creates a fresh directory under $TMPDIR (or /tmp) named after `tag`.
Status MakeTempDir(const std::string& tag, std::string* path);
}  // namespace specloop
