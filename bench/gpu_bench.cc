// GPU benchmark (issue 48 item 5): a large target on the device, plain and speculative decoding.
//
// 1. Builds the fixture: target-6m widened W times by function-preserving expansion
//    (SHARED/tools/widen_llama.py SRC DST W DTYPE, run with --python, which needs numpy;
//    W = 16: hidden 4096, 1.2 B parameters, the same function up to the weights' rounding), and
//    loads it on --device in DTYPE.
// 2. The device's memory bandwidth: on CUDA its peak (memory clock x bus width x 2, from the
//    driver) and a measured device-to-device copy; on the CPU a measured streaming read of 512 MB
//    (bench::ReadBandwidth, --threads threads).
// 3. Plain greedy decoding at batch 1 (GeneratePlain, each prompt) and at batch --batch (one
//    forward for all rows, argmax on the device, one host copy per step): decode-phase tokens/s
//    and weight_bandwidth_fraction = weight bytes a step reads x steps/s over the peak (the
//    measured read on the CPU; the KV cache's reads are left out).
// 4. Speculative greedy decoding with draft-mix-1m at k auto (a SpeculationPolicy over
//    calibrated step costs, warmed up once on the prompts, as spec_bench's auto): tokens/s, its
//    speedup over plain batch 1 (median of per-repetition ratios; each prompt runs plain and
//    speculative in turn), and spec_equals_plain: every speculative output must equal plain
//    greedy decoding's on the same prompt and models, or the bench exits 1 after printing
//    where they part.
// Also widened_equals_source: the share of prompts whose batch-1 greedy output equals
// target-6m's (float32 on the CPU), and batch_rows_equal_batch1 (information: 16-bit rounding
// may move a near tie; neither fails the run).
// CUDA graphs: the caches lie in bounded pools kept across the run, as a server's, so that the
// engine's decode-shaped forwards replay CUDA graphs (LlamaModel::Forward). On CUDA steps 3 and
// 4 run twice, with graphs (the default) and with a second copy of the models loaded without
// (--no-cuda-graphs: that arm alone), each arm's figures tagged cuda_graphs true / false, and
// cuda_graph_speedup is plain batch-1 tokens/s with graphs over without; cuda_graph_captures,
// cuda_graph_forwards and cuda_graph_capture_failures count the graph arm's target and draft,
// whose graphs are first prepared as a server's start-up prepares them (cuda_graph_prepared,
// target and draft, in cuda_graph_prepare_seconds; the captures count these and any shape met
// later outside them);
// plain_equals_graph_arm (information) is the share of prompts whose eager plain output
// equals the graph arm's.
// Prints JSON lines {"name", "params", "value", "unit"} (bench_util.h); progress on stderr.
// Usage: gpu_bench [--device cuda|cuda:N|cpu] [--widen W] [--dtype float16|float32]
//                  [--tokens N] [--prompts N] [--batch B] [--reps R] [--threads N]
//                  [--python PY] [--widen-script PATH] [--shared DIR] [--out DIR]
//                  [--no-cuda-graphs]
// Defaults: cuda, W 16 on CUDA and 2 on the CPU, float16, 128 tokens, 4 python prompts, batch
// 16, 3 repetitions, 1 CPU thread, python3, SHARED/tools/widen_llama.py, a temporary fixture
// directory (removed at the end; --out keeps it, and reuses a fixture of the same W and dtype).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "bench/bench_util.h"
#include "bench/device_bandwidth.h"
#include "common/engine/draft.h"
#include "common/engine/generate.h"
#include "common/engine/speculative_decoder.h"
#include "common/model/threads.h"
#include "common/tokenizer/tokenizer.h"

