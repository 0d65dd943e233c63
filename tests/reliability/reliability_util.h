// Helpers for the reliability tests: `specloop serve` as a child process, HTTP calls with
// headers, reading one series out of /metrics, and checkpoint directories a trainer would
// write. Process handling itself comes from tests/e2e/e2e_util.h.
#pragma once

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>

#include "common/channel/draft_channel.h"
#include "common/tokenizer/model_config.h"
#include "tests/e2e/e2e_util.h"
#include "tests/serve/test_util.h"

namespace specloop {
namespace reliability {

using e2e::Child;
using e2e::Clock;
using e2e::FreePort;
using e2e::HttpGet;
using e2e::MetricValue;
using e2e::ScrapeMetric;
using e2e::Shared;
using e2e::TempDir;
using serve_test::RunCommand;
using serve_test::ShellQuote;

inline std::string TargetDir() { return Shared() + "/models/target-6m"; }
inline std::string DraftDir() { return Shared() + "/models/draft-mix-1m"; }

// `PREFIX... specloop serve --target target-6m --draft draft-mix-1m --port 0 EXTRA...`, where
// PREFIX is a launcher such as {"env", "NAME=VALUE"}; Start() waits for the "listening on"
// line and reads the address and port.
class ServeProcess {
 public:
  explicit ServeProcess(std::vector<std::string> extra, std::vector<std::string> prefix = {}) {
    std::vector<std::string> argv = prefix;
    for (const std::string& a : {std::string(SPECLOOP_BINARY), std::string("serve"),
                                 std::string("--target"), TargetDir(), std::string("--draft"),
                                 DraftDir(), std::string("--port"), std::string("0"),
                                 std::string("--threads"), std::string("1")}) {
      argv.push_back(a);
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    child_ = std::make_unique<Child>(argv);
  }
  // Waits for the listening line; returns false (the output says why) when it does not come.
  bool Start(double seconds = 60) {
    const std::string line =
        child_->WaitForLine("listening on http://([0-9.]+):(\\d+)", seconds);
    std::smatch m;
    static const std::regex r("listening on http://([0-9.]+):(\\d+)");
    if (!std::regex_search(line, m, r)) return false;
    host_ = m[1].str();
    port_ = std::stoi(m[2].str());
    return true;
  }
  Child& child() { return *child_; }
  int port() const { return port_; }
  const std::string& host() const { return host_; }
  std::string Output() { return child_->Output(); }

 private:
  std::unique_ptr<Child> child_;
  std::string host_;
  int port_ = -1;
};

// POST with extra headers; returns the status (-1 when no response) and the body.
inline int Post(int port, const std::string& path, const std::string& body,
                const httplib::Headers& headers = {}, std::string* out = nullptr,
                int read_timeout_seconds = 60) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_connection_timeout(2);
  cli.set_read_timeout(read_timeout_seconds);
  auto res = cli.Post(path.c_str(), headers, body, "application/json");
  if (!res) return -1;
  if (out) *out = res->body;
  return res->status;
}

inline int Get(int port, const std::string& path, const httplib::Headers& headers = {},
               std::string* out = nullptr) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_connection_timeout(2);
  cli.set_read_timeout(30);
  auto res = cli.Get(path.c_str(), headers);
  if (!res) return -1;
  if (out) *out = res->body;
  return res->status;
}

// The served draft version from /health (-1 when unreachable).
inline int DraftVersion(int port) {
  std::string body;
  if (HttpGet(port, "/health", &body) != 200) return -1;
  std::smatch m;
  static const std::regex r("\"draft_version\":(\\d+)");
  return std::regex_search(body, m, r) ? std::stoi(m[1].str()) : -1;
}

// Polls `pred` every 50 ms until it holds or `seconds` pass.
template <typename Pred>
bool WaitFor(Pred pred, double seconds) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  while (!pred()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

// Writes ROOT/vNNNNNN as the trainer's CheckpointStore would (config.json and
// model.safetensors of `model_dir`, a complete meta.json) and points ROOT/latest at it.
inline bool WriteCheckpoint(const std::string& model_dir, const std::string& root,
                            uint64_t version) {
  namespace fs = std::filesystem;
  const std::string dir = root + "/" + VersionDirName(version);
  std::error_code ec;
  fs::create_directories(dir, ec);
  for (const char* f : {"config.json", "model.safetensors"}) {
    fs::copy_file(model_dir + "/" + f, dir + "/" + f, fs::copy_options::overwrite_existing, ec);
    if (ec) return false;
  }
  std::string sha;
  if (!Sha256File(dir + "/model.safetensors", &sha).ok()) return false;
  std::ofstream meta(dir + "/meta.json");
  meta << "{\"version\": " << version << ", \"parent\": 0, \"sha256\": \"" << sha
       << "\", \"objective\": \"jsd:0.5\", \"steps\": 0, \"samples\": 0, \"alpha_before\": {},"
       << " \"alpha_after\": {}, \"created\": \"2026-01-01T00:00:00Z\"}\n";
  std::ofstream latest(root + "/latest");
  latest << VersionDirName(version) << "\n";
  return meta.good() && latest.good();
}

// A completion body: greedy, `max_tokens` tokens, one of a few fixed prompts.
inline std::string CompletionBody(int i, int max_tokens = 8, const std::string& domain = "prose") {
  static const char* kPrompts[] = {"Once upon a time", "The little dog", "She opened the door",
                                   "In the morning"};
  return std::string("{\"prompt\":\"") + kPrompts[i % 4] + "\",\"max_tokens\":" +
         std::to_string(max_tokens) + ",\"temperature\":0,\"domain\":\"" + domain + "\"}";
}

// Clients that keep asking for completions until stopped, counting successes and failures.
class ClientLoop {
 public:
  ClientLoop(int port, int clients, int max_tokens = 8) {
    for (int c = 0; c < clients; ++c) {
      threads_.emplace_back([this, port, c, max_tokens] {
        for (int i = c; !stop_.load(); ++i) {
          std::string body;
          const int st = Post(port, "/v1/completions", CompletionBody(i, max_tokens), {}, &body);
          if (st == 200) {
            ok_.fetch_add(1);
          } else {
            std::lock_guard<std::mutex> lock(mu_);
            if (failed_++ == 0) first_failure_ = std::to_string(st) + " " + body;
          }
        }
      });
    }
  }
  ~ClientLoop() { Stop(); }
  void Stop() {
    stop_.store(true);
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  int ok() const { return ok_.load(); }
  int failed() {
    std::lock_guard<std::mutex> lock(mu_);
    return failed_;
  }
  std::string first_failure() {
    std::lock_guard<std::mutex> lock(mu_);
    return first_failure_;
  }
  // Waits until `n` more requests than now have succeeded.
  bool WaitMore(int n, double seconds) {
    const int target = ok() + n;
    return WaitFor([&] { return ok() >= target; }, seconds);
  }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int> ok_{0};
  std::mutex mu_;
  int failed_ = 0;
  std::string first_failure_;
  std::vector<std::thread> threads_;
};

// `specloop up` on free ports over `data`, with light settings for a 2-core machine.
struct UpSetup {
  int port = FreePort(), trainer_metrics = FreePort();
  std::string data;

  std::vector<std::string> Command(const std::vector<std::string>& extra) const {
    std::vector<std::string> argv = {
        SPECLOOP_BINARY, "up", "--target", TargetDir(), "--draft", DraftDir(), "--data", data,
        "--port", std::to_string(port), "--trainer-metrics-port",
        std::to_string(trainer_metrics), "--max-backoff", "1", "--serve-arg=--max-batch=4",
        "--serve-arg=--http-threads=16", "--serve-arg=--k=2", "--train-arg=--threads=1"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  }
  // Puts v000001 (draft-prose-1m; the worker starts on draft-mix-1m) into the checkpoints, so
  // the trainer resumes from it and announces it as soon as it starts.
  bool Seed() const {
    std::filesystem::create_directories(data + "/checkpoints");
    return WriteCheckpoint(Shared() + "/models/draft-prose-1m", data + "/checkpoints", 1);
  }
};

}  // namespace reliability
}  // namespace specloop
