// Records through a Redis stream (label fleet): workers' local buffers shipped by
// RecordShipper, the trainer's buffer filled by StreamIngester, against a real redis-server
// started on a free loopback port (append-only file, fsync on every write). Killing the shipper
// (the real `specloop buffer ship` process, SIGKILL at random moments), the log server or a
// consumer before its acknowledgement loses no record and duplicates none in the trainer's
// buffer.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "buffer/record_codec.h"
#include "buffer/replay_logger.h"
#include "buffer/replay_reader.h"
#include "common/base/rng.h"
#include "fleet/record_shipper.h"
#include "fleet/stream_ingester.h"
#include "tests/buffer/test_util.h"
#include "tests/e2e/e2e_util.h"
#include "tests/fleet/fleet_util.h"
#include "tests/fleet/redis_server.h"

namespace specloop {
namespace {

using e2e::Child;
using fleet::Contents;
using fleet::Ingesting;
using fleet::LogRecords;
using fleet::RedisServer;
using fleet::Shipping;
using Clock = std::chrono::steady_clock;

// Ingests until the ingester has written `want` records in all (or 60 s pass).
void IngestUntil(StreamIngester* in, uint64_t want) {
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (in->stats().records.load() < want && Clock::now() < deadline) {
    (void)in->IngestOnce();
  }
  EXPECT_EQ(in->stats().records.load(), want);
}

TEST(RecordStream, RecordsOfThreeWorkersReachTheTrainersBufferOnceEach) {
  RedisServer redis;
  testing::TempDir w[3], trainer;
  std::vector<std::string> workers;
  for (auto& d : w) workers.push_back(d.path());
  std::unique_ptr<StreamIngester> ingester;
  ASSERT_TRUE(StreamIngester::Open(Ingesting(trainer.path(), redis.port()), &ingester).ok());
  // Two rounds: shippers start from nothing, then follow what their workers logged since.
  for (int round = 0; round < 2; ++round) {
    for (uint32_t i = 0; i < 3; ++i) LogRecords(workers[i], i + 1, 150, 10 * round + i);
    for (uint32_t i = 0; i < 3; ++i) {
      std::unique_ptr<RecordShipper> shipper;
      ASSERT_TRUE(
          RecordShipper::Open(Shipping(workers[i], "w" + std::to_string(i), redis.port()),
                              &shipper)
              .ok());
      EXPECT_EQ(shipper->position_seq(), round == 0 ? -1 : 149);
      uint64_t shipped = 0;
      ASSERT_TRUE(shipper->ShipOnce(&shipped).ok());
      EXPECT_EQ(shipped, 150u);
      EXPECT_EQ(shipper->position_seq(), 150 * round + 149);
    }
    IngestUntil(ingester.get(), 450u * (round + 1));
  }
  EXPECT_EQ(redis.EntriesAdded("specloop:records"), 900);  // once each (trimming may follow)
  EXPECT_EQ(ingester->stats().corrupt.load(), 0u);
  ingester.reset();
  const auto want = Contents(workers);
  ASSERT_EQ(want.size(), 900u);
  EXPECT_TRUE(Contents({trainer.path()}) == want);
}

// `specloop buffer ship` SIGKILLed six times at random moments (5-65 ms after it starts) while it works through a backlog:
// after the last restart the stream holds every record exactly once.
TEST(RecordStream, AShipperKilledAtRandomMomentsShipsEveryRecordExactlyOnce) {
  RedisServer redis;
  testing::TempDir worker;
  constexpr int kRecords = 30000;
  LogRecords(worker.path(), 7, kRecords, 99);
  const std::vector<std::string> argv = {SPECLOOP_BINARY, "buffer", "ship", worker.path(),
                                         "--redis", "127.0.0.1:" + std::to_string(redis.port()),
                                         "--id", "w7"};
  Rng rng(5);
  long long before = 0;
  int kills_midway = 0;
  for (int i = 0; i < 6; ++i) {
    Child ship(argv, /*echo=*/false);
    ASSERT_NE(ship.WaitForLine("specloop buffer ship: ", 30), "") << ship.Output();
    std::this_thread::sleep_for(std::chrono::milliseconds(5 + testing::Below(&rng, 60)));
    ship.Signal(SIGKILL);
    ship.Wait(10);
    const long long len = redis.StreamLength("specloop:records");
    if (len > before && len < kRecords) ++kills_midway;
    std::printf("kill %d: %lld records in the stream\n", i, len);
    before = len;
  }
  EXPECT_GE(kills_midway, 2) << "the kills should land while records are being shipped";
  Child ship(argv, /*echo=*/false);
  ASSERT_NE(ship.WaitForLine("specloop buffer ship: ", 30), "") << ship.Output();
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  while (redis.StreamLength("specloop:records") < kRecords && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ship.Signal(SIGTERM);
  ASSERT_NE(ship.WaitForLine("shipped \\d+ records", 30), "") << ship.Output();
  EXPECT_EQ(redis.StreamLength("specloop:records"), kRecords);

  // The stream's keys are the buffer's, once each.
  const RedisReply all = redis.Command({"XRANGE", "specloop:records", "-", "+"});
  std::map<std::string, int> seen;
  for (const RedisReply& e : all.elements) seen[e.elements[1].elements[1].str]++;
  const auto want = Contents({worker.path()});
  ASSERT_EQ(seen.size(), want.size());
  for (const auto& [key, bytes] : want) EXPECT_EQ(seen[key], 1);
}

// The log server SIGKILLed twice and restarted from its append-only file while a shipper and
// an ingester run on their own threads: every record reaches the trainer's buffer, and the
// stream holds each once (a transaction is in the file whole or not at all).
TEST(RecordStream, KillingTheLogServerLosesNothingAcknowledged) {
  RedisServer redis;
  testing::TempDir worker, trainer;
  constexpr int kRecords = 6000;
  LogRecords(worker.path(), 3, kRecords, 17);
  std::unique_ptr<RecordShipper> shipper;
  std::unique_ptr<StreamIngester> ingester;
  ShipperOptions so = Shipping(worker.path(), "w3", redis.port());
  so.max_backoff_seconds = 0.2;
  IngesterOptions io = Ingesting(trainer.path(), redis.port());
  io.max_backoff_seconds = 0.2;
  io.trim_seconds = 0;  // the stream is checked below to hold each record once
  ASSERT_TRUE(RecordShipper::Open(so, &shipper).ok());
  ASSERT_TRUE(StreamIngester::Open(io, &ingester).ok());
  std::atomic<bool> stop{false};
  std::thread ship([&] { shipper->Run(stop); });
  std::thread ingest([&] { ingester->Run(stop); });
  int kills_midway = 0;
  for (int i = 0; i < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    if (ingester->stats().records.load() < kRecords) ++kills_midway;
    redis.Kill();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    redis.Start();
  }
  // Until the trainer's buffer holds the worker's (read beside the running ingester); a count
  // would not do: a batch delivered again after a lost acknowledgement counts twice.
  const auto want = Contents({worker.path()});
  ASSERT_EQ(want.size(), static_cast<size_t>(kRecords));
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  bool complete = false;
  while (!complete && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    complete = ingester->stats().records.load() >= kRecords && Contents({trainer.path()}) == want;
  }
  stop = true;
  ship.join();
  ingest.join();
  EXPECT_TRUE(complete) << "the trainer's buffer never held every record";
  EXPECT_GE(kills_midway, 1) << "a kill should land while records flow";
  EXPECT_GT(shipper->stats().errors.load() + ingester->stats().errors.load(), 0u);
  EXPECT_EQ(redis.StreamLength("specloop:records"), kRecords);
  ingester.reset();
  EXPECT_TRUE(Contents({trainer.path()}) == want);
}

// A consumer that took entries and died before acknowledging them: the next ingester of that
// name re-reads them first. An entry that is not a record is counted, acknowledged and skipped.
TEST(RecordStream, EntriesTakenButNotAcknowledgedAreIngestedByTheNextConsumer) {
  RedisServer redis;
  testing::TempDir worker, trainer;
  LogRecords(worker.path(), 1, 100, 23);
  std::unique_ptr<RecordShipper> shipper;
  ASSERT_TRUE(RecordShipper::Open(Shipping(worker.path(), "w1", redis.port()), &shipper).ok());
  ASSERT_TRUE(shipper->ShipOnce().ok());
  redis.Command({"XADD", "specloop:records", "*", "key", "not-a-key", "record", "junk"});
  // The dead consumer: the group made, 40 entries delivered to "trainer", none acknowledged.
  redis.Command({"XGROUP", "CREATE", "specloop:records", "specloop-trainer", "0"});
  const RedisReply taken = redis.Command({"XREADGROUP", "GROUP", "specloop-trainer", "trainer",
                                          "COUNT", "40", "STREAMS", "specloop:records", ">"});
  ASSERT_EQ(taken.elements.at(0).elements.at(1).elements.size(), 40u);
  EXPECT_EQ(redis.Command({"XPENDING", "specloop:records", "specloop-trainer"})
                .elements.at(0)
                .integer,
            40);

  std::unique_ptr<StreamIngester> ingester;
  ASSERT_TRUE(StreamIngester::Open(Ingesting(trainer.path(), redis.port()), &ingester).ok());
  IngestUntil(ingester.get(), 100);
  (void)ingester->IngestOnce();  // past the junk entry, whatever the order of reads
  EXPECT_EQ(ingester->stats().corrupt.load(), 1u);
  EXPECT_EQ(redis.Command({"XPENDING", "specloop:records", "specloop-trainer"})
                .elements.at(0)
                .integer,
            0);
  ingester.reset();
  EXPECT_TRUE(Contents({trainer.path()}) == Contents({worker.path()}));
}

}  // namespace
}  // namespace specloop
