// Soak: `specloop up` (server + trainer publishing drafts) under N concurrent clients for a
// long time. Every interval it prints JSON lines (name, params, value, unit): requests and
// errors in the interval, p50/p99 latency, resident memory of the server and the trainer
// (/proc/PID/statm), the served draft version (each worker's /health, the lowest of them; with
// several workers also each one's), the server's replay buffer size and RocksDB
// memory (memtables, table readers, block cache, from /metrics); at the end a summary with the
// RSS growth: the median RSS (5-s samples) over the last warm-up-long window against the
// median over the window right after the warm-up, and the peak.
//
// Every mode also prints soak_rss with params.process for every child of `up` (its log's
// "started NAME (pid N)" lines) and the same growth summary for each. Fleet mode (--fleet:
// `up --workers 2`, 30 minutes and a 5-minute warm-up unless given, traffic that moves from
// one domain to the next every --shift-minutes after a warm-up that visits every domain once)
// adds, every interval, the Redis stream's length, redis-server's used memory (INFO memory)
// and the trainer's ingested records.
//
//   soak_bench [--clients 32] [--minutes 20] [--interval 60] [--warmup-minutes 2]
//              [--max-tokens 32] [--data DIR] [--keep-data] [--up-arg ARG ...]
//              [--fleet] [--workers N] [--shift-minutes M]
//
// The trainer gets a loose gate by default (--eval-every 50, --min-gain -1,
// --max-domain-regression 1), so it publishes and the server swaps drafts during the run: the
// soak is about staying up and bounded, not about draft quality.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "fleet/redis_client.h"
#include "common/base/free_port.h"
#include "common/observe/process_metrics.h"
#include "common/tokenizer/model_config.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/e2e/e2e_util.h"

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

void Emit(const std::string& name, const json& params, double value, const std::string& unit) {
  std::cout << json{{"name", name}, {"params", params}, {"value", value}, {"unit", unit}}.dump()
            << std::endl;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

// Resident memory of `pid` in MiB (0 when unreadable).
double RssMiB(int pid) {
  return pid > 0 ? static_cast<double>(specloop::ResidentBytes(pid)) / (1 << 20) : 0;
}

// A "Field:  N kB" line of /proc/PID/status in MiB (RssAnon: heap and stacks; RssFile: mapped
// files such as the libraries' code pages); 0 when unreadable.
double StatusMiB(int pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (pid > 0 && std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1)) / 1024;
  }
  return 0;
}

// The last pid logged as "started NAME (pid N)" in `log`, or 0.
int ChildPid(const std::string& log, const std::string& name) {
  std::ifstream in(log);
  std::string line;
  int pid = 0;
  const std::regex r("started " + name + " \\(pid (\\d+)\\)");
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, r)) pid = std::stoi(m[1].str());
  }
  return pid;
}

// Every "started NAME (pid N)" of `log`: NAME -> its last pid.
std::map<std::string, int> ChildPids(const std::string& log) {
  std::ifstream in(log);
  std::string line;
  std::map<std::string, int> out;
  const std::regex r("started ([A-Za-z0-9_-]+) \\(pid (\\d+)\\)");
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, r)) out[m[1].str()] = std::stoi(m[2].str());
  }
  return out;
}

// The serving workers' ports `up` prints ("serving on URL (proxy, ...) over workers URL URL
// (status page ..."; one worker: "serving on URL (status page ..."); empty when absent.
std::vector<int> WorkerPorts(const std::string& log) {
  std::ifstream in(log);
  std::string line;
  while (std::getline(in, line)) {
    const size_t on = line.find("serving on ");
    const size_t status = line.find(" (status page", on == std::string::npos ? 0 : on);
    if (on == std::string::npos || status == std::string::npos) continue;
    std::string urls = line.substr(on, status - on);
    const size_t over = urls.find(" over workers ");
    if (over != std::string::npos) urls = urls.substr(over);
    std::vector<int> ports;
    static const std::regex port_re(":(\\d+)");
    for (std::sregex_iterator it(urls.begin(), urls.end(), port_re), end; it != end; ++it) {
      ports.push_back(std::stoi((*it)[1].str()));
    }
    return ports;
  }
  return {};
}

