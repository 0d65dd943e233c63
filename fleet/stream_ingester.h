// StreamIngester: the trainer's side of the distributed log. Reads the Redis stream that the
// workers' RecordShippers append to, as one consumer of a consumer group, and writes each record
// into a local buffer directory under its original key (buffer/keys.h: time, worker, seq), which
// the trainer then reads like any other buffer (`specloop train --buffer DIR`).
//
// At-least-once: entries are acknowledged (XACK) only after their batch is in the local buffer
// (one RocksDB write, WAL fsynced). A consumer that restarts first re-reads its own pending
// entries (delivered, never acknowledged), then new ones. Duplicates are harmless: a record
// written again lands on its own key (deduplication by record key). An entry that does not
// decode, or whose key is not its record's, is counted, acknowledged and skipped; an entry
// delivered but removed from the stream before it was read again (the operator's length cap,
// fleet/stream_trim.h) is counted as missing and acknowledged.
//
// Trimming: every trim_seconds the ingester removes the entries that every consumer group has
// acknowledged (TrimStream, fleet/stream_trim.h), and reads its group's lag and the stream's
// length for its metrics.
//
// Not thread-safe: one owner.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "fleet/redis_client.h"
#include "buffer/replay_buffer.h"
#include "common/base/status.h"

namespace specloop {

struct IngesterOptions {
  std::string buffer_dir;  // the local buffer to write (required)
  BufferOptions buffer;
  std::string redis_host = "127.0.0.1";
  int redis_port = 6379;
  std::string stream = "specloop:records";
  // The consumer group (created at the stream's start when missing) and this consumer's name.
  std::string group = "specloop-trainer";
  std::string consumer = "trainer";
  // Entries per read. Default: 256.
  size_t batch_entries = 256;
  // How long one read waits for new entries. Default: 100 ms.
  int block_ms = 100;
  double timeout_seconds = 5.0;
  double max_backoff_seconds = 5.0;  // Run(): the longest pause between reconnections
  // How often IngestOnce() trims acknowledged entries (and reads the lag); 0: never (the lag
  // figures then stay 0). Default: 1 s.
  double trim_seconds = 1.0;
};

struct IngesterStats {
  std::atomic<uint64_t> records{0};  // written to the local buffer (again when redelivered)
  std::atomic<uint64_t> corrupt{0};  // entries skipped (again when redelivered)
  std::atomic<uint64_t> missing{0};  // delivered entries trimmed before they were read again
  std::atomic<uint64_t> errors{0};   // failed reads, writes, trims and connections
  // From the last trim: entries removed as acknowledged by every group (a running total), the
  // stream's length, this group's unacknowledged entries (pending and undelivered), and the
  // id time (Unix ms, when Redis added it) of the oldest entry it still needs (0: none).
  std::atomic<uint64_t> trimmed{0};
  std::atomic<uint64_t> stream_length{0};
  std::atomic<uint64_t> lag_entries{0};
  std::atomic<uint64_t> oldest_unacknowledged_ms{0};
};

class StreamIngester {
 public:
  static Status Open(const IngesterOptions& options, std::unique_ptr<StreamIngester>* ingester);

  // One read (pending entries first, then new ones, waiting up to block_ms), written and
  // acknowledged; *ingested (optional) receives the records written. IOError when Redis or the
  // buffer fails (the next call reconnects); records written before a failed acknowledgement
  // count in *ingested and in stats().
  Status IngestOnce(uint64_t* ingested = nullptr);
  // IngestOnce() until `stop`, backing off on errors.
  void Run(const std::atomic<bool>& stop);

  const IngesterStats& stats() const { return stats_; }
  ReplayBuffer* buffer() { return buffer_.get(); }

 private:
  explicit StreamIngester(const IngesterOptions& options) : options_(options) {}
  Status Connect();
  // Trims when trim_seconds have passed since the last trim.
  Status MaybeTrim();

  IngesterOptions options_;
  std::unique_ptr<ReplayBuffer> buffer_;
  std::unique_ptr<RedisClient> redis_;
  bool pending_done_ = false;  // this connection's own pending entries were re-read
  std::chrono::steady_clock::time_point last_trim_{};
  IngesterStats stats_;
};

}  // namespace specloop