namespace specloop {
namespace {

namespace fs = std::filesystem;
using bench::Emit;
using bench::Median;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string device = "cuda", dtype = "float16", python = "python3", script, shared, out;
  int widen = 0;  // 0: 16 on CUDA, 2 on the CPU
  int tokens = 128, prompts = 4, batch = 16, reps = 3, threads = 1;
  bool cuda_graphs = true;
};

std::string g_temporary_fixture;  // removed on every exit once set

[[noreturn]] void Die(const std::string& message, int code = 1) {
  std::cerr << "gpu_bench: " << message << "\n";
  if (!g_temporary_fixture.empty()) fs::remove_all(g_temporary_fixture);
  std::exit(code);
}

// Options from argv; a bad flag or value exits 2 with the reason.
Options ParseArgs(int argc, char** argv) {
  Options o;
  o.shared = SPECLOOP_SHARED_DIR;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--no-cuda-graphs") {
      o.cuda_graphs = false;
      continue;
    }
    if (i + 1 >= argc) Die("missing value after " + flag, 2);
    const std::string value = argv[++i];
    const auto number = [&](int lo, int hi) {
      char* end = nullptr;
      const long v = std::strtol(value.c_str(), &end, 10);
      if (end == value.c_str() || *end != '\0' || v < lo || v > hi) {
        Die(flag + " takes a number in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                "], not '" + value + "'",
            2);
      }
      return static_cast<int>(v);
    };
    if (flag == "--device") o.device = value;
    else if (flag == "--dtype") o.dtype = value;
    else if (flag == "--python") o.python = value;
    else if (flag == "--widen-script") o.script = value;
    else if (flag == "--shared") o.shared = value;
    else if (flag == "--out") o.out = value;
    else if (flag == "--widen") o.widen = number(1, 64);
    else if (flag == "--tokens") o.tokens = number(2, 1000);
    else if (flag == "--prompts") o.prompts = number(1, 64);
    else if (flag == "--batch") o.batch = number(1, 256);
    else if (flag == "--reps") o.reps = number(1, 100);
    else if (flag == "--threads") o.threads = number(1, 1024);
    else Die("unknown flag " + flag, 2);
  }
  if (o.device != "cpu" && o.device != "cuda" && o.device.rfind("cuda:", 0) != 0) {
    Die("--device takes cpu, cuda or cuda:N, not '" + o.device + "'", 2);
  }
  if (o.dtype != "float16" && o.dtype != "float32") {
    Die("--dtype takes float16 or float32 (what widen_llama.py writes), not '" + o.dtype + "'", 2);
  }
  if (o.widen == 0) o.widen = o.device == "cpu" ? 2 : 16;
  if (o.script.empty()) o.script = o.shared + "/tools/widen_llama.py";
  return o;
}

std::string ShellQuote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Widens SHARED/models/target-6m into `dir` (o.widen, o.dtype) with the script, unless `dir`
// already holds that fixture (config.json of the widened size and dtype). Returns the script's
// JSON summary ({"params", ...}), or {} when reused; exits 1 when the script fails.
json BuildFixture(const Options& o, const std::string& dir) {
  const std::string src = o.shared + "/models/target-6m";
  std::ifstream src_config(src + "/config.json");
  if (!src_config) Die("cannot read " + src + "/config.json");
  const json source = json::parse(src_config, nullptr, false);
  if (std::ifstream have(dir + "/config.json"); have) {
    const json c = json::parse(have, nullptr, false);
    if (!c.is_discarded() && c.value("hidden_size", 0) == source["hidden_size"].get<int>() * o.widen &&
        c.value("torch_dtype", "") == o.dtype && fs::exists(dir + "/model.safetensors")) {
      std::cerr << "gpu_bench: reusing the fixture in " << dir << "\n";
      return json::object();
    }
  }
  if (!fs::exists(o.script)) Die("no widening script at " + o.script + " (--widen-script)");
  const std::string cmd = ShellQuote(o.python) + " " + ShellQuote(o.script) + " " +
                          ShellQuote(src) + " " + ShellQuote(dir) + " " +
                          std::to_string(o.widen) + " " + o.dtype;
  std::cerr << "gpu_bench: " << cmd << "\n";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) Die("cannot run " + o.python);
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), pipe)) > 0;) out.append(buf, n);
  const int status = pclose(pipe);
  if (status != 0) {
    Die("widening failed (wait status " + std::to_string(status) + "): " + o.python +
        " must run " + o.script + ", which needs numpy (--python)");
  }
  const json summary = json::parse(out, nullptr, false);
  if (summary.is_discarded()) Die("widening printed no JSON summary: " + out);
  return summary;
}