// The Redis address `up` prints ("records through Redis at HOST:PORT"); port 0 when absent.
int RedisPort(const std::string& log) {
  std::ifstream in(log);
  std::string line;
  const std::regex r("records through Redis at [0-9.]+:(\\d+)");
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, r)) return std::stoi(m[1].str());
  }
  return 0;
}

// XLEN of the record stream and redis-server's used_memory (MiB); -1 each when unreadable.
void RedisStream(int port, double* length, double* used_mib) {
  *length = *used_mib = -1;
  std::unique_ptr<specloop::RedisClient> c;
  specloop::RedisReply r;
  if (port <= 0 || !specloop::RedisClient::Connect("127.0.0.1", port, 2.0, &c).ok()) return;
  if (c->Command({"XLEN", "specloop:records"}, &r).ok() &&
      r.type == specloop::RedisReply::Type::kInteger) {
    *length = static_cast<double>(r.integer);
  }
  if (c->Command({"INFO", "memory"}, &r).ok()) {
    std::smatch m;
    static const std::regex used_re("used_memory:(\\d+)");
    if (std::regex_search(r.str, m, used_re)) *used_mib = std::stod(m[1].str()) / (1 << 20);
  }
}

// GET http://127.0.0.1:port/path with a fresh client; true on 200, the body in *body.
bool Get(int port, const std::string& path, std::string* body = nullptr) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_connection_timeout(2);
  cli.set_read_timeout(10);
  auto res = cli.Get(path.c_str());
  if (!res || res->status != 200) return false;
  if (body) *body = res->body;
  return true;
}


size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Prompts of every domain in shared/prompts (domain, text) that leave room for max_tokens in
// the target's context (longer ones would rightly get a 400).
std::vector<std::pair<std::string, std::string>> LoadPrompts(const std::string& shared,
                                                             int max_tokens) {
  const std::string target = shared + "/models/target-6m";
  std::unique_ptr<specloop::Tokenizer> tokenizer;
  specloop::ModelConfig config;
  if (!specloop::Tokenizer::Load(target, &tokenizer).ok() ||
      !specloop::ModelConfig::FromDir(target, &config).ok()) {
    return {};
  }
  std::vector<std::pair<std::string, std::string>> out;
  for (const char* d : {"prose", "python", "c", "legal", "docs"}) {
    std::ifstream in(shared + "/prompts/" + d + ".jsonl");
    std::string line;
    while (std::getline(in, line)) {
      json j = json::parse(line, nullptr, false);
      if (!j.is_object() || !j.contains("prompt") || !j["prompt"].is_string()) continue;
      const std::string prompt = j["prompt"].get<std::string>();
      const size_t tokens = tokenizer->Encode(prompt).size() + 1;  // + BOS
      if (tokens + static_cast<size_t>(max_tokens) <=
          static_cast<size_t>(config.max_model_len)) {
        out.emplace_back(d, prompt);
      }
    }
  }
  return out;
}

