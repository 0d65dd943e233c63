#include "buffer/replay_logger.h"

#include <chrono>

namespace specloop {

Status ReplayLogger::Open(const BufferOptions& buffer_options, const LoggerOptions& options,
                          const std::string& dir, std::unique_ptr<ReplayLogger>* logger) {
  if (options.queue_capacity < 2 || options.max_batch_records < 1) {
    return Status::InvalidArgument("queue_capacity must be >= 2 and max_batch_records >= 1");
  }
  std::unique_ptr<ReplayBuffer> buffer;
  SPECLOOP_RETURN_IF_ERROR(ReplayBuffer::Open(buffer_options, dir, &buffer));
  logger->reset(new ReplayLogger(options, std::move(buffer)));
  return Status::OK();
}

ReplayLogger::ReplayLogger(const LoggerOptions& options, std::unique_ptr<ReplayBuffer> buffer)
    : options_(options),
      buffer_(std::move(buffer)),
      first_seq_(buffer_->next_seq()),
      queue_(options.queue_capacity) {
  writer_ = std::thread([this] { WriterLoop(); });
  if (options_.retention_interval_ms > 0) retention_ = std::thread([this] { RetentionLoop(); });
}

ReplayLogger::~ReplayLogger() { Close().ok(); }

bool ReplayLogger::Log(Record* record, uint64_t* seq) {
  if (closed_.load(std::memory_order_relaxed) || failed_.load(std::memory_order_relaxed)) {
    stats_.records_dropped_closed.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  if (!ValidateRecord(*record).empty()) {
    stats_.records_dropped_invalid.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  const bool stamped = record->time_us == 0;
  if (stamped) record->time_us = NowMicros();
  uint64_t pos = 0;
  if (!queue_.TryPush(record, &pos)) {
    if (stamped) record->time_us = 0;
    stats_.records_dropped_full.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  stats_.records_logged.fetch_add(1, std::memory_order_relaxed);
  if (seq) *seq = first_seq_ + pos;
  // Wake the writer only when it sleeps; it also wakes on its own every millisecond, so a
  // notification lost to a race costs at most that much latency.
  if (writer_idle_.load(std::memory_order_acquire)) wake_cv_.notify_one();
  return true;
}

void ReplayLogger::WriterLoop() {
  std::vector<SequencedRecord> batch;
  batch.reserve(options_.max_batch_records);
  uint64_t next_pos = 0;  // position of the next record to pop
  for (;;) {
    while (batch.size() < options_.max_batch_records) {
      SequencedRecord sr;
      if (!queue_.TryPop(&sr.record)) break;
      sr.seq = first_seq_ + next_pos++;
      batch.push_back(std::move(sr));
    }
    if (batch.empty()) {
      // Stop only when closed and every accepted record is popped.
      if (stop_writer_.load(std::memory_order_acquire) && queue_.popped() == queue_.pushed()) {
        return;
      }
      std::unique_lock<std::mutex> lock(mu_);
      writer_idle_.store(true, std::memory_order_release);
      wake_cv_.wait_for(lock, std::chrono::milliseconds(1));
      writer_idle_.store(false, std::memory_order_release);
      continue;
    }
    if (failed_.load(std::memory_order_relaxed)) {
      stats_.records_failed.fetch_add(batch.size(), std::memory_order_relaxed);
    } else {
      uint64_t bytes = 0;
      Status s = buffer_->Write(batch, options_.sync, &bytes);
      if (s.ok()) {
        stats_.records_written.fetch_add(batch.size(), std::memory_order_relaxed);
        stats_.bytes_written.fetch_add(bytes, std::memory_order_relaxed);
        stats_.batches_written.fetch_add(1, std::memory_order_relaxed);
        durable_count_.store(next_pos, std::memory_order_release);
        const uint64_t max_bytes = buffer_->options().max_bytes;
        if (max_bytes > 0 && bytes_since_retention_.fetch_add(bytes) + bytes > max_bytes / 64) {
          retention_cv_.notify_one();
        }
        if (options_.on_durable) options_.on_durable(first_seq_ + next_pos - 1);
      } else {
        stats_.records_failed.fetch_add(batch.size(), std::memory_order_relaxed);
        std::lock_guard<std::mutex> lock(mu_);
        if (status_.ok()) status_ = s.Annotate("replay logger");
        failed_.store(true, std::memory_order_release);
      }
    }
    batch.clear();  // frees the records here, off the serving threads
    std::lock_guard<std::mutex> lock(mu_);
    durable_cv_.notify_all();
  }
}

void ReplayLogger::RetentionLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_writer_.load()) {
    retention_cv_.wait_for(lock, std::chrono::milliseconds(options_.retention_interval_ms));
    if (stop_writer_.load()) break;
    lock.unlock();
    bytes_since_retention_.store(0);
    Status s = buffer_->EnforceRetention(NowMicros());
    stats_.retention_runs.fetch_add(1, std::memory_order_relaxed);
    if (!s.ok()) stats_.retention_errors.fetch_add(1, std::memory_order_relaxed);
    lock.lock();
  }
}

Status ReplayLogger::Flush() {
  const uint64_t target = queue_.pushed();
  std::unique_lock<std::mutex> lock(mu_);
  while (durable_count_.load(std::memory_order_acquire) < target &&
         !failed_.load(std::memory_order_acquire) && writer_.joinable()) {
    wake_cv_.notify_one();
    durable_cv_.wait_for(lock, std::chrono::milliseconds(10));
  }
  return status_;
}

Status ReplayLogger::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

Status ReplayLogger::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (close_done_) return close_status_;
    close_done_ = true;
  }
  closed_.store(true, std::memory_order_release);
  stop_writer_.store(true, std::memory_order_release);
  wake_cv_.notify_all();
  retention_cv_.notify_all();
  if (writer_.joinable()) writer_.join();
  if (retention_.joinable()) retention_.join();
  // A Log() that raced with Close() may have pushed after the writer's last pop.
  const uint64_t stranded = queue_.pushed() - queue_.popped();
  if (stranded > 0) stats_.records_dropped_closed.fetch_add(stranded);
  Status s = buffer_->Flush();
  buffer_.reset();
  std::lock_guard<std::mutex> lock(mu_);
  if (status_.ok() && !s.ok()) status_ = s.Annotate("replay logger close");
  close_status_ = status_;
  return close_status_;
}

}  // namespace specloop
