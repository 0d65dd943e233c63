// ReplayBuffer: the primary (read-write) handle of one buffer directory, a RocksDB database
// laid out as buffer/keys.h describes. Serving writes through ReplayLogger (asynchronous, on
// top of this class); the trainer reads through ReplayReader (RocksDB secondary instances).
//
// Thread safety: all methods may be called concurrently from any thread. At most one process
// may hold a directory open as primary (RocksDB's LOCK file enforces it).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "buffer/record.h"
#include "common/base/clock.h"  // NowMicros(): the clock of time_us and now_us
#include "common/base/status.h"

namespace rocksdb {
class DB;
class ColumnFamilyHandle;
}  // namespace rocksdb

namespace specloop {

struct BufferOptions {
  // Create the directory and database when missing. Default: true.
  bool create_if_missing = true;
  // Retention by size: EnforceRetention() drops the oldest records once ApproximateBytes()
  // exceeds this, down to max_bytes * (1 - retention_slack). 0 = unbounded. Default: 0.
  uint64_t max_bytes = 0;
  // Retention by age: records older than this (by Record::time_us) are dropped. 0 = unbounded.
  // Default: 0.
  uint64_t max_age_seconds = 0;
  // Fraction below max_bytes that a size-triggered drop aims for (it drops whole SST files of
  // about max_bytes / 64, so it lands up to that much lower). Default: 0.02.
  double retention_slack = 0.02;
  // RocksDB memtable size; capped at max_bytes / 16 when max_bytes is set, so that unflushed
  // data cannot dwarf the limit. Unflushed data is held in memory twice (by the writer and by
  // each secondary, which replays the WAL), so this is sized for a logging stream of a few
  // hundred KB/s: it fills within a minute or two, after which memory stays flat. Default: 8 MiB.
  uint64_t write_buffer_size = 8ull << 20;
  // LZ4-compress SST blocks (records are mostly fp16 noise: small gain). Default: false.
  bool compress = false;
};

// One record to write and the sequence number that names it in its key.
struct SequencedRecord {
  uint64_t seq = 0;
  Record record;
};

// What the buffer's RocksDB instance holds in memory, in bytes.
struct BufferMemory {
  uint64_t memtables = 0;      // active and not yet flushed memtables, all column families
  uint64_t table_readers = 0;  // index and filter blocks of open SST files
  uint64_t block_cache = 0;    // data blocks cached for reads
};

struct RetentionResult {
  uint64_t bytes_before = 0;  // ApproximateBytes() before the step
  uint64_t bytes_after = 0;   // and after
  uint64_t cut_time_us = 0;   // records with time_us < this were dropped; 0 if none
};

class ReplayBuffer {
 public:
  // Opens (or creates) the buffer in `dir` as primary and stores it in *buffer. A directory
  // left by a killed writer recovers to its last complete WAL write. Returns IOError when the
  // directory is locked by another process or RocksDB fails, InvalidArgument for bad options.
  static Status Open(const BufferOptions& options, const std::string& dir,
                     std::unique_ptr<ReplayBuffer>* buffer);

  // Flushes memtables and closes the database.
  ~ReplayBuffer();
  ReplayBuffer(const ReplayBuffer&) = delete;
  ReplayBuffer& operator=(const ReplayBuffer&) = delete;

  // Encodes and writes `records` (and their index entries) as one atomic RocksDB WriteBatch
  // with the WAL on. When this returns OK the batch is in the WAL: it survives the process
  // being killed; with sync = true the WAL is also fsynced, so it survives a power loss.
  // *bytes (optional) receives the encoded bytes written. InvalidArgument if a record fails
  // ValidateRecord (nothing is written); IOError when RocksDB fails.
  Status Write(const std::vector<SequencedRecord>& records, bool sync, uint64_t* bytes = nullptr);

  // Reads the record stored under `key` (buffer/keys.h). NotFound if absent, Corruption if it
  // does not decode.
  Status Get(const std::string& key, Record* record);

  // Applies the age and size limits of BufferOptions: deletes the oldest key range (one atomic
  // range deletion over records and index), then drops the SST files it covers and compacts
  // the boundary. Never holds a lock that Write() needs, so writers are not stalled; meant to
  // run on its own thread. `now_us` is the current time for the age limit (NowMicros()).
  Status EnforceRetention(uint64_t now_us, RetentionResult* result = nullptr);

  // Bytes of live SST files plus memtables over both column families: the size that
  // max_bytes bounds. (WAL files, bounded at about 4 memtables, are not counted.)
  uint64_t ApproximateBytes();

  // RocksDB's memory use (estimates from its properties).
  BufferMemory MemoryUsage();

  // One past the largest seq ever written to this buffer, as of Open (0 for a new buffer).
  uint64_t next_seq() const { return next_seq_; }

  const BufferOptions& options() const { return options_; }

  // Writes memtables to SST files and syncs the WAL.
  Status Flush();

  // The RocksDB handles, for tools and tests. Owned by this object.
  rocksdb::DB* db() const { return db_; }
  rocksdb::ColumnFamilyHandle* records_cf() const { return records_cf_; }
  rocksdb::ColumnFamilyHandle* index_cf() const { return index_cf_; }

 private:
  ReplayBuffer() = default;

  BufferOptions options_;
  rocksdb::DB* db_ = nullptr;
  rocksdb::ColumnFamilyHandle* records_cf_ = nullptr;
  rocksdb::ColumnFamilyHandle* index_cf_ = nullptr;
  rocksdb::ColumnFamilyHandle* meta_cf_ = nullptr;
  uint64_t next_seq_ = 0;
  std::mutex retention_mu_;  // one retention step at a time
};

}  // namespace specloop