struct Window {
  std::mutex mu;
  std::vector<double> latencies;  // seconds, successful requests
  int64_t requests = 0, errors = 0;
  std::string first_error;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("specloop soak benchmark");
  int clients = 32, max_tokens = 32;
  double minutes = 20, interval = 60, warmup_minutes = 2;
  std::string binary = SPECLOOP_BINARY, shared = SPECLOOP_SHARED_DIR, data;
  bool keep_data = false, fleet = false;
  int workers = 1;
  double shift_minutes = 0;
  std::vector<std::string> up_args = {"--train-arg=--eval-every=50", "--train-arg=--min-gain=-1",
                                      "--train-arg=--max-domain-regression=1"};
  app.add_option("--clients", clients)->capture_default_str();
  app.add_option("--minutes", minutes)->capture_default_str();
  app.add_option("--interval", interval, "seconds per report")->capture_default_str();
  app.add_option("--warmup-minutes", warmup_minutes)->capture_default_str();
  app.add_option("--max-tokens", max_tokens)->capture_default_str();
  app.add_option("--binary", binary)->capture_default_str();
  app.add_option("--shared", shared)->capture_default_str();
  app.add_option("--data", data, "data dir (default: a fresh temporary one)");
  app.add_flag("--keep-data", keep_data);
  app.add_option("--up-arg", up_args, "extra `specloop up` arguments (replace the defaults)");
  auto* minutes_opt = app.get_option("--minutes");
  auto* warmup_opt = app.get_option("--warmup-minutes");
  app.add_flag("--fleet", fleet,
               "`up --workers 2` (unless --workers), 30 minutes, 5 of warm-up and domains "
               "shifting every 5 minutes unless given");
  auto* workers_opt = app.add_option("--workers", workers, "serving workers (up --workers)")
                          ->check(CLI::Range(1, 16))
                          ->capture_default_str();
  auto* shift_opt = app.add_option("--shift-minutes", shift_minutes,
                                   "traffic of one domain at a time, the next every M minutes "
                                   "(0: every domain mixed)")
                        ->check(CLI::NonNegativeNumber)
                        ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (fleet) {
    if (workers_opt->count() == 0) workers = 2;
    if (minutes_opt->count() == 0) minutes = 30;
    if (warmup_opt->count() == 0) warmup_minutes = 5;
    if (shift_opt->count() == 0) shift_minutes = 5;
  }

