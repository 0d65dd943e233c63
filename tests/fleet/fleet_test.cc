// A fleet on one machine (label fleet): `specloop up --workers 3` runs three servers behind
// one port (`specloop proxy`), a shipper each, a redis-server, an ingester and one trainer.
// Clients call the proxy only, under steady traffic in c (a domain the initial draft,
// draft-prose-1m, does not know):
// - every worker answers, records from all three reach the trainer's buffer, and a draft it
//   trains on their union is installed by all three;
// - SIGKILL of a shipper, of redis-server and of the trainer fails no request, and the trainer
//   resumes from its latest checkpoint (its live version does not go back);
// - SIGTERM of a worker (a rolling restart) and SIGKILL of a worker fail no request: what the
//   killed worker had in flight is answered by another (the proxy counts its lost requests),
//   and the restarted worker gets the current draft (a late joiner);
// - in the end each record of every worker was added to the stream exactly once, the trainer's
//   buffer holds them all, and the stream, all of it acknowledged, is trimmed empty.
#include <signal.h>

#include <atomic>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>

#include "buffer/keys.h"
#include "fleet/redis_client.h"
#include "tests/e2e/e2e_util.h"
#include "tests/fleet/fleet_util.h"

namespace specloop {
namespace {

using e2e::Child;
using e2e::Clock;

constexpr int kWorkers = 3;

// Polls `done` every 100 ms until it is true or `seconds` pass.
template <typename F>
bool WaitFor(double seconds, F done) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  while (!done()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return true;
}

long long StreamLength(int redis_port) {
  std::unique_ptr<RedisClient> c;
  RedisReply r;
  if (!RedisClient::Connect("127.0.0.1", redis_port, 2.0, &c).ok() ||
      !c->Command({"XLEN", "specloop:records"}, &r).ok()) {
    return -1;
  }
  return r.integer;
}

// Entries ever added to the stream (XINFO STREAM's entries-added, which the ingester's trims
// of acknowledged entries do not lower); -1 when unreadable.
long long StreamEntriesAdded(int redis_port) {
  std::unique_ptr<RedisClient> c;
  RedisReply r;
  if (!RedisClient::Connect("127.0.0.1", redis_port, 2.0, &c).ok() ||
      !c->Command({"XINFO", "STREAM", "specloop:records"}, &r).ok()) {
    return -1;
  }
  for (size_t i = 0; i + 1 < r.elements.size(); i += 2) {
    if (r.elements[i].str == "entries-added") return r.elements[i + 1].integer;
  }
  return -1;
}

// kClients clients asking the proxy for c completions in a loop until stopped; answers are
// counted by the worker that gave them (the proxy's X-Specloop-Upstream header). Any other
// outcome (an error status, a refused or lost connection) is a failure.
class Clients {
 public:
  Clients(int proxy_port, const std::vector<int>& worker_ports)
      : prompts_(e2e::PromptsJson("c", 16)), ok_(worker_ports.size()) {
    for (int p : worker_ports) upstreams_.push_back("127.0.0.1:" + std::to_string(p));
    for (int c = 0; c < kClients; ++c) {
      threads_.emplace_back([this, c, proxy_port] {
        for (size_t n = c; !stop_.load(); n += kClients) {
          const std::string req = "{\"prompt\":" + prompts_[n % prompts_.size()] +
                                  ",\"max_tokens\":24,\"domain\":\"c\"}";
          httplib::Client cli("127.0.0.1", proxy_port);
          cli.set_connection_timeout(2);
          cli.set_read_timeout(60);
          auto res = cli.Post("/v1/completions", req, "application/json");
          if (res && res->status == 200) {
            const std::string by = res->get_header_value("X-Specloop-Upstream");
            for (size_t i = 0; i < upstreams_.size(); ++i) {
              if (upstreams_[i] == by) ok_[i].fetch_add(1);
            }
            continue;
          }
          if (failed_.fetch_add(1) == 0) {
            std::lock_guard<std::mutex> lock(mu_);
            first_failure_ = res ? std::to_string(res->status) + " " + res->body
                                 : httplib::to_string(res.error());
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
      });
    }
  }
  ~Clients() { Stop(); }
  void Stop() {
    stop_.store(true);
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  int ok(int i) const { return ok_[i].load(); }
  int failed() const { return failed_.load(); }
  std::string first_failure() {
    std::lock_guard<std::mutex> lock(mu_);
    return first_failure_;
  }
  // Waits until worker i answered `n` more requests than now.
  bool WaitMore(int i, int n, double seconds) {
    const int target = ok(i) + n;
    return WaitFor(seconds, [&] { return ok(i) >= target; });
  }

 private:
  static constexpr int kClients = 4;
  const std::vector<std::string> prompts_;
  std::vector<std::string> upstreams_;
  std::vector<std::atomic<int>> ok_;
  std::atomic<int> failed_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::string first_failure_;
  std::vector<std::thread> threads_;
};

TEST(Fleet, ThreeWorkersOneTrainerThroughRedis) {
  e2e::TempDir tmp("specloop-fleet");
  const std::string data = tmp.Sub("data");
  const int trainer_port = e2e::FreePort();
  // k = 4 fixed, so every step drafts and the trainer sees blocks to learn from; restarts
  // after at most 1 s, so the test spends its time on the fleet and not on backoff.
  Child up({SPECLOOP_BINARY, "up", "--target", e2e::TargetDir(), "--draft",
            e2e::Shared() + "/models/draft-prose-1m", "--data", data, "--workers",
            std::to_string(kWorkers), "--port", "0", "--trainer-metrics-port",
            std::to_string(trainer_port), "--max-backoff", "1", "--serve-arg=--max-batch=4",
            "--serve-arg=--http-threads=8", "--serve-arg=--k=4"},
           /*echo=*/false);
  const std::string banner = up.WaitForLine("specloop up: data .* serving on", 30);
  ASSERT_FALSE(banner.empty()) << up.Output();
  std::vector<int> ports;  // the proxy's, then the workers'
  const std::regex url("http://127\\.0\\.0\\.1:(\\d+) ");
  for (auto it = std::sregex_iterator(banner.begin(), banner.end(), url);
       it != std::sregex_iterator(); ++it) {
    ports.push_back(std::stoi((*it)[1].str()));
  }
  ASSERT_EQ(ports.size(), static_cast<size_t>(kWorkers + 1)) << banner;
  const int proxy_port = ports[0];
  ports.erase(ports.begin());
  std::smatch m;
  ASSERT_TRUE(std::regex_search(banner, m, std::regex("Redis at 127\\.0\\.0\\.1:(\\d+)")))
      << banner;
  const int redis_port = std::stoi(m[1].str());
  ASSERT_FALSE(up.WaitForLine("specloop up: train is ready", 180).empty()) << up.Output();
  auto pid_of = [&](const std::string& child) {
    size_t from = 0;
    std::string pid, next;
    while (!(next = up.Capture("started " + child + " \\(pid (\\d+)\\)", 0, &from)).empty()) {
      pid = next;  // the latest start
    }
    return pid.empty() ? -1 : std::stoi(pid);
  };
  auto kill_and_wait_restart = [&](const std::string& child) {
    const int pid = pid_of(child);
    ASSERT_GT(pid, 0) << up.Output();
    size_t at = up.line_count();
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    ASSERT_FALSE(up.WaitForLine(child + " killed by signal 9", 20, &at).empty()) << up.Output();
    ASSERT_FALSE(up.WaitForLine("started " + child + " \\(pid", 20, &at).empty()) << up.Output();
    EXPECT_NE(pid_of(child), pid);
  };
  auto worker_version = [&](int i) {
    return e2e::ScrapeMetric(ports[i], "specloop_draft_version",
                             "worker=\"" + std::to_string(i + 1) + "\"");
  };
  auto trainer_version = [&] {
    return e2e::ScrapeMetric(trainer_port, "specloop_train_draft_version");
  };

  ASSERT_FALSE(up.WaitForLine("specloop up: proxy is ready", 60).empty()) << up.Output();
  Clients clients(proxy_port, ports);
  for (int i = 0; i < kWorkers; ++i) ASSERT_TRUE(clients.WaitMore(i, 2, 60)) << up.Output();

  // Records of all three workers reach the trainer's buffer (record keys name the worker).
  const std::string trainer_buffer = data + "/buffer";
  EXPECT_TRUE(WaitFor(60, [&] {
    std::set<uint32_t> seen;
    for (const auto& kv : fleet::Contents({trainer_buffer})) {
      uint64_t t, seq;
      uint32_t worker;
      if (ParseRecordKey(kv.first, &t, &worker, &seq)) seen.insert(worker);
    }
    return seen == std::set<uint32_t>{1, 2, 3};
  })) << up.Output();

  // A draft trained on their union is published and installed by every worker.
  ASSERT_TRUE(WaitFor(300, [&] { return trainer_version() >= 1; }))
      << "no draft published\n" << up.Output();
  const double published = trainer_version();
  std::printf("draft v%g published\n", published);
  for (int i = 0; i < kWorkers; ++i) {
    EXPECT_TRUE(WaitFor(60, [&] { return worker_version(i) >= published; }))
        << "worker " << i + 1 << " did not install v" << published << "\n" << up.Output();
  }

  // The shipper, the log server and the trainer die in turn; every worker keeps answering.
  kill_and_wait_restart("ship-2");
  for (int i = 0; i < kWorkers; ++i) EXPECT_TRUE(clients.WaitMore(i, 2, 60));
  const long long before_redis_kill = StreamEntriesAdded(redis_port);
  kill_and_wait_restart("redis");
  EXPECT_TRUE(WaitFor(60, [&] { return StreamEntriesAdded(redis_port) > before_redis_kill; }))
      << "shipping did not resume after redis-server restarted\n" << up.Output();
  const double before_trainer_kill = trainer_version();
  kill_and_wait_restart("train");
  ASSERT_TRUE(e2e::WaitHealthy(trainer_port, "/health", 60)) << up.Output();
  EXPECT_GE(trainer_version(), before_trainer_kill) << "the trainer did not resume";
  for (int i = 0; i < kWorkers; ++i) EXPECT_TRUE(clients.WaitMore(i, 2, 60));
  EXPECT_EQ(clients.failed(), 0) << clients.first_failure();

  // A worker stopped with SIGTERM (a rolling restart) finishes the requests it accepted; the
  // proxy sends the rest elsewhere until it is back.
  {
    const int pid = pid_of("serve-2");
    size_t at = up.line_count();
    ASSERT_EQ(kill(pid, SIGTERM), 0);
    ASSERT_FALSE(up.WaitForLine("serve-2 exited with status 0", 60, &at).empty()) << up.Output();
    ASSERT_FALSE(up.WaitForLine("started serve-2 \\(pid", 20, &at).empty()) << up.Output();
    ASSERT_TRUE(e2e::WaitHealthy(ports[1], "/health", 60)) << up.Output();
    EXPECT_TRUE(clients.WaitMore(1, 2, 60)) << up.Output();
    EXPECT_EQ(clients.failed(), 0) << clients.first_failure();
  }

  // A worker dies with requests in flight: the proxy has another worker answer them, and it
  // comes back with the current draft.
  kill_and_wait_restart("serve-3");
  ASSERT_TRUE(e2e::WaitHealthy(ports[2], "/health", 60)) << up.Output();
  EXPECT_TRUE(clients.WaitMore(2, 2, 60)) << up.Output();
  const double live = trainer_version();
  EXPECT_TRUE(WaitFor(60, [&] { return worker_version(2) >= live; }))
      << "the restarted worker did not get v" << live << "\n" << up.Output();
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(clients.WaitMore(i, 2, 60));
  clients.Stop();
  EXPECT_EQ(clients.failed(), 0) << clients.first_failure();
  const std::string worker3 = "upstream=\"127.0.0.1:" + std::to_string(ports[2]) + "\"";
  const double lost = e2e::ScrapeMetric(proxy_port, "specloop_proxy_upstream_errors_total",
                                        worker3 + ",kind=\"lost\"");
  const double refused = e2e::ScrapeMetric(proxy_port, "specloop_proxy_upstream_errors_total",
                                           worker3 + ",kind=\"connect\"");
  EXPECT_GE(lost + refused, 1) << "the proxy never met worker 3 down";
  std::printf("worker 3 SIGKILLed: the proxy retried %g requests it lost and %g it could not "
              "connect to; %d/%d/%d answered by workers 1/2/3; live draft v%g\n",
              lost, refused, clients.ok(0), clients.ok(1), clients.ok(2), live);

  // Every record the workers wrote was added to the stream once and is in the trainer's buffer;
  // the stream, all of it acknowledged, is trimmed empty.
  std::vector<std::string> worker_buffers;
  for (int i = 1; i <= kWorkers; ++i) {
    worker_buffers.push_back(data + "/worker-" + std::to_string(i) + "/buffer");
  }
  const auto written = fleet::Contents(worker_buffers);
  ASSERT_GT(written.size(), 0u);
  EXPECT_TRUE(WaitFor(90, [&] {
    return StreamEntriesAdded(redis_port) >= static_cast<long long>(written.size()) &&
           fleet::Contents({trainer_buffer}).size() >= written.size();
  })) << up.Output();
  EXPECT_EQ(StreamEntriesAdded(redis_port), static_cast<long long>(written.size()));
  EXPECT_TRUE(WaitFor(30, [&] { return StreamLength(redis_port) == 0; }))
      << StreamLength(redis_port) << " entries left in the stream\n" << up.Output();
  const auto ingested = fleet::Contents({trainer_buffer});
  size_t missing = 0;
  for (const auto& kv : written) {
    auto it = ingested.find(kv.first);
    if (it == ingested.end() || it->second != kv.second) ++missing;
  }
  EXPECT_EQ(missing, 0u) << "of " << written.size() << " records";
  EXPECT_EQ(ingested.size(), written.size());

  up.Signal(SIGINT);
  const int st = up.Wait(90);
  ASSERT_NE(st, -1) << "specloop up did not stop\n" << up.Output();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << up.Output();
}

}  // namespace
}  // namespace specloop
