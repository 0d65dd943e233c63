// RecordShipper: tails one local buffer directory (as a RocksDB secondary, beside the serving
// worker that writes it) and appends its records to a Redis stream, off the serving path
// (docs/architecture.md, "Many workers").
//
// Each batch is one MULTI ... EXEC transaction: the records' XADDs (fields "key": the 20-byte
// record key, "record": its encoding, buffer/record_codec.h) and the SET of this shipper's
// position, "<seq> <time_us>" of the last record shipped, under `<stream>:shipped:<id>`. The
// stream and the position move together or not at all, so a shipper killed at any moment, or a
// Redis server restarted from its append-only file, resumes exactly after the last record the
// stream holds: nothing is shipped twice by the shipper and nothing acknowledged is skipped.
// After any connection error the shipper reconnects and reloads its position from Redis.
//
// Which records follow the position: those of larger seq (a buffer's seq grows in write order),
// read from `resume_slack_us` before the position's time at each ShipOnce() (keys are in time
// order; the slack covers the wall clock stepping back between two writes by up to that much).
// Records go as stored (ReplayReader::ScanEncoded); the ingester checks them. A record that
// retention removed before it was shipped is not shipped.
//
// Not thread-safe: one owner (Run() on its own thread, or ShipOnce() calls).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "fleet/redis_client.h"
#include "buffer/replay_reader.h"
#include "common/base/status.h"

namespace specloop {

struct ShipperOptions {
  std::string buffer_dir;  // the local buffer to tail (required)
  std::string redis_host = "127.0.0.1";
  int redis_port = 6379;
  // The stream records go to. Default: "specloop:records".
  std::string stream = "specloop:records";
  // Names this shipper's position; one per buffer directory (required).
  std::string id;
  // Records per transaction, and its most bytes (at least one record). Default: 256, 4 MiB.
  size_t batch_records = 256;
  size_t batch_bytes = 4 << 20;
  // The stream's cap, entries: after each ShipOnce() that shipped, the shipper trims the
  // entries every consumer group has acknowledged and then the oldest beyond this many,
  // counting those in stats().dropped (TrimStream, fleet/stream_trim.h). Between two trims
  // the stream may pass the cap by what one ShipOnce() shipped. 0: no cap (the ingester trims
  // what its group has acknowledged). Default: 0.
  uint64_t max_stream_length = 0;
  // See the header comment. Default: 1 s.
  uint64_t resume_slack_us = 1000000;
  // Connect and reply timeout. Default: 5 s.
  double timeout_seconds = 5.0;
  // Run(): the pause when nothing is new, and the longest pause between reconnection attempts.
  // A catch-up with the buffer (RocksDB's secondary catch-up) costs the same CPU whatever it
  // finds, so a shorter poll takes its share of the cores a serving worker beside it decodes
  // on. Records reach the stream within about a poll; the trainer reads its buffer every 5 s.
  // Default: 1 s.
  double poll_seconds = 1.0;
  double max_backoff_seconds = 5.0;
};

struct ShipperStats {
  std::atomic<uint64_t> records{0};  // shipped (acknowledged by Redis)
  std::atomic<uint64_t> bytes{0};    // their encodings
  std::atomic<uint64_t> batches{0};
  std::atomic<uint64_t> errors{0};   // failed transactions, trims and connections
  // The cap's trims (max_stream_length > 0): entries removed before every consumer group had
  // acknowledged them (lost to that group), and the stream's length after the last trim.
  std::atomic<uint64_t> dropped{0};
  std::atomic<uint64_t> stream_length{0};
  // Unix time (us) when a ShipOnce() last found nothing more to ship: the buffer had been
  // shipped up to then (0: not yet). Now minus this is the shipper's lag.
  std::atomic<uint64_t> caught_up_us{0};
};

class RecordShipper {
 public:
  // Opens the buffer (as a secondary) and connects; the position comes from Redis.
  static Status Open(const ShipperOptions& options, std::unique_ptr<RecordShipper>* shipper);

  // Catches up with the buffer and ships what follows the position, batch after batch, until
  // nothing is left; *shipped (optional) receives the count. IOError when Redis fails (the
  // next call reconnects first).
  Status ShipOnce(uint64_t* shipped = nullptr);
  // ShipOnce() until `stop`, pausing poll_seconds when idle and backing off on errors.
  void Run(const std::atomic<bool>& stop);

  // The position: the last seq shipped (-1: none) and its record's time.
  int64_t position_seq() const { return pos_seq_; }
  uint64_t position_time_us() const { return pos_time_us_; }
  const ShipperStats& stats() const { return stats_; }
  std::string position_key() const { return options_.stream + ":shipped:" + options_.id; }

 private:
  explicit RecordShipper(const ShipperOptions& options) : options_(options) {}
  Status Connect();  // (re)connects and loads the position
  // `slack`: scan from resume_slack_us before the position (the first batch of a ShipOnce());
  // later batches of the same call start at the position's time.
  Status ShipBatch(bool slack, uint64_t* shipped);

  ShipperOptions options_;
  std::unique_ptr<ReplayReader> reader_;
  std::unique_ptr<RedisClient> redis_;
  int64_t pos_seq_ = -1;
  uint64_t pos_time_us_ = 0;
  ShipperStats stats_;
};

}  // namespace specloop