// The weight bytes one decode step reads: the CPU forward's packed matrices, or elsewhere every
// weight but the token embedding (a step reads one row of it).
double StepWeightBytes(const LlamaModel& m) {
  if (m.StreamedWeightBytes() > 0) return static_cast<double>(m.StreamedWeightBytes());
  double bytes = 0;
  for (const auto& [name, t] : m.NamedWeights()) {
    if (name != "model.embed_tokens.weight") bytes += t.numel() * t.element_size();
  }
  return bytes;
}

// Up to n prompts of SHARED/prompts/python.jsonl as ids: the last 256 tokens, BOS first.
std::vector<std::vector<int>> LoadPrompts(const Options& o, const Tokenizer& tok, int n) {
  std::ifstream in(o.shared + "/prompts/python.jsonl");
  if (!in) Die("cannot read " + o.shared + "/prompts/python.jsonl");
  std::vector<std::vector<int>> out;
  for (std::string line; static_cast<int>(out.size()) < n && std::getline(in, line);) {
    std::vector<int> ids = tok.Encode(json::parse(line)["prompt"].get<std::string>());
    if (ids.size() > 256) ids.erase(ids.begin(), ids.end() - 256);
    ids.insert(ids.begin(), 1);
    out.push_back(std::move(ids));
  }
  if (out.empty()) Die("no prompt in " + o.shared + "/prompts/python.jsonl");
  return out;
}

// Greedy plain decoding of all `prompts` as one batch, their caches in `pool` (a server's
// layout: a bounded pool kept across calls): one forward per step for every row,
// argmax on the device, one host copy of the ids per step. Returns decode-phase seconds (the
// steps after the prefill's first token); out[i]: row i's `tokens` ids.
double DecodeBatch(const LlamaModel& m, const std::shared_ptr<KVBlockPool>& pool,
                   const std::vector<std::vector<int>>& prompts, int tokens,
                   std::vector<std::vector<int>>* out) {
  std::vector<KVCache> caches;
  for (size_t i = 0; i < prompts.size(); ++i) caches.push_back(m.NewCache(pool));
  std::vector<ForwardInput> batch(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    batch[i].cache = &caches[i];
    batch[i].tokens.assign(prompts[i].begin(), prompts[i].end());
  }
  out->assign(prompts.size(), {});
  const auto step = [&] {
    const at::Tensor ids = at::argmax(m.Forward(batch), -1).to(at::kCPU);
    const int64_t* p = ids.data_ptr<int64_t>();
    for (size_t i = 0; i < batch.size(); ++i) {
      (*out)[i].push_back(static_cast<int>(p[i]));
      batch[i].tokens = {p[i]};
    }
  };
  step();  // the prefill and the first token
  const auto t0 = Clock::now();
  for (int t = 1; t < tokens; ++t) step();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The first index where a and b differ (their common length when one is a prefix).
size_t FirstDifference(const std::vector<int>& a, const std::vector<int>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

}  // namespace
}  // namespace specloop

