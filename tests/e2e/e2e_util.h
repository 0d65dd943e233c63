// Helpers for the end-to-end tests: a child process whose output is collected line by line,
// free loopback ports, small HTTP calls, and the `specloop up` command line.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <condition_variable>
#include <fstream>
#include <functional>
#include <mutex>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>

#include "common/base/free_port.h"
#include "tests/testing/temp_dir.h"

namespace specloop {
namespace e2e {

using Clock = std::chrono::steady_clock;
using testing::TempDir;

inline int FreePort() { return FreeLoopbackPort(); }

inline std::string Shared() { return testing::SharedDir(); }
inline std::string TargetDir() { return Shared() + "/models/target-6m"; }
inline std::string DraftDir() { return Shared() + "/models/draft-mix-1m"; }


inline bool ProcessGone(pid_t pid) { return kill(pid, 0) != 0 && errno == ESRCH; }

// A child process (own process group) with stdout and stderr collected as lines. The
// destructor kills the whole group with SIGKILL if it is still running.
class Child {
 public:
  explicit Child(std::vector<std::string> argv, bool echo = true) : echo_(echo) {
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);
      dup2(out[1], STDOUT_FILENO);
      dup2(out[1], STDERR_FILENO);
      execvp(args[0], args.data());
      _exit(127);
    }
    close(out[1]);
    reader_ = std::thread([this, fd = out[0]] { ReadLines(fd); });
  }
  ~Child() {
    if (pid_ > 0 && !exited_) {
      kill(-pid_, SIGKILL);
      kill(pid_, SIGKILL);
      Wait(10);
    }
    if (reader_.joinable()) reader_.join();
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  void Signal(int sig) { kill(pid_, sig); }

  // Waits until a line at index >= *from matches `re`; returns it and moves *from past it.
  // Returns "" when the deadline passes or the output ends first.
  std::string WaitForLine(const std::string& re, double seconds, size_t* from = nullptr) {
    const std::regex r(re);
    size_t start = from ? *from : 0;
    std::unique_lock<std::mutex> lock(mu_);
    const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
    for (;;) {
      for (size_t i = start; i < lines_.size(); ++i) {
        if (std::regex_search(lines_[i], r)) {
          if (from) *from = i + 1;
          return lines_[i];
        }
      }
      start = lines_.size();
      if (eof_ || cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
        if (eof_ || Clock::now() >= deadline) return "";
      }
    }
  }

  // The first capture group of the first line matching `re` (waiting as WaitForLine).
  std::string Capture(const std::string& re, double seconds, size_t* from = nullptr) {
    const std::string line = WaitForLine(re, seconds, from);
    std::smatch m;
    const std::regex r(re);
    return std::regex_search(line, m, r) && m.size() > 1 ? m[1].str() : "";
  }

  size_t line_count() {
    std::lock_guard<std::mutex> lock(mu_);
    return lines_.size();
  }
  std::string Output() {
    std::lock_guard<std::mutex> lock(mu_);
    std::string all;
    for (const std::string& l : lines_) all += l + "\n";
    return all;
  }

  // Waits up to `seconds` for the exit; returns the waitpid status, or -1 on timeout.
  int Wait(double seconds) {
    if (exited_) return status_;
    const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
    for (;;) {
      const pid_t r = waitpid(pid_, &status_, WNOHANG);
      if (r == pid_) {
        exited_ = true;
        return status_;
      }
      if (Clock::now() >= deadline) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

 private:
  void ReadLines(int fd) {
    std::string partial;
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) != 0) {
      if (n < 0) {
        if (errno == EINTR) continue;
        break;
      }
      partial.append(buf, static_cast<size_t>(n));
      size_t nl;
      std::lock_guard<std::mutex> lock(mu_);
      while ((nl = partial.find('\n')) != std::string::npos) {
        lines_.push_back(partial.substr(0, nl));
        if (echo_) std::fprintf(stderr, "  | %s\n", lines_.back().c_str());
        partial.erase(0, nl + 1);
      }
      cv_.notify_all();
    }
    close(fd);
    std::lock_guard<std::mutex> lock(mu_);
    if (!partial.empty()) lines_.push_back(partial);
    eof_ = true;
    cv_.notify_all();
  }

  bool echo_;
  pid_t pid_ = -1;
  int status_ = 0;
  bool exited_ = false;
  std::thread reader_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> lines_;
  bool eof_ = false;
};

// GET http://127.0.0.1:port/path; returns the status (-1 when unreachable) and the body.
inline int HttpGet(int port, const std::string& path, std::string* body = nullptr) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_connection_timeout(2);
  cli.set_read_timeout(30);
  auto res = cli.Get(path);
  if (!res) return -1;
  if (body) *body = res->body;
  return res->status;
}