  const auto prompts = LoadPrompts(shared, max_tokens);
  if (prompts.empty()) {
    std::cerr << "soak_bench: no prompts (or no target-6m tokenizer) under " << shared << "\n";
    return 1;
  }
  if (data.empty()) {
    char tmpl[] = "/tmp/specloop-soak-XXXXXX";
    if (!mkdtemp(tmpl)) return 1;
    data = tmpl;
  }
  const std::string log = data + ".log";
  const int port = specloop::FreeLoopbackPort(), trainer_port = specloop::FreeLoopbackPort();
  std::vector<std::string> args = {binary, "up", "--target", shared + "/models/target-6m",
                                   "--draft", shared + "/models/draft-mix-1m", "--data",
                                   data + "/up", "--port", std::to_string(port),
                                   "--trainer-metrics-port", std::to_string(trainer_port)};
  if (workers > 1) args.insert(args.end(), {"--workers", std::to_string(workers)});
  args.insert(args.end(), up_args.begin(), up_args.end());
  const pid_t up = fork();
  if (up == 0) {
    std::vector<char*> a;
    for (std::string& s : args) a.push_back(s.data());
    a.push_back(nullptr);
    std::freopen(log.c_str(), "w", stdout);
    dup2(fileno(stdout), STDERR_FILENO);
    execv(a[0], a.data());
    _exit(127);
  }
  const json params = {{"clients", clients},       {"minutes", minutes},
                       {"max_tokens", max_tokens}, {"up_args", up_args},
                       {"workers", workers},       {"shift_minutes", shift_minutes}};
  // Prompts by domain, in LoadPrompts' order, for domain-shifting traffic.
  std::vector<std::string> domains;
  for (const auto& [d, text] : prompts) {
    if (domains.empty() || domains.back() != d) domains.push_back(d);
  }
  // Wait for the server and the trainer.
  const auto ready_deadline = Clock::now() + std::chrono::seconds(120);
  while (Clock::now() < ready_deadline && !(Get(port, "/health") && ChildPid(log, "train") > 0)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  if (!Get(port, "/health")) {
    std::cerr << "soak_bench: specloop up did not come up; see " << log << "\n";
    kill(up, SIGINT);
    waitpid(up, nullptr, 0);
    return 1;
  }

  Window window;
  std::atomic<bool> stop{false};
  const auto traffic_start = Clock::now();
  // The prompt a client sends as its i-th: any domain, or only the current phase's. With
  // shifting domains the warm-up visits every domain once (warmup / domains minutes each) and
  // the shifts start from the first domain after it: what a server keeps per domain (its
  // suffix index, its acceptance estimates, a new domain's prefixes in the KV cache) first
  // grows inside the warm-up, so the growth after it is not a new domain's first visit.
  auto pick = [&](size_t i) -> const std::pair<std::string, std::string>& {
    if (shift_minutes <= 0) return prompts[i % prompts.size()];
    const double m =
        std::chrono::duration<double>(Clock::now() - traffic_start).count() / 60.0;
    const size_t phase =
        m < warmup_minutes
            ? static_cast<size_t>(m / (warmup_minutes / static_cast<double>(domains.size())))
            : static_cast<size_t>((m - warmup_minutes) / shift_minutes);
    const std::string& d = domains[phase % domains.size()];
    size_t first = 0, count = 0;
    for (size_t j = 0; j < prompts.size(); ++j) {
      if (prompts[j].first != d) continue;
      if (count++ == 0) first = j;
    }
    return prompts[first + i % count];
  };
  std::atomic<int64_t> total_requests{0}, total_errors{0};
  std::vector<double> all_latencies;
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      for (size_t i = static_cast<size_t>(c) * 7919; !stop.load(); ++i) {
        const auto& [domain, prompt] = pick(i);
        const std::string body = json{{"prompt", prompt}, {"max_tokens", max_tokens},
                                      {"temperature", 0.8}, {"top_p", 0.95},
                                      {"domain", domain}}
                                     .dump();
        // A fresh client (one connection) per request, as a stream of independent users.
        httplib::Client cli("127.0.0.1", port);
        cli.set_connection_timeout(5);
        cli.set_read_timeout(300);
        const auto start = Clock::now();
        auto res = cli.Post("/v1/completions", body, "application/json");
        const double s = std::chrono::duration<double>(Clock::now() - start).count();
        std::lock_guard<std::mutex> lock(window.mu);
        window.requests++;
        if (res && res->status == 200) {
          window.latencies.push_back(s);
        } else {
          window.errors++;
          if (window.first_error.empty()) {
            window.first_error = res ? std::to_string(res->status) + " " + res->body
                                     : "no response: " + httplib::to_string(res.error());
          }
        }
      }
    });
  }

  const auto start = Clock::now();
  const auto end = start + std::chrono::duration<double>(minutes * 60);
  Emit("soak_rss_serve_start", params, RssMiB(ChildPid(log, "serve")), "MiB");
  Emit("soak_rss_train_start", params, RssMiB(ChildPid(log, "train")), "MiB");
  // RSS every 5 s. A single reading moves by +-10% with what is in flight (batches, a draft
  // being loaded, a training step), so growth compares medians over two windows as long as
  // the warm-up: the one right after it and the last one.
  struct RssSample {
    double t, serve, train;
  };
  std::vector<RssSample> rss_samples;
  // Every child's (and redis-server's used memory, as "redis_used"): name -> (t, MiB).
  std::mutex all_mu;
  std::map<std::string, std::vector<std::pair<double, double>>> all_rss;
  const int redis_port = workers > 1 ? RedisPort(log) : 0;
  std::thread rss_sampler([&] {
    while (!stop.load()) {
      const double t = std::chrono::duration<double>(Clock::now() - start).count();
      rss_samples.push_back({t, RssMiB(ChildPid(log, "serve")), RssMiB(ChildPid(log, "train"))});
      {
        std::lock_guard<std::mutex> lock(all_mu);
        for (const auto& [name, pid] : ChildPids(log)) all_rss[name].push_back({t, RssMiB(pid)});
        if (redis_port > 0) {
          double length, used;
          RedisStream(redis_port, &length, &used);
          if (used >= 0) all_rss["redis_used"].push_back({t, used});
        }
      }
      for (int i = 0; i < 50 && !stop.load(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
  });
  int minute = 0;
  while (Clock::now() < end) {
    const auto next = std::min(end, start + std::chrono::duration<double>((minute + 1) * interval));
    std::this_thread::sleep_until(next);
    ++minute;
    std::vector<double> lat;
    int64_t requests, errors;
    {
      std::lock_guard<std::mutex> lock(window.mu);
      lat.swap(window.latencies);
      requests = window.requests;
      errors = window.errors;
      window.requests = window.errors = 0;
    }
    total_requests += requests;
    total_errors += errors;
    all_latencies.insert(all_latencies.end(), lat.begin(), lat.end());
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    const double rss_serve = RssMiB(ChildPid(log, "serve"));
    const double rss_train = RssMiB(ChildPid(log, "train"));
    // The draft version each worker serves (its /health; a fleet's proxy has none): the
    // lowest of them, -1 when a worker's is unreadable.
    static const std::regex version_re("\"draft_version\":(\\d+)");
    std::vector<double> worker_versions;
    for (int worker_port : WorkerPorts(log)) {
      std::string health;
      std::smatch m;
      worker_versions.push_back(Get(worker_port, "/health", &health) &&
                                        std::regex_search(health, m, version_re)
                                    ? std::stod(m[1].str())
                                    : -1);
    }
    const double version = worker_versions.empty()
                               ? -1
                               : *std::min_element(worker_versions.begin(), worker_versions.end());
    json p = params;
    p["interval"] = minute;
    p["elapsed_s"] = std::round(elapsed);
    Emit("soak_requests", p, static_cast<double>(requests), "requests");
    Emit("soak_errors", p, static_cast<double>(errors), "requests");
    Emit("soak_latency_p50", p, Percentile(lat, 0.5), "s");
    Emit("soak_latency_p99", p, Percentile(lat, 0.99), "s");
    Emit("soak_rss_serve", p, rss_serve, "MiB");
    Emit("soak_rss_train", p, rss_train, "MiB");
    Emit("soak_draft_version", p, version, "version");
    for (size_t w = 0; worker_versions.size() > 1 && w < worker_versions.size(); ++w) {
      json q = p;
      q["worker"] = w + 1;
      Emit("soak_worker_draft_version", q, worker_versions[w], "version");
    }
    for (const auto& [name, pid] : ChildPids(log)) {
      json q = p;
      q["process"] = name;
      Emit("soak_rss", q, RssMiB(pid), "MiB");
    }
    if (redis_port > 0) {
      double length, used;
      RedisStream(redis_port, &length, &used);
      Emit("soak_stream_entries", p, length, "entries");
      Emit("soak_redis_used_memory", p, used, "MiB");
    }
    // What the trainer's memory is: anonymous (heap) or mapped files, and its held-out set,
    // which fills up to its cap (max_heldout_per_domain records per domain).
    const int train_pid = ChildPid(log, "train");
    Emit("soak_rss_train_anon", p, StatusMiB(train_pid, "RssAnon"), "MiB");
    Emit("soak_rss_train_file", p, StatusMiB(train_pid, "RssFile"), "MiB");
    std::string train_metrics;
    if (Get(trainer_port, "/metrics", &train_metrics)) {
      Emit("soak_train_heldout_records", p,
           specloop::e2e::MetricValue(train_metrics, "specloop_train_heldout_records"),
           "records");
    }
    // Where the server's buffer memory is (RocksDB), to tell it from the rest of the RSS.
    std::string metrics;
    if (Get(port, "/metrics", &metrics)) {
      for (const char* kind : {"memtables", "table_readers", "block_cache"}) {
        Emit(std::string("soak_buffer_") + kind, p,
             specloop::e2e::MetricValue(metrics, "specloop_buffer_memory_bytes",
                                        std::string("kind=\"") + kind + "\"") / (1 << 20),
             "MiB");
      }
      Emit("soak_buffer_size", p,
           specloop::e2e::MetricValue(metrics, "specloop_buffer_bytes") / (1 << 20), "MiB");
    }
  }
  stop.store(true);
  for (std::thread& t : threads) t.join();
  rss_sampler.join();
  {
    std::lock_guard<std::mutex> lock(window.mu);
    total_requests += window.requests;
    total_errors += window.errors;
    all_latencies.insert(all_latencies.end(), window.latencies.begin(), window.latencies.end());
  }
  const double warm_s = warmup_minutes * 60, end_s = minutes * 60;
  auto window_percentile = [&](double from, double to, double RssSample::*field, double q) {
    std::vector<double> v;
    for (const RssSample& r : rss_samples) {
      if (r.t >= from && r.t <= to && r.*field > 0) v.push_back(r.*field);
    }
    return Percentile(v, q);
  };
  Emit("soak_total_requests", params, static_cast<double>(total_requests), "requests");
  Emit("soak_total_errors", params, static_cast<double>(total_errors), "requests");
  Emit("soak_latency_p99_all", params, Percentile(all_latencies, 0.99), "s");
  for (const auto& [name, field] : {std::pair{"serve", &RssSample::serve},
                                    std::pair{"train", &RssSample::train}}) {
    const double warm = window_percentile(warm_s, 2 * warm_s, field, 0.5);
    const double last = window_percentile(end_s - warm_s, end_s, field, 0.5);
    // The floor (10th percentile): what the process holds between its transient peaks, which
    // a leak raises; the median also moves with how much of the time is spent at a peak.
    const double warm_floor = window_percentile(warm_s, 2 * warm_s, field, 0.1);
    const double last_floor = window_percentile(end_s - warm_s, end_s, field, 0.1);
    double peak = 0;
    for (const RssSample& r : rss_samples) {
      if (r.t >= warm_s) peak = std::max(peak, r.*field);
    }
    const std::string n = std::string("soak_rss_") + name;
    Emit(n + "_after_warmup", params, warm, "MiB");
    Emit(n + "_end", params, last, "MiB");
    Emit(n + "_peak", params, peak, "MiB");
    Emit(n + "_growth", params, warm > 0 ? 100 * (last / warm - 1) : 0, "%");
    Emit(n + "_floor_growth", params, warm_floor > 0 ? 100 * (last_floor / warm_floor - 1) : 0,
         "%");
  }
  // The same growth summary for every child (and redis-server's used memory).
  for (const auto& [name, samples] : all_rss) {
    auto pct = [&](double from, double to, double q) {
      std::vector<double> v;
      for (const auto& [t, mib] : samples) {
        if (t >= from && t <= to && mib > 0) v.push_back(mib);
      }
      return Percentile(v, q);
    };
    const double warm = pct(warm_s, 2 * warm_s, 0.5), last = pct(end_s - warm_s, end_s, 0.5);
    double peak = 0;
    for (const auto& [t, mib] : samples) {
      if (t >= warm_s) peak = std::max(peak, mib);
    }
    json q = params;
    q["process"] = name;
    Emit("soak_process_rss_after_warmup", q, warm, "MiB");
    Emit("soak_process_rss_end", q, last, "MiB");
    Emit("soak_process_rss_peak", q, peak, "MiB");
    Emit("soak_process_rss_growth", q, warm > 0 ? 100 * (last / warm - 1) : 0, "%");
  }
  if (!window.first_error.empty()) std::cerr << "first error: " << window.first_error << "\n";

  // The trainer's work over the soak, so that a change to its memory can be weighed against
  // the steps it costs.
  std::string train_metrics;
  if (Get(trainer_port, "/metrics", &train_metrics)) {
    Emit("soak_train_steps", params,
         specloop::e2e::MetricValue(train_metrics, "specloop_train_steps_total"), "steps");
  }
  kill(up, SIGINT);
  int status = 0;
  waitpid(up, &status, 0);
  std::string text;
  {
    std::ifstream in(log);
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  Emit("soak_child_restarts", params, static_cast<double>(Count(text, "restarting in")),
       "restarts");
  Emit("soak_drafts_published", params, static_cast<double>(Count(text, "published v")),
       "versions");
  Emit("soak_draft_swaps", params, static_cast<double>(Count(text, "fetching draft v")),
       "fetches");
  if (!keep_data) {
    std::error_code ec;
    std::filesystem::remove_all(data, ec);
  }
  std::cerr << "soak_bench: log in " << log << "\n";
  return total_errors == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