int main(int argc, char** argv) {
  using namespace specloop;
  const Options o = ParseArgs(argc, argv);
  const bool cuda = o.device != "cpu";
  if (cuda && !at::hasCUDA()) Die("--device " + o.device + ": this LibTorch has no CUDA or no GPU is visible", 2);
  const json run = {{"device", o.device}, {"widen", o.widen}, {"dtype", o.dtype},
                    {"tokens", o.tokens}};

  // The fixture.
  std::string dir = o.out;
  const bool temporary = dir.empty();
  if (temporary) {
    std::string pattern = (fs::temp_directory_path() / "gpu_bench-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) Die("cannot make a temporary directory");
    dir = pattern;
    g_temporary_fixture = dir;
  }
  auto t0 = Clock::now();
  const json summary = BuildFixture(o, dir);
  if (!summary.empty()) {
    Emit("widen_seconds", run, std::chrono::duration<double>(Clock::now() - t0).count(), "s");
    Emit("fixture_params", run, summary.value("params", 0.0), "params");
  }

  if (!cuda) SetComputeThreads(o.threads);
  c10::InferenceMode guard;
  LoadOptions load;
  load.device = o.device;
  load.dtype = o.dtype;
  load.cuda_graphs = o.cuda_graphs;
  std::unique_ptr<LlamaModel> target, source;
  if (Status s = LlamaModel::Load(dir, load, &target); !s.ok()) Die("the fixture: " + s.ToString());
  const std::string source_dir = o.shared + "/models/target-6m";
  if (Status s = LlamaModel::Load(source_dir, LoadOptions(), &source); !s.ok()) Die(s.ToString());
  std::unique_ptr<Tokenizer> tok;
  if (Status s = Tokenizer::Load(source_dir, &tok); !s.ok()) Die(s.ToString());
  LoadOptions draft_load = load;
  draft_load.dtype = "auto";  // a draft model's weights stay as stored (generate's --draft)
  const double weight_bytes = StepWeightBytes(*target);
  Emit("weight_bytes_per_step", run, weight_bytes, "bytes");

  // The bandwidth a step's weight reads are measured against.
  double peak = 0;
  if (cuda) {
    const int index = o.device == "cuda" ? 0 : std::atoi(o.device.c_str() + 5);
    bench::CudaDeviceInfo info;
    if (Status s = bench::QueryCudaDevice(index, &info); s.ok()) {
      std::cerr << "gpu_bench: " << info.name << ", memory clock " << info.memory_clock_khz / 1000
                << " MHz, bus " << info.bus_width_bits << " bits\n";
      peak = info.peak_bytes_per_second();
      Emit("peak_bandwidth", {{"device", o.device}, {"name", info.name}}, peak / 1e9, "GB/s");
    } else {
      std::cerr << "gpu_bench: no peak bandwidth (" << s.ToString()
                << "): fractions are of the measured copy\n";
    }
    const double copy = bench::CopyBandwidth(target->device());
    Emit("copy_bandwidth", {{"device", o.device}, {"bytes", int64_t{1} << 30}}, copy / 1e9, "GB/s");
    if (peak == 0) peak = copy;
  } else {
    peak = bench::ReadBandwidth(o.threads);
    Emit("read_bandwidth", {{"threads", o.threads}, {"buffer_mb", 512}}, peak / 1e9, "GB/s");
  }

  const std::vector<std::vector<int>> prompts = LoadPrompts(o, *tok, o.prompts);
  std::vector<std::vector<int>> rows;  // batch B: the prompts cycled to B rows
  const std::vector<std::vector<int>> batch_prompts = LoadPrompts(o, *tok, o.batch);
  for (int i = 0; i < o.batch; ++i) rows.push_back(batch_prompts[i % batch_prompts.size()]);
  // Pools for B sequences of a prompt (at most 257 tokens), `tokens` more and a block's slack.
  const int64_t pool_blocks = o.batch * KVBlockPool::BlocksFor(257 + o.tokens + 32) + 4;

  // One arm: the target and draft (loaded with or without CUDA graphs), their pools.
  struct Arm {
    bool graphs = false;
    std::unique_ptr<LlamaModel> target;
    Draft draft;
    std::shared_ptr<KVBlockPool> target_pool, draft_pool;
  };
  std::vector<Arm> arms;
  arms.emplace_back();
  arms[0].graphs = cuda && o.cuda_graphs;
  arms[0].target = std::move(target);
  if (arms[0].graphs) {  // the same models without graphs
    arms.emplace_back();
    LoadOptions eager = load;
    eager.cuda_graphs = false;
    if (Status s = LlamaModel::Load(dir, eager, &arms[1].target); !s.ok()) Die(s.ToString());
  }
  for (Arm& a : arms) {
    LoadOptions d = draft_load;
    d.cuda_graphs = a.graphs;
    const std::string draft_dir = o.shared + "/models/draft-mix-1m";
    if (Status s = LoadDraft(draft_dir, *a.target, d, &a.draft); !s.ok()) {
      Die("draft-mix-1m: " + s.ToString());
    }
    a.target_pool = a.target->NewBlockPool(pool_blocks, /*prefix_caching=*/false);
    a.draft_pool = a.draft.model->NewBlockPool(pool_blocks, /*prefix_caching=*/false);
    if (a.graphs) {  // as `specloop serve` starts: every decode shape's graph, before any work
      const int64_t tokens = SpeculationPolicyOptions().k_max + 1, context = 257 + o.tokens;
      const auto start = std::chrono::steady_clock::now();
      const int shapes =
          a.target->PrepareStaticShapes(a.target_pool, o.batch, tokens, context) +
          a.draft.model->PrepareStaticShapes(a.draft_pool, o.batch, tokens, context);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      Emit("cuda_graph_prepared", {{"device", o.device}}, shapes, "graphs");
      Emit("cuda_graph_prepare_seconds", {{"device", o.device}, {"graphs", shapes}}, seconds, "s");
    }
  }

  GenerateOptions gen;
  gen.max_tokens = o.tokens;
  gen.sampling.temperature = 0.0f;
  gen.stop_at_eos = false;

  // The widened model computes target-6m's function: its greedy outputs, against target-6m's.
  std::vector<std::vector<int>> first_reference(prompts.size());
  int same_as_source = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateOptions g = gen;
    g.pool = arms[0].target_pool;
    first_reference[i] = GeneratePlain(*arms[0].target, prompts[i], g).tokens;  // warms up too
    same_as_source += GeneratePlain(*source, prompts[i], gen).tokens == first_reference[i];
  }
  Emit("widened_equals_source", run, double(same_as_source) / prompts.size(), "share");

  int mismatches = 0;
  std::vector<double> plain_medians;  // per arm, batch 1
  for (Arm& a : arms) {
    GenerateOptions g = gen;
    g.pool = a.target_pool;
    const LlamaModel& t = *a.target;
    const auto new_proposer = [&] {
      return NewDraftProposer(a.draft, g.sampling, 0.0f, a.draft_pool);
    };
    // Speculative decoding at k auto: a policy over calibrated costs, warmed up on the prompts.
    SpeculationPolicy policy;
    StepCostTable costs;
    CalibrationOptions calibration;
    calibration.sampling = g.sampling;
    CalibrateStepCosts(t, a.draft.model.get(), policy.options().k_max, &costs, calibration);
    SpeculativeOptions spec;
    spec.generate = g;
    spec.policy = &policy;
    spec.costs = &costs;
    // This arm's plain outputs, which its speculative ones must equal (the two arms' kernels
    // differ, and a 16-bit near tie may fall either way between them).
    std::vector<std::vector<int>> reference(prompts.size());
    int same_as_first = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      std::unique_ptr<Proposer> proposer = new_proposer();
      GenerateSpeculative(t, proposer.get(), prompts[i], spec, nullptr);
      reference[i] = GeneratePlain(t, prompts[i], g).tokens;  // also its shapes' graphs
      same_as_first += reference[i] == first_reference[i];
    }
    if (a.graphs != arms[0].graphs) {  // information
      Emit("plain_equals_graph_arm", {{"device", o.device}, {"cuda_graphs", a.graphs}},
           double(same_as_first) / prompts.size(), "share");
    }

    // Batch 1, plain and speculative in turn on each prompt; the order alternates by repetition.
    std::vector<double> plain_tps, spec_tps, speedups;
    SpeculativeStats stats;
    int plain_changed = 0;
    for (int rep = 0; rep < o.reps; ++rep) {
      double plain_tokens = 0, plain_s = 0, spec_tokens = 0, spec_s = 0;
      for (size_t i = 0; i < prompts.size(); ++i) {
        for (int arm = 0; arm < 2; ++arm) {
          if ((arm + rep) % 2 == 0) {
            const GenerateResult r = GeneratePlain(t, prompts[i], g);
            plain_tokens += r.tokens.size() - 1;  // the first comes from the prefill
            plain_s += r.decode_seconds;
            plain_changed += r.tokens != reference[i];
          } else {
            std::unique_ptr<Proposer> proposer = new_proposer();
            SpeculativeStats s;
            const GenerateResult r =
                GenerateSpeculative(t, proposer.get(), prompts[i], spec, &s);
            stats.Add(s);
            spec_tokens += r.tokens.size();  // its prefill stops before the last prompt token
            spec_s += r.decode_seconds;
            if (r.tokens != reference[i]) {
              ++mismatches;
              std::cerr << "gpu_bench: prompt " << i << " (cuda_graphs " << a.graphs
                        << "): speculative output differs from plain at token "
                        << FirstDifference(r.tokens, reference[i]) << " of "
                        << reference[i].size() << "\n";
            }
          }
        }
      }
      plain_tps.push_back(plain_tokens / plain_s);
      spec_tps.push_back(spec_tokens / spec_s);
      speedups.push_back(spec_tps.back() / plain_tps.back());
    }
    json p = run;
    p["batch"] = 1;
    p["cuda_graphs"] = a.graphs;
    plain_medians.push_back(Median(plain_tps));
    Emit("plain_tokens_per_second", p, Median(plain_tps), "tokens/s");
    Emit("weight_bandwidth_fraction", p, weight_bytes * Median(plain_tps) / peak, "ratio");
    p["draft"] = "draft-mix-1m";
    p["k"] = "auto";
    Emit("speculative_tokens_per_second", p, Median(spec_tps), "tokens/s");
    Emit("speculative_speedup", p, Median(speedups), "ratio");
    Emit("mean_acceptance_length", p, stats.mean_acceptance_length(), "tokens");
    Emit("k_mean", p, stats.k_mean(), "tokens");
    Emit("spec_equals_plain", p, mismatches == 0 ? 1 : 0, "bool");
    // Information: plain greedy runs whose output differed from the reference run of their
    // prompt (a device's kernels need not be deterministic).
    json q = run;
    q["cuda_graphs"] = a.graphs;
    Emit("plain_runs_changed", q, plain_changed, "runs");

    // Batch B, one forward per step.
    std::vector<double> batch_tps;
    std::vector<std::vector<int>> out;
    DecodeBatch(t, a.target_pool, rows, o.tokens, &out);  // untimed: first batch, captures
    for (int rep = 0; rep < o.reps; ++rep) {
      const double seconds = DecodeBatch(t, a.target_pool, rows, o.tokens, &out);
      batch_tps.push_back(o.batch * (o.tokens - 1) / seconds);
    }
    int rows_equal = 0, rows_compared = 0;
    for (size_t i = 0; i < prompts.size() && i < rows.size(); ++i) {
      if (rows[i] != prompts[i]) continue;
      ++rows_compared;
      rows_equal += out[i] == reference[i];
    }
    p = q;
    p["batch"] = o.batch;
    Emit("plain_tokens_per_second", p, Median(batch_tps), "tokens/s");
    Emit("weight_bandwidth_fraction", p, weight_bytes * Median(batch_tps) / o.batch / peak,
         "ratio");
    if (rows_compared > 0) {
      Emit("batch_rows_equal_batch1", p, double(rows_equal) / rows_compared, "share");
    }
    if (a.graphs) {
      for (const auto& [name, m] : {std::pair<const char*, const LlamaModel*>{"target", &t},
                                    {"draft", a.draft.model.get()}}) {
        const LlamaModel::StaticStats st = m->static_stats();
        json c = {{"device", o.device}, {"model", name}};
        Emit("cuda_graph_captures", c, st.captures, "graphs");
        Emit("cuda_graph_forwards", c, st.forwards, "forwards");
        Emit("cuda_graph_capture_failures", c, st.capture_failures, "captures");
        if (st.capture_failures > 0) {
          std::cerr << "gpu_bench: " << name
                    << ": CUDA graph capture failed: " << st.capture_error << "\n";
        }
      }
    }
  }
  if (arms.size() == 2) {
    Emit("cuda_graph_speedup", {{"device", o.device}, {"batch", 1}},
         plain_medians[0] / plain_medians[1], "ratio");
  }

  if (temporary) fs::remove_all(dir);
  if (mismatches > 0) {
    std::cerr << "gpu_bench: " << mismatches << " speculative outputs differ from plain greedy decoding\n";
    return 1;
  }
  return 0;
}
