// KV cache benchmark (the paged KV cache and prefix caching, issue 30) on `--target` (default
// target-wide-46m) / draft-mix-1m, at the server's defaults but for the setting named (every
// core, no logging), over loopback HTTP. Two modes:
//
//   prefix (the stack in-process): requests sharing a `--prefix`-token prompt prefix (prose
//     corpus text, a new one each repetition), each with its own short suffix (the start of a
//     domain prompt), sent one after another to a server with prefix caching (the default)
//     and to one without, in alternating order; greedy, `--tokens` each. Per arm the first request's time to first
//     token and the later ones' median; the figure is first / later with the cache (the later
//     ones compute their suffix alone), beside the same ratio without it (~1). Also whether the
//     two servers' outputs are byte-identical, and the cache's hit rate.
//   memory: `--clients` concurrent requests (prose corpus text cut to `--prompt` tokens,
//     `--tokens` each at temperature 0.8) against `specloop serve --kv-cache-mb MB --no-log`
//     (a child process: its resident set alone, sampled every 10 ms from /proc). The figure is
//     the peak's growth over the resident set of the started, idle server, against the
//     budget; also failures (must be 0), preemptions, and the memory the requests would need
//     unbounded.
//
// JSON lines {"name", "params", "value", "unit"}. Usage:
//   kv_cache_bench prefix [--shared DIR] [--target NAME] [--reps N] [--requests N]
//                         [--prefix N] [--tokens N]
//   kv_cache_bench memory [--shared DIR] [--target NAME] [--kv-cache-mb MB] [--clients N]
//                         [--prompt N] [--tokens N]
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <mutex>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "bench/bench_util.h"
#include "common/model/threads.h"
#include "serve/http_server.h"
#include "tests/e2e/e2e_util.h"

namespace specloop {
namespace {

using bench::Emit;
using bench::Median;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

// One serving stack on a free loopback port, stopped in the destructor.
class Stack {
 public:
  Stack(const LlamaModel* target, std::unique_ptr<LlamaModel> draft, const Tokenizer* tokenizer,
        const std::string& name, const SchedulerOptions& options) {
    (void)ServingMetrics::Create(ServingMetricsOptions(), &metrics_);
    scheduler_ = std::make_unique<Scheduler>(target, std::move(draft), tokenizer, metrics_.get(),
                                             nullptr, options);
    Status s = scheduler_->Start();
    if (!s.ok()) {
      std::cerr << "kv_cache_bench: " << s.ToString() << "\n";
      std::exit(1);
    }
    HttpServerOptions ho;
    ho.port = 0;
    ho.model_name = name;
    server_ = std::make_unique<HttpServer>(ho, scheduler_.get(), metrics_.get(), tokenizer,
                                           &target->config(), nullptr, nullptr);
    if (!server_->Bind(&port_).ok()) std::exit(1);
    thread_ = std::thread([this] { (void)server_->Run(); });
  }
  ~Stack() {
    server_->Stop();
    thread_.join();
    scheduler_->Stop();
  }
  int port() const { return port_; }
  double Metric(const std::string& family) {
    return e2e::MetricValue(metrics_->Render(nullptr, nullptr), family);
  }

