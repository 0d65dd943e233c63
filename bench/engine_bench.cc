// Engine benchmark (issue 2): plain decode tokens/s at batch 1 for stories260K and target-6m,
// and per-forward latency of target-6m and draft-mix-1m for 1 and for 5 new positions (the
// draft/target cost ratio c and verification cost beta of the speculative issue). Also the
// same decode through the LibTorch-operator path, to show what the small-block CPU path buys.
// Prints JSON lines {"name", "params", "value", "unit"}; every figure is the median of several
// runs. Usage: engine_bench [SHARED_DIR] [--threads N]
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "common/threads.h"
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "common/generate.h"
#include "common/llama2c_convert.h"

namespace specloop {
namespace {

using bench::Emit;
using bench::LoadOrDie;
using bench::Median;

using Clock = std::chrono::steady_clock;

// Greedy decode of `tokens` new tokens after a 16-token prompt; median tokens/s of `runs`.
double DecodeTokensPerSecond(LlamaModel& m, int tokens, int runs) {
  std::vector<int> prompt = {1};
  for (int i = 1; i < 16; ++i) prompt.push_back(100 + i);
  GenerateOptions opt;
  opt.max_tokens = tokens;
  opt.sampling.temperature = 0;
  opt.stop_at_eos = false;
  std::vector<double> tps;
  for (int r = 0; r < runs; ++r) {
    GenerateResult g = GeneratePlain(m, prompt, opt);
    tps.push_back((g.tokens.size() - 1) / g.decode_seconds);  // decode only, as run.c reports
  }
  return Median(tps);
}

// Median seconds of one Forward of `n` new positions after `past` cached positions.
double ForwardSeconds(const LlamaModel& m, int n, int past, int reps) {
  c10::InferenceMode guard;
  KVCache cache = m.NewCache(past + n);
  std::vector<int64_t> prefix(past, 5);
  m.Forward({{&cache, prefix, false}});
  std::vector<int64_t> block(n, 7);
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    m.Forward({{&cache, block, true}});
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    cache.Truncate(past);
  }
  return Median(t);
}

}  // namespace
}  // namespace specloop

int main(int argc, char** argv) {
  using namespace specloop;
  std::string shared = SPECLOOP_SHARED_DIR;
  int threads = 1;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else {
      shared = argv[i];
    }
  }
  SetComputeThreads(threads);
  const nlohmann::json base = {{"threads", threads}};

  const std::string stories = "/tmp/specloop-bench-stories260K";
  Status s = ConvertLlama2c(shared + "/models/stories260K/stories260K.bin",
                            shared + "/models/stories260K/tok512.bin", stories);
  if (!s.ok()) {
    std::cerr << s.ToString() << "\n";
    return 1;
  }
  auto st = LoadOrDie(stories);
  auto target = LoadOrDie(shared + "/models/target-6m");
  auto draft = LoadOrDie(shared + "/models/draft-mix-1m");

  for (auto& [name, model, tokens] :
       std::vector<std::tuple<std::string, LlamaModel*, int>>{{"stories260K", st.get(), 256},
                                                              {"target-6m", target.get(), 128}}) {
    for (bool small : {true, false}) {
      model->set_use_small_cpu_path(small);
      nlohmann::json p = base;
      p.update({{"model", name}, {"batch", 1}, {"new_tokens", tokens},
                {"path", small ? "small_cpu" : "aten"}});
      Emit("decode_tokens_per_second", p, DecodeTokensPerSecond(*model, tokens, 5), "tokens/s");
    }
    model->set_use_small_cpu_path(true);
  }

  const int past = 128, reps = 41;
  double t1 = 0, t5 = 0, d1 = 0;
  for (auto& [name, model] : std::vector<std::pair<std::string, LlamaModel*>>{
           {"target-6m", target.get()}, {"draft-mix-1m", draft.get()}}) {
    for (int n : {1, 5}) {
      const double sec = ForwardSeconds(*model, n, past, reps);
      nlohmann::json p = base;
      p.update({{"model", name}, {"positions", n}, {"past", past}});
      Emit("forward_latency", p, sec * 1e6, "us");
      if (name == "target-6m") (n == 1 ? t1 : t5) = sec;
      if (name == "draft-mix-1m" && n == 1) d1 = sec;
    }
  }
  nlohmann::json p = base;
  p.update({{"target", "target-6m"}, {"draft", "draft-mix-1m"}, {"past", past}});
  Emit("draft_target_cost_ratio_c", p, d1 / t1, "ratio");
  p["k"] = 4;
  Emit("verify_cost_beta", p, t5 / t1, "ratio");
  return 0;
}
