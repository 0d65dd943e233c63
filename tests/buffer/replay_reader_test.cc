#include "buffer/replay_reader.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string_view>
#include <thread>
#include <tuple>

#include "buffer/keys.h"
#include "buffer/replay_logger.h"
#include "tests/buffer/test_util.h"

namespace specloop {
namespace {

using testing::RandomRecord;
using testing::TempDir;

const char* kDomains[] = {"prose", "python", "c"};

// Writes n records with time_us = t0 + i, domain kDomains[i % 3], request_id "<tag><i>".
void WriteRecords(ReplayLogger* logger, int n, uint64_t t0, const std::string& tag,
                  uint32_t worker = 0) {
  Rng rng(t0);
  testing::Shape small;
  small.max_steps = 3;
  for (int i = 0; i < n; i++) {
    Record r = RandomRecord(&rng, small);
    r.time_us = t0 + i;
    r.domain = kDomains[i % 3];
    r.request_id = tag + std::to_string(i);
    r.worker_id = worker;
    ASSERT_TRUE(logger->Log(&r));
  }
  ASSERT_TRUE(logger->Flush().ok());
}

std::unique_ptr<ReplayLogger> OpenLogger(const std::string& dir) {
  std::unique_ptr<ReplayLogger> logger;
  LoggerOptions lo;
  lo.retention_interval_ms = 0;
  EXPECT_TRUE(ReplayLogger::Open(BufferOptions(), lo, dir, &logger).ok());
  return logger;
}

// The RocksDB secondary pattern: primary writes, secondary opens, primary writes more,
// the secondary sees the new records after CatchUp() (memtable/WAL data and flushed files).
TEST(ReplayReader, SecondarySeesRecordsWrittenAfterItOpened) {
  TempDir tmp;
  auto logger = OpenLogger(tmp.path());
  WriteRecords(logger.get(), 30, 1000, "a");
  std::unique_ptr<ReplayReader> reader;
  ASSERT_TRUE(ReplayReader::Open(ReaderOptions(), {tmp.path()}, &reader).ok());
  EXPECT_EQ(reader->num_records(), 30u);

  WriteRecords(logger.get(), 20, 5000, "b");  // still in the primary's memtable and WAL
  EXPECT_EQ(reader->num_records(), 30u);      // not yet caught up
  ASSERT_TRUE(reader->CatchUp().ok());
  EXPECT_EQ(reader->num_records(), 50u);
  ASSERT_TRUE(logger->buffer()->Flush().ok());  // now in SST files
  WriteRecords(logger.get(), 10, 9000, "c");
  ASSERT_TRUE(reader->CatchUp().ok());
  EXPECT_EQ(reader->num_records(), 60u);
  std::vector<std::string> ids;
  ScanOptions so;
  so.since_us = 5000;
  ASSERT_TRUE(reader->Scan(so, [&](size_t, const Record& r) {
                      ids.push_back(r.request_id);
                      return true;
                    }).ok());
  ASSERT_EQ(ids.size(), 30u);
  EXPECT_EQ(ids.front(), "b0");
  EXPECT_EQ(ids.back(), "c9");
}

TEST(ReplayReader, BackgroundCatchUpFollowsThePrimary) {
  TempDir tmp;
  auto logger = OpenLogger(tmp.path());
  WriteRecords(logger.get(), 5, 1000, "a");
  ReaderOptions ro;
  ro.catch_up_interval_ms = 20;
  std::unique_ptr<ReplayReader> reader;
  ASSERT_TRUE(ReplayReader::Open(ro, {tmp.path()}, &reader).ok());
  WriteRecords(logger.get(), 7, 2000, "b");
  for (int i = 0; i < 200 && reader->num_records() < 12; i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(reader->num_records(), 12u);
}

// Time-range and domain scans return exactly the matching records, in time order, and decode
// only those (no full scan).
TEST(ReplayReader, ScansByTimeRangeAndDomainAcrossDirectories) {
  TempDir tmp;
  auto l1 = OpenLogger(tmp.Sub("w1"));
  auto l2 = OpenLogger(tmp.Sub("w2"));
  WriteRecords(l1.get(), 300, 10000, "x", 1);  // times 10000..10299
  WriteRecords(l2.get(), 300, 10150, "y", 2);  // times 10150..10449
  std::unique_ptr<ReplayReader> reader;
  ASSERT_TRUE(ReplayReader::Open(ReaderOptions(), {tmp.Sub("w1"), tmp.Sub("w2")}, &reader).ok());
  EXPECT_EQ(reader->num_records(), 600u);
  EXPECT_EQ(reader->DomainCounts().at("python"), 200u);

  for (const char* domain : {"", "python"}) {
    ScanOptions so;
    so.since_us = 10200;
    so.until_us = 10260;
    if (*domain) so.domain = domain;
    std::vector<Record> got;
    const uint64_t decoded0 = reader->records_decoded();
    ASSERT_TRUE(reader->Scan(so, [&](size_t dir, const Record& r) {
                        EXPECT_EQ(dir, r.worker_id - 1);
                        got.push_back(r);
                        return true;
                      }).ok());
    // Expected: both dirs' records with time in [10200, 10260) and the domain.
    size_t expect = 0;
    for (int w = 0; w < 2; w++) {
      const uint64_t t0 = w == 0 ? 10000 : 10150;
      for (int i = 0; i < 300; i++) {
        const uint64_t t = t0 + i;
        if (t >= 10200 && t < 10260 && (!*domain || std::string(kDomains[i % 3]) == domain)) {
          expect++;
        }
      }
    }
    EXPECT_EQ(got.size(), expect) << domain;
    EXPECT_EQ(reader->records_decoded() - decoded0, expect) << "decoded more than returned";
    for (size_t i = 1; i < got.size(); i++) EXPECT_LE(got[i - 1].time_us, got[i].time_us);
    for (const Record& r : got) {
      EXPECT_GE(r.time_us, 10200u);
      EXPECT_LT(r.time_us, 10260u);
      if (*domain) {
        EXPECT_EQ(r.domain, domain);
      }
    }
  }
  // Stopping early.
  int n = 0;
  ASSERT_TRUE(reader->Scan(ScanOptions(), [&](size_t, const Record&) { return ++n < 5; }).ok());
  EXPECT_EQ(n, 5);
  // A domain that does not exist.
  ScanOptions none;
  none.domain = "nope";
  n = 0;
  ASSERT_TRUE(reader->Scan(none, [&](size_t, const Record&) { return ++n > 0; }).ok());
  EXPECT_EQ(n, 0);
}

// A held-out set kept by key (the trainer's): each key ScanKeyed() passes reads back the record
// it came with, in both scan modes and across directories; a key that names nothing (retention
// took it, or never written) is NotFound; a bad directory index is refused.
TEST(ReplayReader, KeysFromAScanReadBackTheirRecords) {
  TempDir tmp;
  auto l1 = OpenLogger(tmp.Sub("w1"));
  auto l2 = OpenLogger(tmp.Sub("w2"));
  WriteRecords(l1.get(), 40, 10000, "x", 1);
  WriteRecords(l2.get(), 40, 10020, "y", 2);
  std::unique_ptr<ReplayReader> reader;
  ASSERT_TRUE(ReplayReader::Open(ReaderOptions(), {tmp.Sub("w1"), tmp.Sub("w2")}, &reader).ok());
  for (const char* domain : {"", "c"}) {
    ScanOptions so;
    if (*domain) so.domain = domain;
    std::vector<std::tuple<size_t, std::string, Record>> seen;
    ASSERT_TRUE(reader->ScanKeyed(so, [&](size_t dir, std::string_view key, const Record& r) {
                        seen.emplace_back(dir, std::string(key), r);
                        return true;
                      }).ok());
    ASSERT_EQ(seen.size(), *domain ? 26u : 80u) << domain;
    for (const auto& [dir, key, want] : seen) {
      Record got;
      ASSERT_TRUE(reader->Read(dir, key, &got).ok());
      EXPECT_EQ(got, want);
    }
  }
  Record r;
  EXPECT_TRUE(reader->Read(0, RecordKey(99999, 1, 0), &r).IsNotFound());
  EXPECT_TRUE(reader->Read(2, RecordKey(10000, 1, 0), &r).IsInvalidArgument());
}

TEST(ReplayReader, SamplingFollowsDomainWeightsAndRecency) {
  TempDir tmp;
  auto logger = OpenLogger(tmp.path());
  // 3000 records, 1000 per domain, one second apart.
  Rng rng(1);
  testing::Shape tiny;
  tiny.max_steps = 1;
  tiny.max_top_k = 2;
  for (int i = 0; i < 3000; i++) {
    Record r = RandomRecord(&rng, tiny);
    r.time_us = 1000000ull * (i + 1);
    r.domain = kDomains[i % 3];
    ASSERT_TRUE(logger->Log(&r));
  }
  ASSERT_TRUE(logger->Flush().ok());
  std::unique_ptr<ReplayReader> reader;
  ASSERT_TRUE(ReplayReader::Open(ReaderOptions(), {tmp.path()}, &reader).ok());

  SampleOptions so;
  so.batch_size = 3000;
  so.domain_weights = {{"prose", 3.0}, {"python", 1.0}, {"c", 0.0}};
  Rng srng(123);
  std::vector<Record> batch;
  ASSERT_TRUE(reader->Sample(so, &srng, &batch).ok());
  ASSERT_EQ(batch.size(), 3000u);
  std::map<std::string, int> count;
  for (const Record& r : batch) count[r.domain]++;
  EXPECT_EQ(count["c"], 0);
  // prose ~ 2250, python ~ 750 (binomial sd ~ 24): 5 sd bounds.
  EXPECT_NEAR(count["prose"], 2250, 120);
  EXPECT_NEAR(count["python"], 750, 120);

  // Recency: a half-life of 100 s over records 3 s apart per domain: the newest 100 s of a
  // domain's records carry about half the weight.
  so.domain_weights = {};
  so.half_life_seconds = 100;
  ASSERT_TRUE(reader->Sample(so, &srng, &batch).ok());
  int recent = 0;
  for (const Record& r : batch) recent += r.time_us > 2900ull * 1000000;
  EXPECT_NEAR(recent, 1500, 150);

  // Same seed, same batch.
  Rng a(7), b(7);
  std::vector<Record> ba, bb;
  so.batch_size = 50;
  ASSERT_TRUE(reader->Sample(so, &a, &ba).ok());
  ASSERT_TRUE(reader->Sample(so, &b, &bb).ok());
  EXPECT_EQ(ba, bb);

  so.domain_weights = {{"prose", 0}, {"python", 0}, {"c", 0}};
  EXPECT_TRUE(reader->Sample(so, &a, &ba).IsNotFound());
}

TEST(ReplayReader, OpenFailsOnMissingDirectory) {
  TempDir tmp;
  std::unique_ptr<ReplayReader> reader;
  EXPECT_TRUE(ReplayReader::Open(ReaderOptions(), {tmp.Sub("none")}, &reader).IsNotFound());
}

}  // namespace
}  // namespace specloop
