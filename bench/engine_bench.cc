// Engine benchmark: what one CPU forward costs, against what the machine allows.
//
// For target-wide-46m (the speed fixture: its weights stream from memory at every step) in
// float32 and float16, on 1 thread and on every core, and for target-6m and draft-mix-1m:
//   - forward_latency and forward_cost_ratio: one forward of n = 1, 2, 3, 5, 9, 16 new
//     positions after 16 cached ones, as a multiple of one position (the verification cost of
//     k = n - 1 draft tokens);
//   - plain_decode_tokens_per_second at 16 and 300 cached positions (one position a step),
//     the weight bytes per second that is, and its share of the measured read bandwidth;
// plus read_bandwidth (a streaming read of 512 MB, 1 thread and every core).
// The arms of one model and thread count are timed round-robin, one forward each in turn, and
// every ratio is the median of per-round ratios, so the machine's drift cancels;
// noise_same_arm_ratio is two identical 1-position arms compared the same way.
// Prints JSON lines {"name", "params", "value", "unit"}. Usage:
//   engine_bench [--shared DIR] [--threads N] [--reps R]    (N: the "every core" count)
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "bench/bench_util.h"
#include "common/kernels/linear_kernels.h"
#include "common/model/threads.h"

namespace specloop {
namespace {

using bench::Emit;
using bench::Median;
using Clock = std::chrono::steady_clock;

// One arm: a forward of `n` new positions after `past` cached ones, re-run from the same cache.
struct Arm {
  std::string name;
  int n, past;
  KVCache cache;
  std::vector<double> seconds;
};

// Times every arm once per round, `reps` rounds; returns nothing, fills arm.seconds.
void RunRounds(const LlamaModel& m, std::vector<Arm>& arms, int reps) {
  c10::InferenceMode guard;
  for (Arm& a : arms) {
    a.cache = m.NewCache(a.past + a.n);
    m.Forward({{&a.cache, std::vector<int64_t>(a.past, 5), false}});
  }
  for (int r = -2; r < reps; ++r) {  // two warm-up rounds
    for (Arm& a : arms) {
      const auto t0 = Clock::now();
      m.Forward({{&a.cache, std::vector<int64_t>(a.n, 7), true}});
      const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
      if (r >= 0) a.seconds.push_back(sec);
      a.cache.Truncate(a.past);
    }
  }
}

double MedianRatio(const Arm& a, const Arm& b) {
  std::vector<double> r;
  for (size_t i = 0; i < a.seconds.size(); ++i) r.push_back(a.seconds[i] / b.seconds[i]);
  return Median(r);
}

void MeasureModel(const std::string& name, const LlamaModel& m, const std::string& dtype,
                  int threads, int reps, double bandwidth) {
  SetComputeThreads(threads);
  std::vector<Arm> arms;
  for (int n : {1, 2, 3, 5, 9, 16}) arms.push_back({"n" + std::to_string(n), n, 16, {}, {}});
  arms.push_back({"same", 1, 16, {}, {}});
  arms.push_back({"past300", 1, 300, {}, {}});
  RunRounds(m, arms, reps);
  const nlohmann::json base = {{"model", name}, {"dtype", dtype}, {"threads", threads},
                               {"isa", IsaName(ActiveIsa())}};
  for (size_t i = 0; i < 6; ++i) {
    nlohmann::json p = base;
    p.update({{"positions", arms[i].n}, {"past", 16}});
    Emit("forward_latency", p, Median(arms[i].seconds) * 1e6, "us");
    if (i > 0) Emit("forward_cost_ratio", p, MedianRatio(arms[i], arms[0]), "x one position");
  }
  Emit("noise_same_arm_ratio", base, MedianRatio(arms[6], arms[0]), "ratio");
  const double bytes = static_cast<double>(m.StreamedWeightBytes());
  for (const Arm* a : {&arms[0], &arms[7]}) {
    nlohmann::json p = base;
    p["past"] = a->past;
    const double sec = Median(a->seconds);
    Emit("plain_decode_tokens_per_second", p, 1.0 / sec, "tokens/s");
    Emit("weight_bytes_per_second", p, bytes / sec / 1e9, "GB/s");
    p["read_bandwidth_gb_s"] = bandwidth / 1e9;
    Emit("share_of_read_bandwidth", p, bytes / sec / bandwidth, "fraction");
  }
  nlohmann::json p = base;
  Emit("long_context_vs_short", p, 1.0 / MedianRatio(arms[7], arms[0]), "ratio (past 300 / 16)");
}

}  // namespace
}  // namespace specloop

int main(int argc, char** argv) {
  using namespace specloop;
  std::string shared = SPECLOOP_SHARED_DIR;
  int all = AvailableCores(), reps = 31;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) {
      all = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--shared") && i + 1 < argc) {
      shared = argv[++i];
    } else {
      std::cerr << "usage: engine_bench [--shared DIR] [--threads N] [--reps R]\n";
      return 2;
    }
  }
  std::vector<int> thread_counts = {1};
  if (all > 1) thread_counts.push_back(all);
  std::vector<double> bandwidth;
  for (int t : thread_counts) {
    bandwidth.push_back(bench::ReadBandwidth(t));
    Emit("read_bandwidth", {{"threads", t}, {"buffer_mb", 512}}, bandwidth.back() / 1e9, "GB/s");
  }
  const std::string models = shared + "/models/";
  for (const std::string dtype : {"float32", "float16"}) {
    auto wide = bench::LoadOrDie(models + "target-wide-46m", dtype);
    for (size_t i = 0; i < thread_counts.size(); ++i) {
      MeasureModel("target-wide-46m", *wide, dtype, thread_counts[i], reps, bandwidth[i]);
    }
  }
  auto small = bench::LoadOrDie(models + "target-6m");
  auto draft = bench::LoadOrDie(models + "draft-mix-1m");
  MeasureModel("target-6m", *small, "float32", 1, reps, bandwidth[0]);
  MeasureModel("draft-mix-1m", *draft, "float32", 1, reps, bandwidth[0]);
  return 0;
}
