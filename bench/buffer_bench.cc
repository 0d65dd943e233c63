// Replay buffer benchmark (issue 4): the async ReplayLogger under realistic records.
//   buffer_bench [--seconds S] [--k 4] [--topk 64] [--tokens 512] [--sync] [--dir DIR]
// One serving thread logs copies of pre-built records as fast as the logger takes them
// (retrying a dropped record after a short pause, as a saturated server would drop it) and
// times every Log() call. Prints records/s and speculative steps/s written to RocksDB,
// bytes/record, and the Log() latency distribution.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "bench/realistic_record.h"
#include "buffer/replay_logger.h"
#include "common/base/rng.h"

namespace {

using namespace specloop;

double Percentile(std::vector<double>* v, double p) {
  if (v->empty()) return 0;
  const size_t i = std::min(v->size() - 1, static_cast<size_t>(p * v->size()));
  std::nth_element(v->begin(), v->begin() + i, v->end());
  return (*v)[i];
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 5;
  int k = 4, top_k = 64, tokens = 512;
  bool sync = false;
  std::string dir;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--seconds") seconds = std::atof(next());
    else if (a == "--k") k = std::atoi(next());
    else if (a == "--topk") top_k = std::atoi(next());
    else if (a == "--tokens") tokens = std::atoi(next());
    else if (a == "--sync") sync = true;
    else if (a == "--dir") dir = next();
    else {
      std::fprintf(stderr, "usage: buffer_bench [--seconds S] [--k K] [--topk K] [--tokens N] "
                           "[--sync] [--dir DIR]\n");
      return 2;
    }
  }
  const bool own_dir = dir.empty();
  if (own_dir) {
    char tmpl[] = "/tmp/specloop-buffer-bench-XXXXXX";
    if (!mkdtemp(tmpl)) return 1;
    dir = tmpl;
  }

  Rng rng(1);
  std::vector<Record> pool;
  for (int i = 0; i < 16; i++) pool.push_back(bench::MakeRecord(&rng, k, top_k, tokens, i));
  size_t pool_steps = 0;
  for (const Record& r : pool) pool_steps += r.steps.size();
  // Copies made ahead, off the timed path (a server builds its record as it decodes).
  std::vector<Record> ready(256);

  LoggerOptions lo;
  lo.sync = sync;
  lo.retention_interval_ms = 0;
  std::unique_ptr<ReplayLogger> logger;
  Status s = ReplayLogger::Open(BufferOptions(), lo, dir, &logger);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  std::vector<double> lat_us;
  lat_us.reserve(1 << 20);
  uint64_t offered = 0, accepted = 0, steps = 0;
  const auto start = std::chrono::steady_clock::now();
  const auto end = start + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    Record& r = ready[offered % ready.size()];
    r = pool[offered % pool.size()];
    r.time_us = 0;
    const auto t0 = std::chrono::steady_clock::now();
    const bool ok = logger->Log(&r);
    const auto t1 = std::chrono::steady_clock::now();
    lat_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    if (ok) {
      accepted++;
      steps += pool[offered % pool.size()].steps.size();
      offered++;
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));  // retry the same record
    }
  }
  s = logger->Flush();
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const uint64_t written = logger->stats().records_written.load();
  const uint64_t bytes = logger->stats().bytes_written.load();
  const uint64_t drops = logger->stats().records_dropped_full.load();
  s = logger->Close();
  logger.reset();

  std::vector<double> l = lat_us;
  const double p50 = Percentile(&l, 0.5), p99 = Percentile(&l, 0.99),
               p999 = Percentile(&l, 0.999);
  const double mx = l.empty() ? 0 : *std::max_element(l.begin(), l.end());
  const size_t over50 = std::count_if(l.begin(), l.end(), [](double v) { return v > 50; });
  std::printf("buffer_bench: k=%d K=%d tokens=%d sync=%d, %.1f steps/record\n", k, top_k, tokens,
              sync, static_cast<double>(pool_steps) / pool.size());
  std::printf("  written      %llu records in %.2f s: %.0f records/s, %.0f steps/s, %.1f MB/s\n",
              static_cast<unsigned long long>(written), elapsed, written / elapsed,
              steps / elapsed, bytes / elapsed / 1e6);
  std::printf("  bytes/record %.0f (%.0f per step)\n", written ? double(bytes) / written : 0.0,
              steps ? double(bytes) / steps : 0.0);
  std::printf("  Log() calls  %zu (%llu dropped as queue full, retried)\n", lat_us.size(),
              static_cast<unsigned long long>(drops));
  std::printf("  Log() us     p50 %.2f  p99 %.2f  p99.9 %.2f  max %.1f  (>50us: %zu calls)\n",
              p50, p99, p999, mx, over50);
  std::printf("  status       %s\n", s.ToString().c_str());
  if (own_dir) std::filesystem::remove_all(dir);
  return s.ok() ? 0 : 1;
}
