// ReplayLogger: the serving side's asynchronous writer into a replay buffer.
//
// Log() hands a record to a bounded lock-free queue and returns at once: it never blocks,
// never waits for I/O and never allocates; when the queue is full the record is dropped and
// counted. A background thread drains the queue into RocksDB WriteBatches (WAL on, one
// DB::Write per batch). A second background thread applies retention (BufferOptions) every
// retention_interval_ms, so retention never delays Log() or the writer.
//
// Durability. Every accepted record gets a sequence number (seq), increasing in Log() order
// and contiguous within one logger. durable_seq() is a watermark: every record accepted with
// seq <= durable_seq() has been written to the WAL by a DB::Write that returned OK. "Durable"
// means exactly that:
//   - sync = false (default): the data is in the WAL file through write(2). It survives the
//     process dying in any way (SIGKILL, abort, crash), not a kernel crash or power loss.
//   - sync = true: each batch is also fsynced before the watermark moves, so it survives a
//     power loss too (at a cost in throughput).
// After a write error the logger stops writing (status() reports it), drops every later
// record as failed, and the watermark stays where it was.
//
// Thread safety: Log() and the accessors from any thread; Flush() and Close() from any thread
// but not concurrently with Close().
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "buffer/mpsc_queue.h"
#include "buffer/replay_buffer.h"

namespace specloop {

struct LoggerOptions {
  // Records the queue holds; rounded up to a power of two. Default: 4096.
  size_t queue_capacity = 4096;
  // Most records per WriteBatch. Default: 256.
  size_t max_batch_records = 256;
  // fsync the WAL on every batch (see "Durability" above). Default: false.
  bool sync = false;
  // Period of the retention thread; 0 disables it. The writer also wakes it early whenever
  // 1/64 of BufferOptions::max_bytes has been written since its last run. Default: 1000.
  uint32_t retention_interval_ms = 1000;
  // Called on the writer thread with the new durable_seq() after each successful batch.
  // Must be quick and must not call back into the logger. Default: none.
  std::function<void(uint64_t durable_seq)> on_durable;
};

// Counters for the serving metrics (plain atomics; read with load()).
struct LoggerStats {
  std::atomic<uint64_t> records_logged{0};           // accepted by Log()
  std::atomic<uint64_t> records_dropped_full{0};     // dropped: queue full
  std::atomic<uint64_t> records_dropped_invalid{0};  // dropped: ValidateRecord failed
  std::atomic<uint64_t> records_dropped_closed{0};   // dropped: logger closed or failed
  std::atomic<uint64_t> records_failed{0};           // accepted but lost to a write error
  std::atomic<uint64_t> records_written{0};          // in the WAL
  std::atomic<uint64_t> bytes_written{0};            // keys + encoded values
  std::atomic<uint64_t> batches_written{0};
  std::atomic<uint64_t> retention_runs{0};
  std::atomic<uint64_t> retention_errors{0};

  uint64_t records_dropped() const {
    return records_dropped_full.load() + records_dropped_invalid.load() +
           records_dropped_closed.load();
  }
};

class ReplayLogger {
 public:
  // Opens the buffer in `dir` (ReplayBuffer::Open) and starts the background threads.
  static Status Open(const BufferOptions& buffer_options, const LoggerOptions& options,
                     const std::string& dir, std::unique_ptr<ReplayLogger>* logger);

  // Close().
  ~ReplayLogger();
  ReplayLogger(const ReplayLogger&) = delete;
  ReplayLogger& operator=(const ReplayLogger&) = delete;

  // Queues *record (moved from on success) and returns true, with its seq in *seq when given.
  // Stamps time_us with NowMicros() when it is 0. Returns false, leaving *record as it was,
  // when the record is dropped: queue full, record invalid (ValidateRecord), or logger closed
  // or failed; each reason is counted in stats(). Never blocks: O(steps) validation, one
  // clock read, one lock-free push.
  bool Log(Record* record, uint64_t* seq = nullptr);

  // Blocks until every record accepted before the call is durable, or the logger failed.
  // Returns status().
  Status Flush();

  // Stops accepting records, drains the queue, writes it, flushes memtables and syncs the
  // WAL, stops the threads and closes the buffer. Idempotent; returns status().
  Status Close();

  // Watermark: all accepted records with seq <= durable_seq() are durable. Starts at
  // first_seq() - 1 (nothing durable yet; wraps to UINT64_MAX for a new buffer, so compare
  // with durable_count()).
  uint64_t durable_seq() const { return first_seq_ + durable_count() - 1; }
  // Records of this logger that are durable (durable_seq() - first_seq() + 1).
  uint64_t durable_count() const { return durable_count_.load(std::memory_order_acquire); }
  // seq of the first record this logger accepts (continues the buffer's numbering).
  uint64_t first_seq() const { return first_seq_; }
  // Records accepted but not yet popped by the writer thread.
  uint64_t queue_depth() const { return queue_.pushed() - queue_.popped(); }

  const LoggerStats& stats() const { return stats_; }
  // OK, or the first write / retention-fatal error.
  Status status() const;
  // The underlying buffer (for reads and tests). Owned by this object; null after Close().
  ReplayBuffer* buffer() const { return buffer_.get(); }

 private:
  ReplayLogger(const LoggerOptions& options, std::unique_ptr<ReplayBuffer> buffer);
  void WriterLoop();
  void RetentionLoop();

  const LoggerOptions options_;
  std::unique_ptr<ReplayBuffer> buffer_;
  const uint64_t first_seq_;
  BoundedMpscQueue<Record> queue_;
  LoggerStats stats_;

  std::atomic<bool> closed_{false};     // Log() refuses records
  std::atomic<bool> failed_{false};     // a write failed
  std::atomic<bool> stop_writer_{false};
  std::atomic<bool> writer_idle_{false};  // writer is (about to be) waiting on wake_cv_
  std::atomic<uint64_t> durable_count_{0};
  std::atomic<uint64_t> bytes_since_retention_{0};

  mutable std::mutex mu_;
  std::condition_variable wake_cv_;     // writer waits here when the queue is empty
  std::condition_variable durable_cv_;  // Flush() waits here
  std::condition_variable retention_cv_;
  Status status_;  // GUARDED_BY(mu_)
  bool close_done_ = false;  // GUARDED_BY(mu_)
  Status close_status_;      // GUARDED_BY(mu_)

  std::thread writer_;
  std::thread retention_;
};

}  // namespace specloop
