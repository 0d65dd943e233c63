#include "fleet/stream_ingester.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "buffer/keys.h"
#include "buffer/record_codec.h"
#include "fleet/stream_trim.h"

namespace specloop {

Status StreamIngester::Open(const IngesterOptions& options,
                            std::unique_ptr<StreamIngester>* ingester) {
  if (options.buffer_dir.empty() || options.stream.empty() || options.group.empty() ||
      options.consumer.empty() || options.batch_entries == 0) {
    return Status::InvalidArgument("ingester: buffer_dir, stream, group, consumer and a batch "
                                   "size are required");
  }
  std::unique_ptr<StreamIngester> in(new StreamIngester(options));
  Status s = ReplayBuffer::Open(options.buffer, options.buffer_dir, &in->buffer_);
  if (!s.ok()) return s;
  s = in->Connect();
  if (!s.ok()) return s;
  *ingester = std::move(in);
  return Status::OK();
}

Status StreamIngester::Connect() {
  redis_.reset();
  pending_done_ = false;
  std::unique_ptr<RedisClient> c;
  Status s = RedisClient::Connect(options_.redis_host, options_.redis_port,
                                  options_.timeout_seconds, &c);
  if (!s.ok()) return s;
  RedisReply r;
  s = c->Command({"XGROUP", "CREATE", options_.stream, options_.group, "0", "MKSTREAM"}, &r);
  if (!s.ok()) return s;
  if (r.type == RedisReply::Type::kError && r.str.rfind("BUSYGROUP", 0) != 0) {
    return Status::IOError("ingester: XGROUP CREATE: " + r.str);
  }
  redis_ = std::move(c);
  return Status::OK();
}

Status StreamIngester::IngestOnce(uint64_t* ingested) {
  if (ingested) *ingested = 0;
  Status s = redis_ ? Status::OK() : Connect();
  if (!s.ok()) {
    stats_.errors++;
    return s;
  }
  // Own pending entries ("0") until none is left, then new ones (">").
  std::vector<std::string> argv = {"XREADGROUP", "GROUP", options_.group, options_.consumer,
                                   "COUNT", std::to_string(options_.batch_entries)};
  if (pending_done_) argv.insert(argv.end(), {"BLOCK", std::to_string(options_.block_ms)});
  argv.insert(argv.end(), {"STREAMS", options_.stream, pending_done_ ? ">" : "0"});
  RedisReply r;
  s = redis_->Command(argv, &r);
  if (s.ok() && r.type == RedisReply::Type::kError) {
    s = Status::IOError("ingester: XREADGROUP: " + r.str);
  }
  if (!s.ok()) {
    stats_.errors++;
    redis_.reset();
    return s;
  }
  // [[stream, [[id, [field, value, ...] or nil], ...]]], or nil when the wait timed out.
  const RedisReply* entries = nullptr;
  if (r.type == RedisReply::Type::kArray && !r.elements.empty() &&
      r.elements[0].elements.size() == 2) {
    entries = &r.elements[0].elements[1];
  }
  if (entries == nullptr || entries->elements.empty()) {
    pending_done_ = true;
    return MaybeTrim();
  }
  std::vector<SequencedRecord> records;
  std::vector<std::string> ack = {"XACK", options_.stream, options_.group};
  uint64_t corrupt = 0, missing = 0;
  for (const RedisReply& e : entries->elements) {
    if (e.elements.size() != 2) continue;
    ack.push_back(e.elements[0].str);
    const RedisReply& fields = e.elements[1];  // nil: trimmed from the stream meanwhile
    if (fields.type == RedisReply::Type::kNil) {
      ++missing;
      continue;
    }
    const std::string *key = nullptr, *data = nullptr;
    for (size_t i = 0; i + 1 < fields.elements.size(); i += 2) {
      if (fields.elements[i].str == "key") key = &fields.elements[i + 1].str;
      if (fields.elements[i].str == "record") data = &fields.elements[i + 1].str;
    }
    SequencedRecord sr;
    uint64_t time_us;
    uint32_t worker;
    if (key == nullptr || data == nullptr || !ParseRecordKey(*key, &time_us, &worker, &sr.seq) ||
        !DecodeRecord(*data, &sr.record).ok() || sr.record.time_us != time_us ||
        sr.record.worker_id != worker || !ValidateRecord(sr.record).empty()) {
      ++corrupt;
      continue;
    }
    records.push_back(std::move(sr));
  }
  if (!records.empty()) {
    s = buffer_->Write(records, /*sync=*/true);
    if (!s.ok()) {  // nothing acknowledged: the entries stay pending for the next read
      stats_.errors++;
      redis_.reset();
      return s;
    }
    stats_.records += records.size();
    if (ingested) *ingested = records.size();
  }
  stats_.corrupt += corrupt;
  stats_.missing += missing;
  s = redis_->Command(ack, &r);
  if (s.ok() && r.type == RedisReply::Type::kError) s = Status::IOError("ingester: XACK: " + r.str);
  if (!s.ok()) {  // written, perhaps not acknowledged: then delivered and written again
    stats_.errors++;
    redis_.reset();
    return s;
  }
  return MaybeTrim();
}

Status StreamIngester::MaybeTrim() {
  if (options_.trim_seconds <= 0 || redis_ == nullptr) return Status::OK();
  const auto now = std::chrono::steady_clock::now();
  if (now - last_trim_ < std::chrono::duration<double>(options_.trim_seconds)) {
    return Status::OK();
  }
  last_trim_ = now;
  StreamTrimResult t;
  Status s = TrimStream(redis_.get(), options_.stream, /*max_length=*/0, options_.group, &t);
  if (!s.ok()) {
    stats_.errors++;
    redis_.reset();
    return s;
  }
  stats_.trimmed += t.acknowledged_trimmed;
  stats_.stream_length = t.length;
  stats_.lag_entries = t.group_unacknowledged;
  stats_.oldest_unacknowledged_ms = t.group_has_needed ? t.group_oldest_needed.ms : 0;
  return Status::OK();
}

void StreamIngester::Run(const std::atomic<bool>& stop) {
  double backoff = 0.05;
  while (!stop.load()) {
    if (IngestOnce().ok()) {
      backoff = 0.05;
      continue;
    }
    backoff = std::min(options_.max_backoff_seconds, backoff * 2);
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(backoff);
    while (!stop.load() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

}  // namespace specloop
