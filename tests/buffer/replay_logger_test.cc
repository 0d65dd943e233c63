#include "buffer/replay_logger.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>

#include "buffer/keys.h"
#include "buffer/replay_reader.h"
#include "tests/buffer/test_util.h"

namespace specloop {
namespace {

using testing::RandomRecord;
using testing::TempDir;

// Records logged through the async logger and read back (scan, per-key) are identical.
TEST(ReplayLogger, RoundTripThroughRocksDb) {
  TempDir tmp;
  Rng rng(5);
  std::map<uint64_t, Record> expected;  // by seq
  {
    std::unique_ptr<ReplayLogger> logger;
    LoggerOptions lo;
    lo.max_batch_records = 7;
    ASSERT_TRUE(ReplayLogger::Open(BufferOptions(), lo, tmp.path(), &logger).ok());
    EXPECT_EQ(logger->first_seq(), 0u);
    for (int i = 0; i < 500; i++) {
      Record r = RandomRecord(&rng);
      if (i % 5 == 0) r.time_us = 0;  // stamped by Log()
      Record copy = r;
      uint64_t seq = 0;
      ASSERT_TRUE(logger->Log(&r, &seq));
      EXPECT_EQ(seq, static_cast<uint64_t>(i));
      expected[seq] = copy;
      if (i == 250) {
        ASSERT_TRUE(logger->Flush().ok());
        EXPECT_GE(logger->durable_count(), 251u);
      }
    }
    ASSERT_TRUE(logger->Flush().ok());
    EXPECT_EQ(logger->durable_seq(), 499u);
    EXPECT_EQ(logger->stats().records_written.load(), 500u);
    EXPECT_EQ(logger->stats().records_dropped(), 0u);
    EXPECT_EQ(logger->queue_depth(), 0u);
    ASSERT_TRUE(logger->Close().ok());
  }
  // Read back through a primary (keys) and a reader (scan).
  std::unique_ptr<ReplayBuffer> buf;
  ASSERT_TRUE(ReplayBuffer::Open(BufferOptions(), tmp.path(), &buf).ok());
  EXPECT_EQ(buf->next_seq(), 500u);  // continues numbering after the largest seq... of the
                                     // newest record
  buf.reset();
  std::unique_ptr<ReplayReader> reader;
  ASSERT_TRUE(ReplayReader::Open(ReaderOptions(), {tmp.path()}, &reader).ok());
  size_t n = 0;
  uint64_t last_time = 0;
  ASSERT_TRUE(reader
                  ->Scan(ScanOptions(),
                         [&](size_t, const Record& r) {
                           EXPECT_GE(r.time_us, last_time);
                           last_time = r.time_us;
                           bool found = false;
                           for (auto& [seq, e] : expected) {
                             Record stamped = e;
                             if (stamped.time_us == 0) stamped.time_us = r.time_us;
                             if (stamped == r) {
                               found = true;
                               expected.erase(seq);
                               break;
                             }
                           }
                           EXPECT_TRUE(found) << "unexpected record " << r.request_id;
                           n++;
                           return true;
                         })
                  .ok());
  EXPECT_EQ(n, 500u);
  EXPECT_TRUE(expected.empty());
}

TEST(ReplayLogger, SeqContinuesAcrossReopenAndInvalidRecordsAreDropped) {
  TempDir tmp;
  Rng rng(9);
  for (int round = 0; round < 2; round++) {
    std::unique_ptr<ReplayLogger> logger;
    ASSERT_TRUE(ReplayLogger::Open(BufferOptions(), LoggerOptions(), tmp.path(), &logger).ok());
    EXPECT_EQ(logger->first_seq(), round * 10u);
    for (int i = 0; i < 10; i++) {
      Record r = RandomRecord(&rng);
      r.time_us = 1000 * (round * 10 + i + 1);
      ASSERT_TRUE(logger->Log(&r));
    }
    Record bad = RandomRecord(&rng);
    bad.prompt_len = static_cast<uint32_t>(bad.tokens.size()) + 1;
    EXPECT_FALSE(logger->Log(&bad));
    EXPECT_EQ(logger->stats().records_dropped_invalid.load(), 1u);
    ASSERT_TRUE(logger->Close().ok());
    Record late = RandomRecord(&rng);
    EXPECT_FALSE(logger->Log(&late));  // closed
    EXPECT_EQ(logger->stats().records_dropped_closed.load(), 1u);
  }
}

// A full queue drops (and counts) instead of blocking; every accepted record is written.
TEST(ReplayLogger, FullQueueDropsWithoutBlocking) {
  TempDir tmp;
  Rng rng(2);
  testing::Shape big;
  big.max_steps = 60;
  big.max_top_k = 64;
  std::vector<Record> pool;
  for (int i = 0; i < 64; i++) pool.push_back(RandomRecord(&rng, big));
  std::unique_ptr<ReplayLogger> logger;
  LoggerOptions lo;
  lo.queue_capacity = 8;
  lo.max_batch_records = 2;
  ASSERT_TRUE(ReplayLogger::Open(BufferOptions(), lo, tmp.path(), &logger).ok());
  uint64_t accepted = 0, dropped = 0;
  double max_us = 0;
  for (int i = 0; i < 4000; i++) {
    Record r = pool[i % pool.size()];
    const auto t0 = std::chrono::steady_clock::now();
    const bool ok = logger->Log(&r);
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    max_us = std::max(max_us, us);
    (ok ? accepted : dropped)++;
  }
  EXPECT_GT(dropped, 0u);
  EXPECT_EQ(logger->stats().records_dropped_full.load(), dropped);
  ASSERT_TRUE(logger->Flush().ok());
  EXPECT_EQ(logger->stats().records_written.load(), accepted);
  EXPECT_EQ(logger->durable_count(), accepted);
  RecordProperty("max_log_us", std::to_string(max_us));
}

TEST(ReplayLogger, OnDurableReportsTheWatermark) {
  TempDir tmp;
  Rng rng(4);
  std::atomic<uint64_t> last{0}, calls{0};
  LoggerOptions lo;
  lo.on_durable = [&](uint64_t seq) {
    EXPECT_GE(seq + 1, last.load());
    last = seq + 1;
    calls++;
  };
  std::unique_ptr<ReplayLogger> logger;
  ASSERT_TRUE(ReplayLogger::Open(BufferOptions(), lo, tmp.path(), &logger).ok());
  for (int i = 0; i < 100; i++) {
    Record r = RandomRecord(&rng);
    ASSERT_TRUE(logger->Log(&r));
  }
  ASSERT_TRUE(logger->Flush().ok());
  EXPECT_EQ(last.load(), 100u);
  EXPECT_GE(calls.load(), 1u);
}

TEST(ReplayBuffer, SecondPrimaryOnSameDirFails) {
  TempDir tmp;
  std::unique_ptr<ReplayBuffer> a, b;
  ASSERT_TRUE(ReplayBuffer::Open(BufferOptions(), tmp.path(), &a).ok());
  Status s = ReplayBuffer::Open(BufferOptions(), tmp.path(), &b);
  EXPECT_TRUE(s.IsIOError()) << s.ToString();
}

// MemoryUsage() sees unflushed writes in the memtables and their release by a flush; the
// default memtable is small enough to bound a worker's memory (it is held twice: by the
// writer and by every trainer secondary replaying the WAL).
TEST(ReplayBuffer, MemoryUsageTracksMemtables) {
  EXPECT_LE(BufferOptions().write_buffer_size, 16ull << 20);
  TempDir tmp;
  std::unique_ptr<ReplayBuffer> buf;
  ASSERT_TRUE(ReplayBuffer::Open(BufferOptions(), tmp.path(), &buf).ok());
  const BufferMemory empty = buf->MemoryUsage();
  Rng rng(11);
  std::vector<SequencedRecord> batch;
  for (uint64_t i = 0; i < 200; ++i) batch.push_back({i, RandomRecord(&rng)});
  uint64_t bytes = 0;
  ASSERT_TRUE(buf->Write(batch, false, &bytes).ok());
  const BufferMemory written = buf->MemoryUsage();
  EXPECT_GE(written.memtables, empty.memtables + bytes / 2);
  ASSERT_TRUE(buf->Flush().ok());
  EXPECT_LT(buf->MemoryUsage().memtables, written.memtables / 4);
}

}  // namespace
}  // namespace specloop
