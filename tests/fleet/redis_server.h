// Helpers of the record-stream tests: a real redis-server on a free loopback port, workers'
// buffers filled with random records, and the shipper's and ingester's options they share.
#pragma once

#include <signal.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "buffer/replay_logger.h"
#include "fleet/record_shipper.h"
#include "fleet/redis_client.h"
#include "fleet/stream_ingester.h"
#include "common/base/rng.h"
#include "tests/buffer/test_util.h"
#include "tests/e2e/e2e_util.h"

namespace specloop {
namespace fleet {

// redis-server on a free loopback port, its data (the append-only file) in a temp directory;
// Kill() and Start() again keep the data.
class RedisServer {
 public:
  RedisServer() : port_(e2e::FreePort()) { Start(); }
  void Start() {
    child_ = std::make_unique<e2e::Child>(
        std::vector<std::string>{"redis-server", "--port", std::to_string(port_), "--bind",
                                 "127.0.0.1", "--dir", dir_.path(), "--appendonly", "yes",
                                 "--appendfsync", "always", "--save", "", "--protected-mode",
                                 "no"},
        /*echo=*/false);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      std::unique_ptr<RedisClient> c;
      RedisReply r;
      if (RedisClient::Connect("127.0.0.1", port_, 1.0, &c).ok() && c->Command({"PING"}, &r).ok() &&
          r.str == "PONG") {
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ADD_FAILURE() << "redis-server did not start:\n" << child_->Output();
  }
  void Kill() {
    child_->Signal(SIGKILL);
    child_->Wait(10);
    child_.reset();
  }
  int port() const { return port_; }
  // A command on a new connection (the test's own view of the stream).
  RedisReply Command(const std::vector<std::string>& argv) {
    std::unique_ptr<RedisClient> c;
    RedisReply r;
    EXPECT_TRUE(RedisClient::Connect("127.0.0.1", port_, 5.0, &c).ok());
    if (c) {
      EXPECT_TRUE(c->Command(argv, &r).ok());
    }
    return r;
  }
  long long StreamLength(const std::string& stream) { return Command({"XLEN", stream}).integer; }
  // Entries ever added to `stream` (XINFO STREAM's entries-added: trimming does not lower it);
  // -1 when the stream does not exist.
  long long EntriesAdded(const std::string& stream) {
    const RedisReply r = Command({"XINFO", "STREAM", stream});
    for (size_t i = 0; i + 1 < r.elements.size(); i += 2) {
      if (r.elements[i].str == "entries-added") return r.elements[i + 1].integer;
    }
    return -1;
  }

 private:
  testing::TempDir dir_;
  int port_;
  std::unique_ptr<e2e::Child> child_;
};

// Logs `n` random records as worker `worker` into the buffer in `dir` (stamped with the time).
inline void LogRecords(const std::string& dir, uint32_t worker, int n, uint64_t seed) {
  std::unique_ptr<ReplayLogger> logger;
  LoggerOptions lo;
  lo.queue_capacity = static_cast<size_t>(n);  // none dropped
  ASSERT_TRUE(ReplayLogger::Open(BufferOptions(), lo, dir, &logger).ok());
  Rng rng(seed);
  for (int i = 0; i < n; ++i) {
    Record r = testing::RandomRecord(&rng);
    r.time_us = 0;
    r.worker_id = worker;
    ASSERT_TRUE(logger->Log(&r));
  }
  ASSERT_TRUE(logger->Close().ok());
}

// A shipper of the buffer in `dir`, as worker `id`, to the redis-server on loopback `port`, in
// batches of 64 records.
inline ShipperOptions Shipping(const std::string& dir, const std::string& id, int port) {
  ShipperOptions o;
  o.buffer_dir = dir;
  o.id = id;
  o.redis_port = port;
  o.batch_records = 64;
  return o;
}

// An ingester from the redis-server on loopback `port` into the buffer in `dir`, reading
// batches of 100 entries.
inline IngesterOptions Ingesting(const std::string& dir, int port) {
  IngesterOptions o;
  o.buffer_dir = dir;
  o.redis_port = port;
  o.batch_entries = 100;
  return o;
}

}  // namespace fleet
}  // namespace specloop
