// `specloop proxy`: one port in front of serving workers (fleet/front_proxy.h). `specloop up
// --workers N` runs it in front of its N servers. SIGINT/SIGTERM stop it after the requests
// in flight are answered.
#include <cstdio>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "fleet/front_proxy.h"
#include "fleet/signal_watcher.h"

namespace specloop {

namespace {

int RunProxy(const FrontProxyOptions& options) {
  FrontProxy proxy(options);
  int port = 0;
  Status s = proxy.Bind(&port);
  if (!s.ok()) {
    std::cerr << "specloop proxy: " << s.ToString() << "\n";
    return s.IsInvalidArgument() ? 2 : 1;
  }
  std::printf("specloop proxy: listening on http://%s:%d (%zu workers:", options.host.c_str(),
              port, options.upstreams.size());
  for (const std::string& u : options.upstreams) std::printf(" %s", u.c_str());
  std::printf(")\n");
  std::fflush(stdout);
  {
    SignalWatcher signals;
    s = signals.Start([&proxy] { proxy.Stop(); });
    if (s.ok()) s = proxy.Run();
  }
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