 private:
  std::unique_ptr<ServingMetrics> metrics_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
  int port_ = 0;
};

struct Reply {
  int status = -1;
  std::string text;
  double ttft = 0;  // seconds to the first text event
};

// One streaming completion.
Reply Stream(int port, const json& body) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(600, 0);
  Reply out;
  const auto t0 = Clock::now();
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  const bool sent = e2e::PostStreaming(
      &cli, "/v1/completions", body.dump(),
      [&](const std::string& data) {
        const json j = json::parse(data, nullptr, false);
        if (!j.is_object() || !j.contains("choices")) return;
        const std::string text = j["choices"][0]["text"];
        if (!text.empty() && out.text.empty()) {
          out.ttft = std::chrono::duration<double>(Clock::now() - t0).count();
        }
        out.text += text;
      },
      &res, &error);
  if (sent) out.status = res.status;
  return out;
}

// Prose corpus text from `offset` characters on, cut to `tokens` tokens.
std::string CorpusText(const std::string& shared, const Tokenizer& tokenizer, size_t offset,
                       int tokens) {
  std::ifstream in(shared + "/corpus/prose/valid.txt");
  in.seekg(static_cast<std::streamoff>(offset));
  std::string text(static_cast<size_t>(tokens) * 8, '\0');
  in.read(&text[0], static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  std::vector<int> ids = tokenizer.Encode(text);
  ids.resize(std::min<size_t>(ids.size(), tokens));
  return tokenizer.Decode(ids);
}

// A process's resident set from its /proc/PID/statm.
double ResidentMb(const std::string& statm) {
  std::ifstream in(statm);
  long pages = 0, resident = 0;
  in >> pages >> resident;
  return static_cast<double>(resident) * sysconf(_SC_PAGESIZE) / (1 << 20);
}

struct Args {
  std::string shared = SPECLOOP_SHARED_DIR, target = "target-wide-46m";
  int reps = 5, requests = 6, prefix = 500, tokens = -1;  // tokens: 32 prefix, 256 memory
  double kv_cache_mb = 64;
  int clients = 64, prompt = 256;
};

int Prefix(const Args& a, const LlamaModel& target, const Tokenizer& tokenizer) {
  std::vector<std::string> suffixes;
  for (const std::string domain : {"python", "legal", "c", "docs", "prose"}) {
    std::ifstream in(a.shared + "/prompts/" + domain + ".jsonl");
    std::string line;
    for (int n = 0; n < 4 && std::getline(in, line); ++n) {
      suffixes.push_back(json::parse(line)["prompt"].get<std::string>().substr(0, 60));
    }
  }
  SchedulerOptions uncached;
  uncached.prefix_caching = false;
  Stack arms[2] = {
      {&target, bench::LoadOrDie(a.shared + "/models/draft-mix-1m"), &tokenizer, a.target,
       SchedulerOptions()},
      {&target, bench::LoadOrDie(a.shared + "/models/draft-mix-1m"), &tokenizer, a.target,
       uncached}};
  auto body = [&](const std::string& prompt) {
    return json{{"prompt", prompt}, {"max_tokens", a.tokens}, {"temperature", 0},
                {"stream", true},   {"ignore_eos", true},     {"domain", "prose"}};
  };
  for (Stack& arm : arms) (void)Stream(arm.port(), body(suffixes[0]));  // warm-up
  std::vector<double> first[2], later[2], ratio[2];
  int identical = 0, compared = 0, failures = 0;
  for (int r = 0; r < a.reps; ++r) {
    const std::string prefix = CorpusText(a.shared, tokenizer, 20000 * (r + 1), a.prefix);
    std::vector<std::string> texts[2];
    for (int order = 0; order < 2; ++order) {
      const int arm = (order + r) % 2;
      std::vector<double> ttfts;
      for (int i = 0; i < a.requests; ++i) {
        const std::string& suffix = suffixes[(r * a.requests + i) % suffixes.size()];
        const Reply reply = Stream(arms[arm].port(), body(prefix + "\n\n" + suffix));
        if (reply.status != 200) ++failures;
        ttfts.push_back(reply.ttft);
        texts[arm].push_back(reply.text);
      }
      first[arm].push_back(ttfts[0]);
      later[arm].push_back(Median({ttfts.begin() + 1, ttfts.end()}));
      ratio[arm].push_back(first[arm].back() / later[arm].back());
    }
    for (int i = 0; i < a.requests; ++i) {
      ++compared;
      identical += texts[0][i] == texts[1][i];
    }
  }
  const json params = {{"target", a.target}, {"prefix_tokens", a.prefix},
                       {"requests", a.requests}, {"tokens", a.tokens}, {"reps", a.reps}};
  const char* names[2] = {"cached", "uncached"};
  for (int arm = 0; arm < 2; ++arm) {
    Emit(std::string("kv_prefix_ttft_first_") + names[arm], params, Median(first[arm]) * 1e3,
         "ms");
    Emit(std::string("kv_prefix_ttft_later_") + names[arm], params, Median(later[arm]) * 1e3,
         "ms");
    Emit(std::string("kv_prefix_ttft_first_over_later_") + names[arm], params,
         Median(ratio[arm]), "ratio");
  }
  const double queries = arms[0].Metric("specloop_prefix_cache_queries_total");
  Emit("kv_prefix_cache_hit_rate", params,
       queries > 0 ? arms[0].Metric("specloop_prefix_cache_hits_total") / queries : 0, "ratio");
  Emit("kv_prefix_outputs_identical", params, static_cast<double>(identical) / compared,
       "ratio");
  Emit("kv_prefix_failures", params, failures, "requests");
  return 0;
}

int Memory(const Args& a, const LlamaModel& target, const Tokenizer& tokenizer) {
  std::vector<std::string> prompts;
  for (int c = 0; c < a.clients; ++c) {
    prompts.push_back(CorpusText(a.shared, tokenizer, 3000 * c, a.prompt - 1));  // BOS added
  }
  // The server as a user runs it, its own process: its resident set alone is measured.
  const int port = e2e::FreePort();
  const std::string kv_mb = std::to_string(a.kv_cache_mb);
  e2e::Child server({SPECLOOP_BINARY, "serve", "--target", a.shared + "/models/" + a.target,
                     "--draft", a.shared + "/models/draft-mix-1m", "--port",
                     std::to_string(port), "--no-log", "--kv-cache-mb", kv_mb},
                    /*echo=*/false);
  if (server.WaitForLine("listening on", 120).empty()) {
    std::cerr << "kv_cache_bench: specloop serve did not start\n" << server.Output();
    return 1;
  }
  const std::string statm = "/proc/" + std::to_string(server.pid()) + "/statm";
  const double started = ResidentMb(statm);
  std::atomic<bool> sampling{true};
  std::atomic<double> peak{started};
  std::thread sampler([&] {
    while (sampling.load()) {
      const double mb = ResidentMb(statm);
      if (mb > peak.load()) peak = mb;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  int failures = 0, tokens = 0;
  std::mutex mu;
  std::vector<std::thread> clients;
  const auto t0 = Clock::now();
  for (int c = 0; c < a.clients; ++c) {
    clients.emplace_back([&, c] {
      const json body = {{"prompt", prompts[c]}, {"max_tokens", a.tokens}, {"temperature", 0.8},
                         {"seed", c},            {"stream", true},        {"ignore_eos", true},
                         {"domain", "prose"}};
      const Reply reply = Stream(port, body);
      std::lock_guard<std::mutex> lock(mu);
      if (reply.status != 200 || reply.text.empty()) ++failures;
      tokens += reply.status == 200 ? a.tokens : 0;
    });
  }
  for (auto& t : clients) t.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  sampling = false;
  sampler.join();
  std::string metrics;
  (void)e2e::HttpGet(port, "/metrics", &metrics);
  const double preemptions = e2e::MetricValue(metrics, "specloop_preemptions_total");
  const double bytes_per_position =
      static_cast<double>(target.CacheBlockBytes() +
                          bench::LoadOrDie(a.shared + "/models/draft-mix-1m")->CacheBlockBytes()) /
      KVBlockPool::kBlockTokens;
  const json params = {{"target", a.target}, {"kv_cache_mb", a.kv_cache_mb},
                       {"clients", a.clients}, {"prompt_tokens", a.prompt},
                       {"tokens", a.tokens}};
  Emit("kv_memory_resident_started", params, started, "MiB");
  Emit("kv_memory_resident_peak", params, peak.load(), "MiB");
  Emit("kv_memory_growth", params, peak.load() - started, "MiB");
  Emit("kv_memory_growth_over_budget", params, (peak.load() - started) / a.kv_cache_mb,
       "ratio");
  Emit("kv_memory_unbounded_need", params,
       bytes_per_position * a.clients * (a.prompt + a.tokens) / (1 << 20), "MiB");
  Emit("kv_memory_failures", params, failures, "requests");
  Emit("kv_memory_preemptions", params, preemptions, "sequences");
  Emit("kv_memory_tokens_per_second", params, tokens / seconds, "tokens/s");
  return 0;
}

}  // namespace
}  // namespace specloop

int main(int argc, char** argv) {
  using namespace specloop;
  if (argc < 2 || (std::strcmp(argv[1], "prefix") && std::strcmp(argv[1], "memory"))) {
    std::cerr << "usage: kv_cache_bench prefix|memory [--flag value ...]\n";
    return 2;
  }
  Args a;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    const char* v = argv[i + 1];
    if (f == "--shared") a.shared = v;
    else if (f == "--target") a.target = v;
    else if (f == "--reps") a.reps = std::atoi(v);
    else if (f == "--requests") a.requests = std::max(2, std::atoi(v));
    else if (f == "--prefix") a.prefix = std::atoi(v);
    else if (f == "--tokens") a.tokens = std::atoi(v);
    else if (f == "--kv-cache-mb") a.kv_cache_mb = std::atof(v);
    else if (f == "--clients") a.clients = std::atoi(v);
    else if (f == "--prompt") a.prompt = std::atoi(v);
    else {
      std::cerr << "kv_cache_bench: unknown flag " << f << "\n";
      return 2;
    }
  }
  const bool prefix = std::strcmp(argv[1], "prefix") == 0;
  if (a.tokens < 0) a.tokens = prefix ? 32 : 256;
  const std::string target_dir = a.shared + "/models/" + a.target;
  std::unique_ptr<LlamaModel> target = bench::LoadOrDie(target_dir);
  std::unique_ptr<Tokenizer> tokenizer;
  if (!Tokenizer::Load(target_dir, &tokenizer).ok()) return 1;
  SetComputeThreads(0);
  return prefix ? Prefix(a, *target, *tokenizer) : Memory(a, *target, *tokenizer);
}
