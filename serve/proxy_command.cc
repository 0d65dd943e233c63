// `specloop proxy`: one port in front of serving workers (serve/front_proxy.h). `specloop up
// --workers N` runs it in front of its N servers. SIGINT/SIGTERM stop it after the requests
// in flight are answered.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <iostream>
#include <memory>
#include <thread>

#include "serve/commands.h"
#include "serve/front_proxy.h"

namespace specloop {

namespace {

int g_proxy_signal_pipe[2] = {-1, -1};  // as serve's: a watcher thread reads it and stops

void OnProxySignal(int) {
  const char b = 1;
  if (write(g_proxy_signal_pipe[1], &b, 1) < 0) {
  }
}

int RunProxy(const FrontProxyOptions& options) {
  FrontProxy proxy(options);
  int port = 0;
  Status s = proxy.Bind(&port);
  if (!s.ok()) {
    std::cerr << "specloop proxy: " << s.ToString() << "\n";
    return s.IsInvalidArgument() ? 2 : 1;
  }
  if (pipe(g_proxy_signal_pipe) != 0) {
    std::cerr << "specloop proxy: pipe failed\n";
    return 1;
  }
  struct sigaction sa = {};
  sa.sa_handler = OnProxySignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::printf("specloop proxy: listening on http://%s:%d (%zu workers:", options.host.c_str(),
              port, options.upstreams.size());
  for (const std::string& u : options.upstreams) std::printf(" %s", u.c_str());
  std::printf(")\n");
  std::fflush(stdout);
  std::thread watcher([&] {
    char b;
    while (read(g_proxy_signal_pipe[0], &b, 1) < 0 && errno == EINTR) {
    }
    proxy.Stop();
  });
  s = proxy.Run();
  OnProxySignal(0);  // wakes the watcher when Run() ended by itself
  watcher.join();
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  if (!s.ok()) {
    std::cerr << "specloop proxy: " << s.ToString() << "\n";
    return 1;
  }
  std::printf("specloop proxy: stopped\n");
  return 0;
}

}  // namespace

void AddProxyCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "proxy", "one port in front of serving workers: least loaded, retried elsewhere");
  auto o = std::make_shared<FrontProxyOptions>();
  cmd->add_option("--upstream", o->upstreams, "a worker, HOST:PORT (repeatable)")->required();
  cmd->add_option("--host", o->host, "bind address")->capture_default_str();
  cmd->add_option("--port", o->port, "port (0 = any free port)")->capture_default_str();
  cmd->add_option("--threads", o->threads, "handler threads (one per request in flight)")
      ->capture_default_str();
  cmd->add_option("--connect-timeout", o->connect_timeout_seconds,
                  "seconds to connect to a worker")
      ->capture_default_str();
  cmd->add_option("--upstream-timeout", o->upstream_read_timeout_seconds,
                  "longest wait for one read from a worker, seconds")
      ->capture_default_str();
  cmd->callback([o, exit_code] { *exit_code = RunProxy(*o); });
}

}  // namespace specloop
