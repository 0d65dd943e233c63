// Serving benchmark, one run: the whole stack in-process (HttpServer + Scheduler +
// SampleLogger on `--target` (default target-wide-46m, the speed fixture; target-6m is the
// do-no-harm case) / draft-mix-1m, `--threads` compute threads (default 0: every core, as
// `specloop serve`), `--dtype` of the target's weights) over loopback HTTP, closed-loop clients at
// concurrency 1, 4 and 16, each sending completions (prompts from every domain, sampled at
// `--temperature`, default 0.8) back to back. Four modes: speculation auto with logging, speculation off
// (k = 0) with logging, auto with logging off, and off with logging off. Logging's own cost is
// "serve_logging_overhead_plain" (off against off_nolog); "serve_logging_overhead" (auto
// against auto_nolog) also holds any change in auto's choice of k. Each run starts a fresh
// stack and first sends untimed warm-up requests (a serving process is long-lived: its
// adaptive policy has learnt alpha and costs long before any given minute), then times the
// measured requests (`--requests` per client, default max(8, 64 / concurrency)). Every request
// of a stack has its own prompt (the warm-up's follow the measured ones'): at temperature 0 a
// recurring prompt's answer would be drafted from its earlier one by the suffix proposer. The
// modes are interleaved within each repetition (odd ones in reverse order, so that a mode's place
// in the rotation weighs on every mode alike), so a change in machine load hits them alike;
// ratios (auto/off, logging overheads) are computed per repetition and their median reported,
// beside the median throughput and p50/p99 latency of each mode.
// First, the logger's per-row work alone: FillTopK against the direct way (an exp in double per
// entry, a partial_sort over all ids) on the same rows ("logger_fill_topk",
// "logger_fill_topk_vs_direct").
// JSON lines {"name", "params", "value", "unit"}.
// Also the mean speculation length of the timed part (the draft model's tokens per step,
// "serve_k_mean"; the suffix proposer's, "serve_suffix_k_mean"), the machine's read
// bandwidth, and plain decoding's throughput at each concurrency over one client
// ("serve_off_scaling": one batched forward streams the weights once for every sequence).
// `--dtype` and `--temperature` take comma-separated lists: every combination runs in each
// repetition, interleaved with the modes (ratios are per combination). `--modes` runs only the
// named modes (default auto,off,auto_nolog,off_nolog; also off_twin and auto_twin, copies of
// off and auto whose ratio to their twin shows the run's noise: "serve_twin_ratio"; and k1 ..
// k8, a fixed speculation length (`--k N`), each with its ratio to off: "serve_fixed_over_off_kN").
// Usage: serve_bench [--shared DIR] [--target NAME] [--threads N] [--dtype D[,D]] [--reps N]
//                    [--temperature T[,T]] [--modes M[,M]]
//                    [--requests N] [--tokens N] [--warmup N]
//                    [--concurrency N (default: 1, 4 and 16)] [--prefix-caching 0|1]
//                    [--prompt-lookup 1 (adds the mode auto_lookup: auto with prompt lookup)]
//                    [--draft-mode tree (adds the mode auto_tree: auto with token trees of
//                    2,2,1,1 on offer; also prints the share of steps that drafted a tree)]
//                    [--ship 1 (adds the modes auto_ship and off_ship: auto and off while a
//                    RecordShipper thread tails the buffer into a redis-server on loopback,
//                    as `specloop buffer ship` beside a worker would; also prints the CPU the
//                    shipper and redis-server used, in cores)]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "bench/bench_util.h"
#include "fleet/record_shipper.h"
#include "buffer/replay_logger.h"
#include "common/base/clock.h"
#include "common/base/rng.h"
#include "common/model/threads.h"
#include "serve/http_server.h"
#include "serve/sample_logger.h"
#include "tests/e2e/e2e_util.h"