inline int HttpPost(int port, const std::string& path, const std::string& json,
                    std::string* body = nullptr) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_connection_timeout(2);
  cli.set_read_timeout(60);
  auto res = cli.Post(path, json, "application/json");
  if (!res) return -1;
  if (body) *body = res->body;
  return res->status;
}

// POSTs `body` (a JSON request with "stream": true) to `path` and calls on_data with each
// server-sent event's data as it arrives (what follows "data: ", "[DONE]" included). Returns
// whether the exchange completed (httplib's send: *error says why not); *res has the status.
inline bool PostStreaming(httplib::Client* cli, const std::string& path, const std::string& body,
                          const std::function<void(const std::string&)>& on_data,
                          httplib::Response* res, httplib::Error* error) {
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.set_header("Content-Type", "application/json");
  req.body = body;
  std::string pending;  // received bytes not yet split into events
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    pending.append(data, n);
    for (size_t end; (end = pending.find("\n\n")) != std::string::npos;) {
      if (pending.compare(0, 6, "data: ") == 0) on_data(pending.substr(6, end - 6));
      pending.erase(0, end + 2);
    }
    return true;
  };
  return cli->send(req, *res, *error);
}

// The sum of the samples of `family` in a Prometheus text exposition whose line contains
// `label` (every sample when empty); 0 when there is none. `family` may also be one whole
// series: MetricValue(text, "specloop_http_errors_total{code=\"401\"}").
inline double MetricValue(const std::string& text, const std::string& family,
                          const std::string& label = "") {
  double total = 0;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(family, 0) != 0 || line.size() <= family.size()) continue;
    const char next = line[family.size()];
    if (next != ' ' && next != '{') continue;
    if (!label.empty() && line.find(label) == std::string::npos) continue;
    total += std::strtod(line.c_str() + line.rfind(' ') + 1, nullptr);
  }
  return total;
}

// MetricValue() of GET /metrics on `port`; -1 when unreachable.
inline double ScrapeMetric(int port, const std::string& family, const std::string& label = "") {
  std::string text;
  if (HttpGet(port, "/metrics", &text) != 200) return -1;
  return MetricValue(text, family, label);
}

// Polls GET path until it answers 200 or `seconds` pass.
inline bool WaitHealthy(int port, const std::string& path, double seconds) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < deadline) {
    if (HttpGet(port, path) == 200) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// The first `n` prompts of /shared/prompts/<domain>.jsonl (each line a JSON object with a
// "prompt" field), as raw JSON strings ready to splice into a request body.
inline std::vector<std::string> PromptsJson(const std::string& domain, size_t n) {
  std::ifstream in(Shared() + "/prompts/" + domain + ".jsonl");
  std::vector<std::string> out;
  std::string line;
  const std::regex r("\"prompt\"\\s*:\\s*(\"(?:[^\"\\\\]|\\\\.)*\")");
  while (out.size() < n && std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, r)) out.push_back(m[1].str());
  }
  return out;
}

// `specloop up` on free ports in `data`, with light settings for a 2-core machine.
struct UpPorts {
  int serve = FreePort(), trainer_metrics = FreePort();
};
inline std::vector<std::string> UpCommand(const std::string& data, const UpPorts& p) {
  return {SPECLOOP_BINARY, "up", "--target", TargetDir(), "--draft", DraftDir(), "--data", data,
          "--port", std::to_string(p.serve), "--trainer-metrics-port",
          std::to_string(p.trainer_metrics), "--serve-arg=--max-batch=4",
          "--serve-arg=--http-threads=16"};
}

}  // namespace e2e
}  // namespace specloop
