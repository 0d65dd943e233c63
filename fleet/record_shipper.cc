#include "fleet/record_shipper.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "buffer/keys.h"
#include "common/base/clock.h"
#include "fleet/stream_trim.h"

namespace specloop {

Status RecordShipper::Open(const ShipperOptions& options,
                           std::unique_ptr<RecordShipper>* shipper) {
  if (options.buffer_dir.empty() || options.id.empty() || options.stream.empty()) {
    return Status::InvalidArgument("shipper: buffer_dir, id and stream are required");
  }
  if (options.batch_records == 0) return Status::InvalidArgument("shipper: batch_records is 0");
  std::unique_ptr<RecordShipper> s(new RecordShipper(options));
  Status st = ReplayReader::Open(ReaderOptions(), {options.buffer_dir}, &s->reader_);
  if (!st.ok()) return st;
  st = s->Connect();
  if (!st.ok()) return st;
  *shipper = std::move(s);
  return Status::OK();
}

Status RecordShipper::Connect() {
  redis_.reset();
  std::unique_ptr<RedisClient> c;
  Status s = RedisClient::Connect(options_.redis_host, options_.redis_port,
                                  options_.timeout_seconds, &c);
  if (!s.ok()) return s;
  RedisReply r;
  s = c->Command({"GET", position_key()}, &r);
  if (!s.ok()) return s;
  if (r.type == RedisReply::Type::kString) {
    long long seq = -1;
    unsigned long long time_us = 0;
    if (std::sscanf(r.str.c_str(), "%lld %llu", &seq, &time_us) != 2) {
      return Status::Corruption("shipper: bad position '" + r.str + "' at " + position_key());
    }
    pos_seq_ = seq;
    pos_time_us_ = time_us;
  } else if (r.type == RedisReply::Type::kNil) {
    pos_seq_ = -1;
    pos_time_us_ = 0;
  } else {
    return Status::IOError("shipper: GET " + position_key() + ": " + r.str);
  }
  redis_ = std::move(c);
  return Status::OK();
}

Status RecordShipper::ShipBatch(bool slack, uint64_t* shipped) {
  *shipped = 0;
  // Candidates: records after the position, in key (time) order, up to a batch.
  struct Candidate {
    uint64_t seq, time_us;
    std::string key, encoded;
  };
  std::vector<Candidate> batch;
  size_t batch_bytes = 0;
  ScanOptions scan;
  const uint64_t back = slack ? options_.resume_slack_us : 0;
  scan.since_us = pos_time_us_ > back ? pos_time_us_ - back : 0;
  // Records go as stored: the ingester checks and decodes them.
  Status s = reader_->ScanEncoded(scan, [&](size_t, std::string_view key, std::string_view data) {
    uint64_t time_us, seq;
    uint32_t worker;
    if (!ParseRecordKey(key, &time_us, &worker, &seq)) return true;
    if (static_cast<int64_t>(seq) <= pos_seq_) return true;
    batch.push_back({seq, time_us, std::string(key), std::string(data)});
    batch_bytes += data.size();
    return batch.size() < options_.batch_records && batch_bytes < options_.batch_bytes;
  });
  if (!s.ok()) return s;
  if (batch.empty()) return Status::OK();
  // Ship in seq order, up to the first gap after the first: a record of a seq in the gap may
  // lie later in key order (the clock stepped back) and comes with the next batch.
  std::sort(batch.begin(), batch.end(),
            [](const Candidate& a, const Candidate& b) { return a.seq < b.seq; });
  size_t n = 1;
  while (n < batch.size() && batch[n].seq == batch[n - 1].seq + 1) ++n;
  batch.resize(n);

  std::vector<std::vector<std::string>> commands;
  commands.push_back({"MULTI"});
  uint64_t bytes = 0;
  for (const Candidate& c : batch) {
    commands.push_back({"XADD", options_.stream, "*", "key", c.key, "record", c.encoded});
    bytes += c.encoded.size();
  }
  const Candidate& last = batch.back();
  commands.push_back({"SET", position_key(),
                      std::to_string(last.seq) + " " + std::to_string(last.time_us)});
  commands.push_back({"EXEC"});
  std::vector<RedisReply> replies;
  s = redis_->Pipeline(commands, &replies);
  if (!s.ok()) return s;
  const RedisReply& exec = replies.back();
  if (exec.type != RedisReply::Type::kArray || exec.elements.size() != commands.size() - 2) {
    return Status::IOError("shipper: transaction failed: " +
                           (exec.type == RedisReply::Type::kError ? exec.str : "no EXEC result"));
  }
  for (const RedisReply& r : exec.elements) {
    if (r.type == RedisReply::Type::kError) return Status::IOError("shipper: " + r.str);
  }
  pos_seq_ = static_cast<int64_t>(last.seq);
  pos_time_us_ = last.time_us;
  *shipped = batch.size();
  stats_.records += batch.size();
  stats_.bytes += bytes;
  stats_.batches++;
  return Status::OK();
}

Status RecordShipper::ShipOnce(uint64_t* shipped) {
  uint64_t total = 0;
  if (shipped) *shipped = 0;
  Status s = redis_ ? Status::OK() : Connect();
  if (s.ok()) s = reader_->CatchUp();
  for (bool first = true; s.ok(); first = false) {
    uint64_t n = 0;
    s = ShipBatch(/*slack=*/first, &n);
    total += n;
    if (n == 0) {
      stats_.caught_up_us = NowMicros();
      break;
    }
  }
  if (s.ok() && total > 0 && options_.max_stream_length > 0) {
    StreamTrimResult t;
    s = TrimStream(redis_.get(), options_.stream, options_.max_stream_length, "", &t);
    if (s.ok()) {
      stats_.dropped += t.dropped;
      stats_.stream_length = t.length;
    }
  }
  if (shipped) *shipped = total;
  if (!s.ok()) {
    stats_.errors++;
    redis_.reset();  // reconnect, and reload the position, next time
  }
  return s;
}

void RecordShipper::Run(const std::atomic<bool>& stop) {
  double backoff = options_.poll_seconds;
  while (!stop.load()) {
    uint64_t n = 0;
    const Status s = ShipOnce(&n);
    double pause = options_.poll_seconds;
    if (!s.ok()) {
      backoff = std::min(options_.max_backoff_seconds, backoff * 2);
      pause = backoff;
    } else {
      backoff = options_.poll_seconds;
      if (n > 0) continue;
    }
    // Sleep in short slices so that `stop` is seen promptly.
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(pause);
    while (!stop.load() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

}  // namespace specloop