namespace specloop {
namespace {

using bench::Emit;
using bench::Median;
using bench::Percentile;

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// Prompts read per domain (the first of each file, cut to 200 characters), interleaved across
// domains: enough that at the default requests no prompt recurs in a stack.
constexpr int kPromptsPerDomain = 48;

// --prefix-caching 0 serves without the prefix cache: for comparisons with schedulers that
// had none.
bool prefix_caching = true;

struct Mode {
  std::string name;
  int k;     // -1 auto, 0 off
  bool log;
  bool lookup = false;  // SchedulerOptions::prompt_lookup
  bool tree = false;    // SchedulerOptions::tree_branching = {2, 2, 1, 1}
  bool ship = false;    // a shipper tails the buffer (requires log)
};

struct RunResult {
  double tokens_per_second, p50, p99;
  double k_mean;  // draft-model tokens per verification step, timed part
  double suffix_k_mean;  // suffix-proposer tokens per verification step, timed part
  double tree_share;  // steps that drafted a token tree, timed part
  double ship_cores;  // CPU of the shipper thread and redis-server over the arm's wall time
};

// CPU seconds (user + system) process `pid` has used; 0 when unreadable.
double ProcessCpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');  // the command name may hold spaces
  if (paren == std::string::npos) return 0;
  std::istringstream fields(stat.substr(paren + 2));
  std::string f;
  double utime = 0, stime = 0;
  for (int i = 3; fields >> f; ++i) {  // field 3 is the state; 14 utime, 15 stime (ticks)
    if (i == 14) utime = std::atof(f.c_str());
    if (i == 15) {
      stime = std::atof(f.c_str());
      break;
    }
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// One stack, `concurrency` clients, `requests` requests per client.
// `warmup` untimed requests per client first (different prompts' seeds, same mix).
RunResult RunOnce(const std::string& shared, const std::string& target_name,
                  const std::string& dtype, double temperature, const Mode& mode,
                  int concurrency, int requests, int warmup, int tokens,
                  const std::vector<std::pair<std::string, std::string>>& prompts) {
  const std::string target_dir = shared + "/models/" + target_name;
  std::unique_ptr<LlamaModel> target, draft;
  std::unique_ptr<Tokenizer> tokenizer;
  LoadOptions target_load;
  target_load.dtype = dtype;
  if (!LlamaModel::Load(target_dir, target_load, &target).ok() ||
      !LlamaModel::Load(shared + "/models/draft-mix-1m", {}, &draft).ok() ||
      !Tokenizer::Load(target_dir, &tokenizer).ok()) {
    std::cerr << "serve_bench: cannot load the fixture models under " << shared << "\n";
    std::exit(1);
  }
  std::unique_ptr<ServingMetrics> metrics;
  (void)ServingMetrics::Create(ServingMetricsOptions(), &metrics);
  std::string buffer_dir;
  std::unique_ptr<ReplayLogger> logger;
  std::unique_ptr<SampleLogger> sample_logger;
  if (mode.log) {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / "specloop-serve-bench-XXXXXX").string();
    buffer_dir = mkdtemp(tmpl.data());
    if (!ReplayLogger::Open(BufferOptions(), LoggerOptions(), buffer_dir, &logger).ok()) {
      std::cerr << "serve_bench: cannot open a buffer in " << buffer_dir << "\n";
      std::exit(1);
    }
    sample_logger = std::make_unique<SampleLogger>(logger.get(), SampleLoggerOptions());
  }
  SchedulerOptions so;
  so.k = mode.k;
  so.prefix_caching = prefix_caching;
  so.prompt_lookup = mode.lookup;
  if (mode.tree) so.tree_branching = {2, 2, 1, 1};
  Scheduler scheduler(target.get(), std::move(draft), tokenizer.get(), metrics.get(),
                      sample_logger.get(), so);
  (void)scheduler.Start();
  HttpServerOptions ho;
  ho.port = 0;
  ho.model_name = target_name;
  HttpServer server(ho, &scheduler, metrics.get(), tokenizer.get(), &target->config(),
                    logger.get(), sample_logger.get());
  int port = 0;
  (void)server.Bind(&port);
  std::thread server_thread([&] { (void)server.Run(); });
  // Shipping: a redis-server and a shipper thread following the buffer, started before the
  // clients (so that the warm-up's records are shipped as the timed ones are).
  std::unique_ptr<e2e::TempDir> redis_dir;
  std::unique_ptr<e2e::Child> redis;
  std::unique_ptr<RecordShipper> shipper;
  std::atomic<bool> stop_shipping{false};
  std::thread ship_thread;
  double ship_thread_cpu = 0;
  const auto arm_start = Clock::now();
  if (mode.ship) {
    redis_dir = std::make_unique<e2e::TempDir>();
    const int redis_port = e2e::FreePort();
    redis = std::make_unique<e2e::Child>(
        std::vector<std::string>{"redis-server", "--port", std::to_string(redis_port), "--bind",
                                 "127.0.0.1", "--dir", redis_dir->path(), "--appendonly", "yes",
                                 "--appendfsync", "always", "--save", ""},
        /*echo=*/false);
    ShipperOptions so;
    so.buffer_dir = buffer_dir;
    so.id = "serve_bench";
    so.redis_port = redis_port;
    Status s;
    for (int i = 0; i < 200; ++i) {  // redis-server up within 10 s
      s = RecordShipper::Open(so, &shipper);
      if (s.ok()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!s.ok()) {
      std::cerr << "serve_bench: shipper: " << s.ToString() << "\n";
      std::exit(1);
    }
    ship_thread = std::thread([&] {
      shipper->Run(stop_shipping);
      ship_thread_cpu = ThreadCpuSeconds();
    });
  }

  // Closed-loop clients sending `n` requests each; returns per-client latencies and tokens.
  std::vector<std::vector<double>> latencies(concurrency);
  std::vector<int64_t> generated(concurrency, 0);
  auto drive = [&](int n, int seed_base, size_t first) {
    std::vector<std::thread> clients;
    for (int c = 0; c < concurrency; ++c) {
      clients.emplace_back([&, c] {
        httplib::Client cli("127.0.0.1", port);
        cli.set_read_timeout(300, 0);
        for (int r = 0; r < n; ++r) {
          const auto& [domain, prompt] = prompts[(first + c * n + r) % prompts.size()];
          json req = {{"prompt", prompt},  {"max_tokens", tokens},
                      {"temperature", temperature}, {"seed", seed_base + c * 1000 + r},
                      {"domain", domain},   {"ignore_eos", true}};
          const auto r0 = Clock::now();
          auto res = cli.Post("/v1/completions", req.dump(), "application/json");
          latencies[c].push_back(std::chrono::duration<double>(Clock::now() - r0).count());
          if (res && res->status == 200) {
            generated[c] += json::parse(res->body)["usage"]["completion_tokens"].get<int64_t>();
          }
        }
      });
    }
    for (auto& t : clients) t.join();
  };
  // The measured requests take prompts [0, concurrency * requests), the warm-up ones those after
  // them: no measured prompt was seen by this stack before, and none recurs while the list
  // lasts (at T 0 a recurring prompt's answer would be drafted from its earlier one).
  drive(warmup, 1000000, static_cast<size_t>(concurrency) * requests);
  for (int c = 0; c < concurrency; ++c) {
    latencies[c].clear();
    generated[c] = 0;
  }
  std::string before = metrics->Render(nullptr, nullptr);
  const auto t0 = Clock::now();
  drive(requests, 0, 0);
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  server.Stop();
  server_thread.join();
  scheduler.Stop();
  double ship_cores = 0;
  if (ship_thread.joinable()) {
    stop_shipping = true;
    ship_thread.join();
    const double cpu = ship_thread_cpu + ProcessCpuSeconds(redis->pid());
    ship_cores = cpu / std::chrono::duration<double>(Clock::now() - arm_start).count();
    std::cerr << "serve_bench: " << mode.name << " shipped " << shipper->stats().records.load()
              << " records (" << shipper->stats().bytes.load() / 1e6 << " MB); shipper and "
              << "redis-server used " << cpu << " s of CPU\n";
    shipper.reset();
  }
  sample_logger.reset();
  if (logger) (void)logger->Close();
  if (!buffer_dir.empty()) std::filesystem::remove_all(buffer_dir);

  std::vector<double> all;
  int64_t total = 0;
  for (int c = 0; c < concurrency; ++c) {
    all.insert(all.end(), latencies[c].begin(), latencies[c].end());
    total += generated[c];
  }
  const std::string after = metrics->Render(nullptr, nullptr);
  const double steps = e2e::MetricValue(after, "specloop_spec_steps_total") -
                       e2e::MetricValue(before, "specloop_spec_steps_total");
  const double drafted = e2e::MetricValue(after, "specloop_draft_tokens_total") -
                         e2e::MetricValue(before, "specloop_draft_tokens_total");
  const double suffix = e2e::MetricValue(after, "specloop_suffix_draft_tokens_total") -
                       e2e::MetricValue(before, "specloop_suffix_draft_tokens_total");
  const double tree_steps = e2e::MetricValue(after, "specloop_tree_steps_total") -
                            e2e::MetricValue(before, "specloop_tree_steps_total");
  return {total / wall, Percentile(all, 0.5), Percentile(all, 0.99),
          steps > 0 ? drafted / steps : 0, steps > 0 ? suffix / steps : 0,
          steps > 0 ? tree_steps / steps : 0, ship_cores};
}

// The direct way to the logger's per-row work (FillTopK's contract: log-probs at temperature 1,
// the top K in decreasing order, ties toward lower ids, the tail mass): an exp in double per
// entry and a partial_sort over all ids. The baseline FillTopK's speed is measured against.
void DirectTopK(const float* x, int vocab, int k, std::vector<int>* ids, std::vector<double>* lps,
                double* tail) {
  const float m = *std::max_element(x, x + vocab);
  double sum = 0;
  for (int v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(x[v]) - m);
  const double lse = m + std::log(sum);
  ids->resize(vocab);
  for (int v = 0; v < vocab; ++v) (*ids)[v] = v;
  std::partial_sort(ids->begin(), ids->begin() + k, ids->end(),
                    [x](int a, int b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
  lps->resize(k);
  double kept = 0;
  for (int i = 0; i < k; ++i) kept += std::exp((*lps)[i] = x[(*ids)[i]] - lse);
  *tail = std::max(0.0, 1.0 - kept);
}

// FillTopK against DirectTopK on 200 rows shaped like logits (N(0, 2) with one entry in 50
// raised by 6) over target-6m's 4096 ids, K = 64; medians of 5 repetitions.
void BenchFillTopK() {
  const int vocab = 4096, k = 64, n_rows = 200;
  Rng rng(1);
  std::vector<float> rows(static_cast<size_t>(vocab) * n_rows);
  for (float& x : rows) {
    const double u1 = std::max(rng.Uniform(), 1e-12), u2 = rng.Uniform();
    x = static_cast<float>(2.0 * std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307 * u2) +
                           (rng.Uniform() < 0.02 ? 6.0 : 0.0));
  }
  std::vector<double> fast_us, ratio;
  std::vector<int> ids;
  std::vector<double> lps;
  for (int rep = 0; rep < 5; ++rep) {
    SpecStep step;
    auto t0 = std::chrono::steady_clock::now();
    FillTopK(rows.data(), n_rows, vocab, k, &step);
    auto t1 = std::chrono::steady_clock::now();
    double tail = 0;
    for (int j = 0; j < n_rows; ++j) {
      DirectTopK(rows.data() + static_cast<size_t>(j) * vocab, vocab, k, &ids, &lps, &tail);
    }
    auto t2 = std::chrono::steady_clock::now();
    const double fast = std::chrono::duration<double>(t1 - t0).count();
    const double direct = std::chrono::duration<double>(t2 - t1).count();
    fast_us.push_back(fast * 1e6 / n_rows);
    ratio.push_back(direct / fast);
  }
  const json params = {{"vocab", vocab}, {"k", k}, {"rows", n_rows}};
  Emit("logger_fill_topk", params, Median(fast_us), "us/row");
  Emit("logger_fill_topk_vs_direct", params, Median(ratio), "ratio");
}

}  // namespace
}  // namespace specloop

int main(int argc, char** argv) {
  using namespace specloop;
  std::vector<std::string> dtypes = {"auto"}, mode_names;
  std::vector<double> temperatures = {0.8};
  std::string shared = SPECLOOP_SHARED_DIR, target = "target-wide-46m";
  int reps = 5, requests = 0, tokens = 64, warmup = 4, threads = 0;
  bool lookup_mode = false, tree_mode = false, ship_mode = false;
  std::vector<int> concurrencies = {1, 4, 16};
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--shared")) shared = argv[i + 1];
    if (!std::strcmp(argv[i], "--target")) target = argv[i + 1];
    if (!std::strcmp(argv[i], "--dtype")) dtypes = bench::SplitCommas(argv[i + 1]);
    if (!std::strcmp(argv[i], "--modes")) mode_names = bench::SplitCommas(argv[i + 1]);
    if (!std::strcmp(argv[i], "--temperature")) {
      temperatures.clear();
      for (const std::string& t : bench::SplitCommas(argv[i + 1])) {
        char* end = nullptr;
        const double v = std::strtod(t.c_str(), &end);
        if (end == t.c_str() || *end != '\0' || !(v >= 0)) {
          std::cerr << "serve_bench: --temperature takes numbers >= 0, got '" << t << "'\n";
          return 2;
        }
        temperatures.push_back(v);
      }
    }
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--requests")) requests = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--tokens")) tokens = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--warmup")) warmup = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--prefix-caching")) prefix_caching = std::atoi(argv[i + 1]) != 0;
    if (!std::strcmp(argv[i], "--prompt-lookup")) lookup_mode = std::atoi(argv[i + 1]) != 0;
    if (!std::strcmp(argv[i], "--draft-mode")) tree_mode = !std::strcmp(argv[i + 1], "tree");
    if (!std::strcmp(argv[i], "--ship")) ship_mode = std::atoi(argv[i + 1]) != 0;
    if (!std::strcmp(argv[i], "--concurrency")) concurrencies = {std::atoi(argv[i + 1])};
  }
  for (int t : {1, AvailableCores()}) {
    Emit("read_bandwidth", {{"threads", t}, {"buffer_mb", 512}}, bench::ReadBandwidth(t) / 1e9,
         "GB/s");
    if (AvailableCores() == 1) break;
  }
  SetComputeThreads(threads);
  BenchFillTopK();
  std::vector<std::vector<std::pair<std::string, std::string>>> by_domain;
  for (const std::string domain : {"prose", "python", "c", "legal", "docs"}) {
    std::ifstream in(shared + "/prompts/" + domain + ".jsonl");
    by_domain.emplace_back();
    std::string line;
    for (int n = 0; n < kPromptsPerDomain && std::getline(in, line); ++n) {
      by_domain.back().push_back(
          {domain, json::parse(line)["prompt"].get<std::string>().substr(0, 200)});
    }
  }
  // Interleaved: every domain's first prompt, then every domain's second, ...
  std::vector<std::pair<std::string, std::string>> mixed;
  for (size_t i = 0; i < static_cast<size_t>(kPromptsPerDomain); ++i) {
    for (const auto& prompts : by_domain) {
      if (i < prompts.size()) mixed.push_back(prompts[i]);
    }
  }
  std::vector<Mode> modes = {{"auto", -1, true},
                             {"off", 0, true},
                             {"auto_nolog", -1, false},
                             {"off_nolog", 0, false}};
  if (lookup_mode) modes.push_back({"auto_lookup", -1, true, true});
  if (tree_mode) modes.push_back({"auto_tree", -1, true, false, true});
  if (ship_mode) {
    modes.push_back({"auto_ship", -1, true, false, false, true});
    modes.push_back({"off_ship", 0, true, false, false, true});
  }
  if (!mode_names.empty()) {
    std::vector<Mode> all = modes, chosen;
    all.push_back({"off_twin", 0, true});
    all.push_back({"auto_twin", -1, true});
    for (int k = 1; k <= 8; ++k) all.push_back({"k" + std::to_string(k), k, true});
    for (const std::string& name : mode_names) {
      auto it = std::find_if(all.begin(), all.end(), [&](const Mode& m) { return m.name == name; });
      if (it == all.end()) {
        std::cerr << "serve_bench: unknown mode '" << name << "'\n";
        return 2;
      }
      chosen.push_back(*it);
    }
    modes = chosen;
  }
  auto has = [&](const std::string& name) {
    return std::any_of(modes.begin(), modes.end(), [&](const Mode& m) { return m.name == name; });
  };
  if (dtypes.empty() || temperatures.empty()) {
    std::cerr << "serve_bench: --dtype and --temperature need at least one value\n";
    return 2;
  }
  // Plain decoding's throughput at one client per dtype and temperature, when measured.
  std::map<std::pair<std::string, double>, double> off_at_one;
  for (int conc : concurrencies) {
    const int per_client = requests > 0 ? requests : std::max(8, 64 / conc);
    if (static_cast<size_t>(conc) * (per_client + warmup) > mixed.size()) {
      std::cerr << "serve_bench: " << conc * (per_client + warmup) << " requests at concurrency "
                << conc << " but " << mixed.size() << " prompts: some recur\n";
    }
    // (dtype, temperature) -> mode -> one result per repetition
    std::map<std::pair<std::string, double>, std::map<std::string, std::vector<RunResult>>> runs;
    for (int r = 0; r < reps; ++r) {
      for (const std::string& dtype : dtypes) {
        for (const double temperature : temperatures) {
          // Odd repetitions run the modes in reverse order, so that a mode's place in the
          // rotation (the machine's state after the stack before it) weighs on every mode alike.
          std::vector<Mode> order = modes;
          if (r % 2 == 1) std::reverse(order.begin(), order.end());
          for (const Mode& m : order) {
            runs[{dtype, temperature}][m.name].push_back(RunOnce(shared, target, dtype,
                                                                 temperature, m, conc,
                                                                 per_client, warmup, tokens,
                                                                 mixed));
          }
        }
      }
    }
    for (auto& [combo, by_mode] : runs) {
      const auto& [dtype, temperature] = combo;
      for (const Mode& m : modes) {
        std::vector<double> t, p50, p99, k_mean, suffix_k_mean, tree_share, ship_cores;
        for (const RunResult& rr : by_mode[m.name]) {
          k_mean.push_back(rr.k_mean);
          suffix_k_mean.push_back(rr.suffix_k_mean);
          tree_share.push_back(rr.tree_share);
          ship_cores.push_back(rr.ship_cores);
          t.push_back(rr.tokens_per_second);
          p50.push_back(rr.p50);
          p99.push_back(rr.p99);
        }
        const json params = {{"mode", m.name},
                             {"target", target},
                             {"dtype", dtype},
                             {"temperature", temperature},
                             {"threads", threads},
                             {"concurrency", conc},
                             {"max_tokens", tokens},
                             {"requests_per_client", per_client},
                             {"warmup_per_client", warmup},
                             {"reps", reps}};
        Emit("serve_throughput", params, Median(t), "tokens/s");
        Emit("serve_latency_p50", params, Median(p50), "s");
        Emit("serve_latency_p99", params, Median(p99), "s");
        Emit("serve_k_mean", params, Median(k_mean), "tokens");
        Emit("serve_suffix_k_mean", params, Median(suffix_k_mean), "tokens");
        if (m.tree) Emit("serve_tree_share", params, Median(tree_share), "fraction of steps");
        if (m.ship) Emit("serve_ship_cpu", params, Median(ship_cores), "cores");
        if (m.name == "off" && conc == 1) off_at_one[combo] = Median(t);
        if (m.name == "off" && conc > 1 && off_at_one.count(combo)) {
          Emit("serve_off_scaling", params, Median(t) / off_at_one[combo], "x one client");
        }
      }
      // Per repetition, the ratio of two modes' throughputs, when both ran: their median, and
      // their smallest and largest in "min" / "max".
      auto ratio = [&](const std::string& name, const std::string& a, const std::string& b,
                       bool overhead) {
        if (!has(a) || !has(b)) return;
        std::vector<double> v;
        for (int r = 0; r < reps; ++r) {
          const double x = by_mode[a][r].tokens_per_second / by_mode[b][r].tokens_per_second;
          v.push_back(overhead ? 1.0 - x : x);
        }
        json params = {{"concurrency", conc}, {"dtype", dtype}, {"temperature", temperature},
                       {"reps", reps}, {"min", *std::min_element(v.begin(), v.end())},
                       {"max", *std::max_element(v.begin(), v.end())}};
        Emit(name, params, Median(v), overhead ? "fraction" : "ratio");
      };
      ratio("serve_auto_over_off", "auto", "off", false);
      ratio("serve_logging_overhead", "auto", "auto_nolog", true);
      // The same at k = 0 in both: logging's own cost, apart from any choice of k it moves.
      ratio("serve_logging_overhead_plain", "off", "off_nolog", true);
      ratio("serve_twin_ratio", "off_twin", "off", false);
      ratio("serve_auto_twin_ratio", "auto_twin", "auto", false);
      for (int k = 1; k <= 8; ++k) {
        ratio("serve_fixed_over_off_k" + std::to_string(k), "k" + std::to_string(k), "off", false);
      }
      ratio("serve_lookup_over_auto", "auto_lookup", "auto", false);
      ratio("serve_tree_over_auto", "auto_tree", "auto", false);
      ratio("serve_ship_over_auto", "auto_ship", "auto", false);
      // The same at k = 0 in both: shipping's own cost, apart from any choice of k it moves.
      ratio("serve_ship_over_off", "off_ship", "off", false);
    }
  }
  return 0;
}
