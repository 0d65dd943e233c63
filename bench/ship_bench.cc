// Shipping benchmark (issue 31): the throughput of the path from a worker's buffer through a
// Redis stream into the trainer's buffer, in speculative steps per second.
//   ship_bench [--records N] [--k 4] [--topk 64] [--tokens 512] [--reps 3]
// A redis-server on a free loopback port (append-only file; fsync on every write, the product's
// guarantee, and once a second, Redis's default) serves each repetition. Per repetition: N
// records shaped like serving traffic (bench/realistic_record.h) are logged into a fresh
// buffer, then shipped (RecordShipper, one thread), then ingested (StreamIngester, one thread),
// each timed alone; then both run at once over a fresh stream (the pipeline). JSON lines
// {"name", "params", "value", "unit"}; medians over repetitions.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/realistic_record.h"
#include "fleet/record_shipper.h"
#include "buffer/replay_logger.h"
#include "fleet/stream_ingester.h"
#include "tests/e2e/e2e_util.h"

namespace specloop {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void Emit(const std::string& name, const nlohmann::json& params, double value,
          const std::string& unit) {
  std::cout << nlohmann::json{{"name", name}, {"params", params}, {"value", value},
                              {"unit", unit}}
                   .dump()
            << std::endl;
}

void Die(const std::string& what, const Status& s) {
  std::cerr << "ship_bench: " << what << ": " << s.ToString() << "\n";
  std::exit(1);
}

}  // namespace
}  // namespace specloop

int main(int argc, char** argv) {
  using namespace specloop;
  int records = 2000, k = 4, top_k = 64, tokens = 512, reps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--records")) records = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--k")) k = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--topk")) top_k = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--tokens")) tokens = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
  }
  Rng rng(1);
  std::vector<Record> pool;
  for (int i = 0; i < 16; ++i) pool.push_back(bench::MakeRecord(&rng, k, top_k, tokens, i));
  uint64_t pool_steps = 0;
  for (const Record& r : pool) pool_steps += r.steps.size();
  const double steps_per_record = static_cast<double>(pool_steps) / pool.size();

  for (const std::string fsync : {"always", "everysec"}) {
    std::map<std::string, std::vector<double>> steps_per_s;
    double mb = 0;
    for (int rep = 0; rep < reps; ++rep) {
      e2e::TempDir redis_dir, worker, trainer, trainer2;
      const int port = e2e::FreePort();
      e2e::Child redis({"redis-server", "--port", std::to_string(port), "--bind", "127.0.0.1",
                        "--dir", redis_dir.path(), "--appendonly", "yes", "--appendfsync",
                        fsync, "--save", ""},
                       /*echo=*/false);
      for (int i = 0; i < 200; ++i) {  // up within 10 s
        std::unique_ptr<RedisClient> c;
        if (RedisClient::Connect("127.0.0.1", port, 1.0, &c).ok()) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      {
        std::unique_ptr<ReplayLogger> logger;
        LoggerOptions lo;
        lo.queue_capacity = static_cast<size_t>(records);
        Status s = ReplayLogger::Open(BufferOptions(), lo, worker.path(), &logger);
        if (!s.ok()) Die("logger", s);
        for (int i = 0; i < records; ++i) {
          Record r = pool[i % pool.size()];
          r.time_us = 0;
          logger->Log(&r);
        }
        s = logger->Close();
        if (!s.ok()) Die("logger", s);
      }
      const double steps = records * steps_per_record;

      ShipperOptions so;
      so.buffer_dir = worker.path();
      so.id = "bench";
      so.redis_port = port;
      std::unique_ptr<RecordShipper> shipper;
      Status s = RecordShipper::Open(so, &shipper);
      if (!s.ok()) Die("shipper", s);
      auto t0 = Clock::now();
      uint64_t shipped = 0;
      s = shipper->ShipOnce(&shipped);
      if (!s.ok() || shipped != static_cast<uint64_t>(records)) Die("ship", s);
      steps_per_s["ship"].push_back(steps / Seconds(t0));
      mb = shipper->stats().bytes.load() / 1e6;

      IngesterOptions io;
      io.buffer_dir = trainer.path();
      io.redis_port = port;
      std::unique_ptr<StreamIngester> ingester;
      s = StreamIngester::Open(io, &ingester);
      if (!s.ok()) Die("ingester", s);
      t0 = Clock::now();
      while (ingester->stats().records.load() < static_cast<uint64_t>(records)) {
        s = ingester->IngestOnce();
        if (!s.ok()) Die("ingest", s);
      }
      steps_per_s["ingest"].push_back(steps / Seconds(t0));
      ingester.reset();

      // The pipeline: a second stream, shipper and ingester on their own threads.
      so.stream = io.stream = "specloop:pipeline";
      io.buffer_dir = trainer2.path();
      s = RecordShipper::Open(so, &shipper);
      if (s.ok()) s = StreamIngester::Open(io, &ingester);
      if (!s.ok()) Die("pipeline", s);
      std::atomic<bool> stop{false};
      t0 = Clock::now();
      std::thread ship([&] { shipper->Run(stop); });
      while (ingester->stats().records.load() < static_cast<uint64_t>(records)) {
        s = ingester->IngestOnce();
        if (!s.ok()) Die("pipeline ingest", s);
      }
      steps_per_s["pipeline"].push_back(steps / Seconds(t0));
      stop = true;
      ship.join();
    }
    const nlohmann::json params = {{"records", records}, {"k", k}, {"topk", top_k},
                                   {"tokens", tokens},   {"reps", reps},
                                   {"appendfsync", fsync},
                                   {"steps_per_record", steps_per_record},
                                   {"record_bytes", mb * 1e6 / records}};
    for (const char* stage : {"ship", "ingest", "pipeline"}) {
      Emit(std::string("ship_") + stage + "_steps_per_s", params, Median(steps_per_s[stage]),
           "steps/s");
    }
  }
  return 0;
}
