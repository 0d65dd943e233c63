// SampleLogger::AddStep's cost on the scheduler thread, and the share of it that is the copy of
// the step's own rows (serve/sample_logger.h: a queued step holds a contiguous copy of its k + 1
// rows, not a view of the batch's logits).
//
// Per round: a batch's logits ([batch * (k + 1), vocab] float32, as the scheduler's verify
// forward returns them) and, in an order that rotates each round, three arms of `batch` calls
// each, one per sequence of the batch, every call timed alone:
//   add_step    SampleLogger::AddStep with the sequence's rows (a view of the batch)
//   add_twin    the same again (its spread against add_step is the timing noise)
//   copy_only   the copy AddStep makes of those rows, alone
// The worker is drained (untimed) before each arm, so no call finds the queue full. Prints JSON
// lines (name, params, value, unit): each arm's median time per call over all calls, and per
// round the ratios copy_only / add_step and add_twin / add_step, as median, min and max.
//
//   sample_logger_bench [--rounds 200] [--batch 16] [--k 8] [--vocab 4096]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "buffer/replay_logger.h"
#include "serve/sample_logger.h"

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("SampleLogger::AddStep cost and its rows copy");
  int rounds = 200, batch = 16, k = 8, vocab = 4096;
  app.add_option("--rounds", rounds)->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--batch", batch)->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--k", k)->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--vocab", vocab)->capture_default_str()->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("sample_logger_bench-" + std::to_string(::getpid())))
                              .string();
  std::unique_ptr<specloop::ReplayLogger> logger;
  specloop::Status s =
      specloop::ReplayLogger::Open(specloop::BufferOptions(), specloop::LoggerOptions(), dir,
                                   &logger);
  if (!s.ok()) {
    std::cerr << "sample_logger_bench: " << s.ToString() << "\n";
    return 1;
  }
  const json params = {{"batch", batch}, {"k", k}, {"vocab", vocab}, {"rounds", rounds}};
  std::vector<double> add_us, twin_us, copy_us, copy_ratio, twin_ratio;
  uint64_t dropped = 0;
  {
    specloop::SampleLoggerOptions o;
    o.max_pending_steps = static_cast<size_t>(batch) + 1;
    o.max_pending_bytes = static_cast<size_t>(batch + 1) * (k + 1) * vocab * sizeof(float);
    specloop::SampleLogger sl(logger.get(), o);
    const std::vector<int> drafts(static_cast<size_t>(k), 1);
    auto drain = [&] {
      while (sl.pending_bytes() > 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
    };
    for (int round = 0; round < rounds; ++round) {
      const at::Tensor logits = at::randn({static_cast<int64_t>(batch) * (k + 1), vocab});
      auto trace = sl.Begin("prose", "bench", 0, specloop::SamplingParams(), {1});
      double sums[3] = {0, 0, 0};
      for (int a = 0; a < 3; ++a) {
        const int arm = (a + round) % 3;
        drain();
        for (int b = 0; b < batch; ++b) {
          const at::Tensor rows = logits.narrow(0, static_cast<int64_t>(b) * (k + 1), k + 1);
          const auto t0 = Clock::now();
          if (arm < 2) {
            sl.AddStep(trace, 1, drafts, k, rows);
          } else {
            at::Tensor copy = rows.to(at::kCPU, at::kFloat, /*non_blocking=*/false,
                                      /*copy=*/true, at::MemoryFormat::Contiguous);
          }
          const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
          sums[arm] += us;
          (arm == 0 ? add_us : arm == 1 ? twin_us : copy_us).push_back(us);
        }
      }
      copy_ratio.push_back(sums[2] / sums[0]);
      twin_ratio.push_back(sums[1] / sums[0]);
      sl.Finish(trace, {1});  // refused (steps past the tokens) or logged: not timed
    }
    drain();
    dropped = sl.steps_dropped();
  }
  (void)logger->Close();
  std::filesystem::remove_all(dir);

  auto emit = [&](const std::string& name, double value, const std::string& unit) {
    std::cout << json{{"name", name}, {"params", params}, {"value", value}, {"unit", unit}}.dump()
              << std::endl;
  };
  emit("add_step_us_median", Median(add_us), "us");
  emit("add_twin_us_median", Median(twin_us), "us");
  emit("copy_only_us_median", Median(copy_us), "us");
  emit("copy_over_add_step_median", Median(copy_ratio), "ratio");
  emit("copy_over_add_step_min", *std::min_element(copy_ratio.begin(), copy_ratio.end()),
       "ratio");
  emit("copy_over_add_step_max", *std::max_element(copy_ratio.begin(), copy_ratio.end()),
       "ratio");
  emit("twin_over_add_step_median", Median(twin_ratio), "ratio");
  emit("twin_over_add_step_min", *std::min_element(twin_ratio.begin(), twin_ratio.end()),
       "ratio");
  emit("twin_over_add_step_max", *std::max_element(twin_ratio.begin(), twin_ratio.end()),
       "ratio");
  emit("steps_dropped", static_cast<double>(dropped), "steps");
  return 0;
}
