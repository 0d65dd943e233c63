// The record stream stays bounded (label fleet; fleet/stream_trim.h), against a real
// redis-server: entries leave the stream once every consumer group has acknowledged them, and
// the shippers' cap drops the oldest beyond it and counts them. Also the metrics of both ends
// (fleet/stream_metrics.h).
#include <chrono>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fleet/record_shipper.h"
#include "fleet/stream_ingester.h"
#include "fleet/stream_metrics.h"
#include "fleet/stream_trim.h"
#include "tests/e2e/e2e_util.h"
#include "tests/fleet/fleet_util.h"
#include "tests/fleet/redis_server.h"

namespace specloop {
namespace {

using fleet::Contents;
using fleet::LogRecords;
using fleet::RedisServer;
using fleet::Shipping;

const char kStream[] = "specloop:records";

// The shared ingester's options, trimming after every read.
IngesterOptions Trimming(const std::string& dir, int port) {
  IngesterOptions o = fleet::Ingesting(dir, port);
  o.trim_seconds = 1e-9;
  return o;
}

// The ids of an XREADGROUP / XRANGE reply's entries.
std::vector<std::string> Ids(const RedisReply& entries) {
  std::vector<std::string> ids;
  for (const RedisReply& e : entries.elements) ids.push_back(e.elements.at(0).str);
  return ids;
}

// Every entry id of the stream, oldest first.
std::vector<std::string> StreamIds(RedisServer* redis) {
  return Ids(redis->Command({"XRANGE", kStream, "-", "+"}));
}

TEST(StreamId, ParsesOrdersAndSteps) {
  StreamId a, b;
  ASSERT_TRUE(ParseStreamId("1700000000123-7", &a));
  EXPECT_EQ(a.ms, 1700000000123u);
  EXPECT_EQ(a.seq, 7u);
  EXPECT_EQ(a.ToString(), "1700000000123-7");
  ASSERT_TRUE(ParseStreamId("1700000000123", &b));
  EXPECT_EQ(b.seq, 0u);
  EXPECT_TRUE(b < a);
  EXPECT_EQ(a.Next().ToString(), "1700000000123-8");
  ASSERT_TRUE(ParseStreamId("5-18446744073709551615", &a));
  EXPECT_EQ(a.Next().ToString(), "6-0");
  for (const char* bad : {"", "-", "1-", "-1", "x-1", "1-2-3", "1 -2", "99999999999999999999999"}) {
    EXPECT_FALSE(ParseStreamId(bad, &a)) << bad;
  }
}

// Two consumer groups: the trainer's ingester and an "audit" group that takes 150 of 300
// entries and acknowledges 50. The stream keeps exactly what some group has not
// acknowledged, and empties once both have.
TEST(StreamTrim, AcknowledgedEntriesLeaveTheStream) {
  RedisServer redis;
  testing::TempDir worker, trainer;
  LogRecords(worker.path(), 1, 300, 31);
  std::unique_ptr<RecordShipper> shipper;
  ASSERT_TRUE(RecordShipper::Open(Shipping(worker.path(), "w1", redis.port()), &shipper).ok());
  ASSERT_TRUE(shipper->ShipOnce().ok());
  const std::vector<std::string> ids = StreamIds(&redis);
  ASSERT_EQ(ids.size(), 300u);

  std::unique_ptr<StreamIngester> ingester;
  ASSERT_TRUE(StreamIngester::Open(Trimming(trainer.path(), redis.port()), &ingester).ok());
  ASSERT_EQ(redis.Command({"XGROUP", "CREATE", kStream, "audit", "0"}).str, "OK");
  const RedisReply taken = redis.Command(
      {"XREADGROUP", "GROUP", "audit", "a", "COUNT", "150", "STREAMS", kStream, ">"});
  const std::vector<std::string> audit = Ids(taken.elements.at(0).elements.at(1));
  ASSERT_EQ(audit.size(), 150u);
  std::vector<std::string> ack = {"XACK", kStream, "audit"};
  ack.insert(ack.end(), audit.begin(), audit.begin() + 50);
  EXPECT_EQ(redis.Command(ack).integer, 50);

  // Before the ingester reads: its group needs all 300, audit from entry 51 on.
  std::unique_ptr<RedisClient> c;
  ASSERT_TRUE(RedisClient::Connect("127.0.0.1", redis.port(), 5.0, &c).ok());
  StreamTrimResult t;
  ASSERT_TRUE(TrimStream(c.get(), kStream, 0, "specloop-trainer", &t).ok());
  EXPECT_EQ(t.acknowledged_trimmed, 0u);
  EXPECT_EQ(t.length, 300u);
  EXPECT_EQ(t.group_unacknowledged, 300u);
  EXPECT_EQ(t.group_oldest_needed.ToString(), ids[0]);
  ASSERT_EQ(t.groups.size(), 2u);

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (ingester->stats().records.load() < 300 && std::chrono::steady_clock::now() < deadline) {
    ASSERT_TRUE(ingester->IngestOnce().ok());
  }
  ASSERT_EQ(ingester->stats().records.load(), 300u);
  // The trainer's group acknowledged all; audit's oldest pending entry is the 51st.
  EXPECT_EQ(redis.StreamLength(kStream), 250);
  EXPECT_EQ(StreamIds(&redis).front(), ids[50]);
  EXPECT_EQ(ingester->stats().trimmed.load(), 50u);
  EXPECT_EQ(ingester->stats().stream_length.load(), 250u);
  EXPECT_EQ(ingester->stats().lag_entries.load(), 0u);
  EXPECT_EQ(ingester->stats().oldest_unacknowledged_ms.load(), 0u);

  // Audit acknowledges the rest of what it took: it still needs the 150 never delivered.
  ack = {"XACK", kStream, "audit"};
  ack.insert(ack.end(), audit.begin() + 50, audit.end());
  EXPECT_EQ(redis.Command(ack).integer, 100);
  ASSERT_TRUE(ingester->IngestOnce().ok());
  EXPECT_EQ(redis.StreamLength(kStream), 150);
  EXPECT_EQ(StreamIds(&redis).front(), ids[150]);
  EXPECT_EQ(ingester->stats().trimmed.load(), 150u);
  ASSERT_TRUE(TrimStream(c.get(), kStream, 0, "audit", &t).ok());
  EXPECT_EQ(t.group_unacknowledged, 150u);
  EXPECT_TRUE(t.group_has_needed);
  EXPECT_EQ(t.group_oldest_needed.ToString(), ids[150]);

  // Audit reads and acknowledges the rest: nothing is left.
  const RedisReply rest = redis.Command(
      {"XREADGROUP", "GROUP", "audit", "a", "COUNT", "1000", "STREAMS", kStream, ">"});
  const std::vector<std::string> rest_ids = Ids(rest.elements.at(0).elements.at(1));
  ASSERT_EQ(rest_ids.size(), 150u);
  ack = {"XACK", kStream, "audit"};
  ack.insert(ack.end(), rest_ids.begin(), rest_ids.end());
  EXPECT_EQ(redis.Command(ack).integer, 150);
  ASSERT_TRUE(ingester->IngestOnce().ok());
  EXPECT_EQ(redis.StreamLength(kStream), 0);
  EXPECT_EQ(ingester->stats().trimmed.load(), 300u);
  EXPECT_EQ(ingester->stats().corrupt.load() + ingester->stats().missing.load(), 0u);
  ingester.reset();
  EXPECT_TRUE(Contents({trainer.path()}) == Contents({worker.path()}));
}

// The shippers' cap: the trainer's ingester is down, holding 40 entries it took and never
// acknowledged. 260 more are shipped with a cap of 100: 200 dropped (those 40 among them) and
// counted; the ingester, back, counts the 40 as missing and ingests the 100 the stream kept.
TEST(StreamTrim, TheCapDropsAndCountsWhatIsNotAcknowledged) {
  RedisServer redis;
  testing::TempDir worker, trainer;
  std::unique_ptr<StreamIngester> ingester;
  ASSERT_TRUE(StreamIngester::Open(Trimming(trainer.path(), redis.port()), &ingester).ok());
  ingester.reset();  // the group exists; its consumer is down

  LogRecords(worker.path(), 1, 40, 37);
  std::unique_ptr<RecordShipper> shipper;
  ASSERT_TRUE(RecordShipper::Open(Shipping(worker.path(), "w1", redis.port()), &shipper).ok());
  ASSERT_TRUE(shipper->ShipOnce().ok());
  // The consumer took the 40 before it died.
  const RedisReply taken = redis.Command({"XREADGROUP", "GROUP", "specloop-trainer", "trainer",
                                          "COUNT", "100", "STREAMS", kStream, ">"});
  ASSERT_EQ(taken.elements.at(0).elements.at(1).elements.size(), 40u);

  LogRecords(worker.path(), 1, 260, 41);
  ShipperOptions so = Shipping(worker.path(), "w1", redis.port());
  so.max_stream_length = 100;
  ASSERT_TRUE(RecordShipper::Open(so, &shipper).ok());
  uint64_t shipped = 0;
  ASSERT_TRUE(shipper->ShipOnce(&shipped).ok());
  EXPECT_EQ(shipped, 260u);
  EXPECT_EQ(redis.StreamLength(kStream), 100);
  EXPECT_EQ(redis.EntriesAdded(kStream), 300);
  EXPECT_EQ(shipper->stats().dropped.load(), 200u);
  EXPECT_EQ(shipper->stats().stream_length.load(), 100u);
  // The record keys of the entries the cap kept.
  std::set<std::string> kept;
  for (const RedisReply& e : redis.Command({"XRANGE", kStream, "-", "+"}).elements) {
    kept.insert(e.elements.at(1).elements.at(1).str);  // fields: key, <key>, record, <bytes>
  }
  ASSERT_EQ(kept.size(), 100u);

  ASSERT_TRUE(StreamIngester::Open(Trimming(trainer.path(), redis.port()), &ingester).ok());
  for (int i = 0; i < 10 && ingester->stats().records.load() < 100; ++i) {
    ASSERT_TRUE(ingester->IngestOnce().ok());
  }
  EXPECT_EQ(ingester->stats().records.load(), 100u);
  EXPECT_EQ(ingester->stats().missing.load(), 40u);
  EXPECT_EQ(ingester->stats().corrupt.load(), 0u);
  EXPECT_EQ(redis.StreamLength(kStream), 0);
  EXPECT_EQ(ingester->stats().lag_entries.load(), 0u);
  ingester.reset();
  std::set<std::string> got;
  for (const auto& kv : Contents({trainer.path()})) got.insert(kv.first);
  EXPECT_TRUE(got == kept);
}

// What the two ends export, from their stats.
TEST(StreamMetrics, ExportTheStatsAndTheLag) {
  metrics::Registry registry;
  std::unique_ptr<ShipperMetrics> sm;
  std::unique_ptr<IngesterMetrics> im;
  const uint64_t start_us = 1700000000000000;
  ASSERT_TRUE(ShipperMetrics::Create(&registry, "worker-1", start_us, &sm).ok());
  ASSERT_TRUE(IngesterMetrics::Create(&registry, "specloop-trainer", &im).ok());
  ShipperStats ss;
  IngesterStats is;
  ss.records = 7;
  ss.dropped = 3;
  is.records = 5;
  is.trimmed = 4;
  is.stream_length = 11;
  is.lag_entries = 6;
  is.oldest_unacknowledged_ms = start_us / 1000 + 2000;  // added 2 s after start
  sm->Update(ss, start_us + 30000000);  // never caught up: lag since start
  im->Update(is, start_us + 32500000);
  std::string text = registry.Serialize();
  const std::string w = "shipper=\"worker-1\"", g = "group=\"specloop-trainer\"";
  EXPECT_EQ(e2e::MetricValue(text, "specloop_ship_records_total", w), 7);
  EXPECT_EQ(e2e::MetricValue(text, "specloop_stream_dropped_entries_total", w), 3);
  EXPECT_DOUBLE_EQ(e2e::MetricValue(text, "specloop_ship_lag_seconds", w), 30);
  EXPECT_EQ(e2e::MetricValue(text, "specloop_ingest_records_total", g), 5);
  EXPECT_EQ(e2e::MetricValue(text, "specloop_stream_trimmed_entries_total", g), 4);
  EXPECT_EQ(e2e::MetricValue(text, "specloop_stream_entries", g), 11);
  EXPECT_EQ(e2e::MetricValue(text, "specloop_ingest_lag_entries", g), 6);
  EXPECT_DOUBLE_EQ(e2e::MetricValue(text, "specloop_ingest_lag_seconds", g), 30.5);
  // Caught up 1 s ago; the ingester's group needs nothing.
  ss.records = 9;
  ss.caught_up_us = start_us + 59000000;
  is.oldest_unacknowledged_ms = 0;
  sm->Update(ss, start_us + 60000000);
  im->Update(is, start_us + 60000000);
  text = registry.Serialize();
  EXPECT_EQ(e2e::MetricValue(text, "specloop_ship_records_total", w), 9);
  EXPECT_DOUBLE_EQ(e2e::MetricValue(text, "specloop_ship_lag_seconds", w), 1);
  EXPECT_EQ(e2e::MetricValue(text, "specloop_ingest_lag_seconds", g), 0);
}

}  // namespace
}  // namespace specloop
