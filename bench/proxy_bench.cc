// Proxy benchmark (issue 31): what one port in front of a fleet costs (fleet/front_proxy.h).
//   proxy_bench [--seconds 3] [--reps 3]
// A stand-in worker on loopback answers POST /v1/completions at once with a 1 KB body, so the
// figures are the proxy's own cost, not a model's. Arms, each run for --seconds with 1 and 16
// clients (keep-alive connections, as OpenAI clients use), alternated over --reps:
//   direct      clients call the worker
//   proxy       clients call the proxy in front of it
//   proxy_dead  the proxy's first worker refuses connections and is never marked down, so
//               half the requests meet a refused connect before the live worker answers
// JSON lines {"name", "params", "value", "unit"}: requests/s and p50 / p99 latency per arm
// (medians over reps), and proxy / direct. Serving answers ~5-20 requests/s per worker on
// this machine (bench/RESULTS.md, serve_bench): compare the proxy's requests/s with that.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>

#include "common/base/free_port.h"
#include "fleet/front_proxy.h"

namespace specloop {
namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

struct ArmResult {
  double requests_per_second = 0, p50_ms = 0, p99_ms = 0;
  int failed = 0;
};

// `clients` threads calling POST /v1/completions on `port` for `seconds`.
ArmResult Drive(int port, int clients, double seconds) {
  std::atomic<bool> stop{false};
  std::vector<std::vector<double>> latencies(clients);
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  const std::string body = "{\"prompt\":\"hello\",\"max_tokens\":16}";
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      httplib::Client cli("127.0.0.1", port);
      cli.set_keep_alive(true);
      cli.set_tcp_nodelay(true);  // else Nagle and delayed ACKs add ~40 ms per write pair
      while (!stop.load()) {
        const auto t0 = Clock::now();
        auto r = cli.Post("/v1/completions", body, "application/json");
        if (!r || r->status != 200) {
          if (failed.fetch_add(1) == 0) {
            std::fprintf(stderr, "proxy_bench: port %d: %s\n", port,
                         r ? std::to_string(r->status).c_str() : httplib::to_string(r.error()).c_str());
          }
          continue;
        }
        latencies[c].push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      }
    });
  }
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop.store(true);
  for (auto& t : threads) t.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<double> all;
  for (const auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  ArmResult r;
  r.requests_per_second = all.size() / elapsed;
  r.p50_ms = Quantile(all, 0.5);
  r.p99_ms = Quantile(all, 0.99);
  r.failed = failed.load();
  return r;
}

void Emit(const std::string& name, const std::string& arm, int clients, double value,
          const char* unit) {
  std::printf("{\"name\":\"proxy_bench.%s\",\"params\":{\"arm\":\"%s\",\"clients\":%d},"
              "\"value\":%.6g,\"unit\":\"%s\"}\n",
              name.c_str(), arm.c_str(), clients, value, unit);
}

class Proxy {
 public:
  explicit Proxy(FrontProxyOptions o) : proxy_(o) {
    if (!proxy_.Bind(&port_).ok()) std::exit(1);
    thread_ = std::thread([this] {
      if (!proxy_.Run().ok()) std::fprintf(stderr, "proxy_bench: the proxy failed\n");
    });
  }
  ~Proxy() {
    proxy_.Stop();
    thread_.join();
  }
  int port() const { return port_; }

 private:
  FrontProxy proxy_;
  int port_ = 0;
  std::thread thread_;
};

int Main(int argc, char** argv) {
  double seconds = 3;
  int reps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--seconds") == 0) seconds = std::atof(argv[i + 1]);
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::atoi(argv[i + 1]);
  }
  httplib::Server worker;
  worker.new_task_queue = [] { return new httplib::ThreadPool(64); };
  worker.set_tcp_nodelay(true);
  worker.set_keep_alive_max_count(1000000);  // httplib's 5 races its clients' next request
  const std::string answer(1024, 'x');
  worker.Post("/v1/completions", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(answer, "application/json");
  });
  const int worker_port = worker.bind_to_any_port("127.0.0.1");
  std::thread worker_thread([&] { worker.listen_after_bind(); });
  while (!worker.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const std::string live = "127.0.0.1:" + std::to_string(worker_port);
  FrontProxyOptions po;
  po.port = 0;
  po.upstreams = {live};
  Proxy proxy(po);
  po.upstreams = {"127.0.0.1:" + std::to_string(FreeLoopbackPort()), live};
  po.down_seconds = 0;  // every request may meet the dead worker
  Proxy proxy_dead(po);

  const std::vector<std::pair<std::string, int>> arms = {
      {"direct", worker_port}, {"proxy", proxy.port()}, {"proxy_dead", proxy_dead.port()}};
  for (int clients : {1, 16}) {
    std::map<std::string, std::vector<double>> rps, p50, p99;
    std::map<std::string, int> failed;
    for (int rep = 0; rep < reps; ++rep) {
      for (const auto& [arm, port] : arms) {
        const ArmResult r = Drive(port, clients, seconds);
        rps[arm].push_back(r.requests_per_second);
        p50[arm].push_back(r.p50_ms);
        p99[arm].push_back(r.p99_ms);
        failed[arm] += r.failed;
      }
    }
    for (const auto& [arm, port] : arms) {
      Emit("requests_per_second", arm, clients, Median(rps[arm]), "requests/s");
      Emit("p50_latency", arm, clients, Median(p50[arm]), "ms");
      Emit("p99_latency", arm, clients, Median(p99[arm]), "ms");
      Emit("failed_requests", arm, clients, failed[arm], "requests");
    }
    Emit("proxy_over_direct", "proxy", clients,
         Median(rps["proxy"]) / Median(rps["direct"]), "ratio");
  }
  worker.stop();
  worker_thread.join();
  return 0;
}

}  // namespace
}  // namespace specloop

int main(int argc, char** argv) { return specloop::Main(argc, argv); }
