// Benchmark helpers: JSON lines {"name", "params", "value", "unit"}, medians, model loading.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/model/llama_model.h"

namespace specloop::bench {

inline double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The q-quantile (0..1) of v, the nearest rank; 0 when empty.
inline double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5))];
}

inline void Emit(const std::string& name, const nlohmann::json& params, double value,
                 const std::string& unit) {
  std::cout << nlohmann::json{{"name", name}, {"params", params}, {"value", value}, {"unit", unit}}
                   .dump()
            << std::endl;
}

// "a,b,c" -> {"a", "b", "c"} (empty pieces dropped).
inline std::vector<std::string> SplitCommas(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(',', start), text.size());
    if (end > start) out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// Loads a model directory or exits with the error: a benchmark has nothing to measure without.
inline std::unique_ptr<LlamaModel> LoadOrDie(const std::string& dir,
                                             const std::string& dtype = "auto") {
  LoadOptions options;
  options.dtype = dtype;
  std::unique_ptr<LlamaModel> m;
  Status s = LlamaModel::Load(dir, options, &m);
  if (!s.ok()) {
    std::cerr << s.ToString() << "\n";
    std::exit(1);
  }
  return m;
}

// The machine's sequential read bandwidth in bytes per second: the fastest of `reps` passes
// that sum a 512 MB buffer (16x this machine's L3), split over `threads` threads, each asking
// for its data 2 KB ahead as the decode kernel does. What a memory-bound decode step can
// approach; benchmarks print it beside their figures. The fastest pass, not the median: on
// this shared machine a pass's rate varies by ~30% with the neighbours' load, and the best
// is what the memory can give (a decode step's share of it is then conservative).
inline double ReadBandwidth(int threads, int reps = 15) {
  typedef float v8 __attribute__((vector_size(32)));
  const int64_t bytes = int64_t{512} << 20;
  std::vector<v8> buf(bytes / sizeof(v8));
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = v8{} + static_cast<float>(i & 7);
  std::vector<double> seconds;
  volatile float sink = 0;
  for (int r = 0; r < reps; ++r) {
    std::vector<float> sums(threads);
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        const size_t begin = buf.size() * t / threads, end = buf.size() * (t + 1) / threads;
        v8 a = {}, b = {}, c = {}, d = {};
        size_t i = begin;
        for (; i + 4 <= end; i += 4) {
          __builtin_prefetch(&buf[i] + 64, 0, 1);  // 2 KB ahead, into L2: both lines
          __builtin_prefetch(&buf[i] + 66, 0, 1);
          a += buf[i];
          b += buf[i + 1];
          c += buf[i + 2];
          d += buf[i + 3];
        }
        const v8 s = a + b + c + d;
        sums[t] = s[0] + s[7];
      });
    }
    for (auto& th : pool) th.join();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    for (float v : sums) sink = sink + v;
  }
  return bytes / *std::min_element(seconds.begin(), seconds.end());
}

}  // namespace specloop::bench
