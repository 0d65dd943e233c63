// `specloop up`: the one-command start (DESIGN.md section 1). Runs `specloop serve` and
// `specloop train` as child processes of this one, on loopback endpoints and one data dir:
//
//   DATA/buffer        the server's replay buffer, read by the trainer as a secondary
//   DATA/checkpoints   the trainer's versioned drafts (a restarted trainer resumes from latest)
//   DATA/drafts        where the server unpacks fetched drafts
//
// The server starts first; the trainer starts once the server listens (the buffer exists
// then). A child that dies is restarted with exponential backoff (0.5 s doubling to 30 s);
// the other keeps running, so the server goes on answering while its trainer restarts and
// then follows the new trainer (it asks for the latest draft when it reconnects).
// SIGINT/SIGTERM stop both children (SIGTERM, SIGKILL after 20 s); exit 0 when both stopped
// cleanly. Ports given as 0 are chosen once at start and kept across restarts. With
// --no-train only the server runs, with its draft fixed.
//
// Cores: the server and the trainer share the machine. Unless told otherwise (--threads, or
// --serve-arg=--threads / --train-arg=--threads), the trainer gets one compute thread and the
// server every other core this process may run on, at least one (on 2 cores: 1 and 1); with
// --no-train the server gets every core.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "common/base/free_port.h"
#include "common/model/threads.h"
#include "serve/commands.h"
#include "serve/supervisor.h"

namespace specloop {

namespace {

struct UpArgs {
  std::string target, draft, data = "./specloop-data", host = "127.0.0.1", dtype = "auto";
  int port = 8000, trainer_metrics_port = 9091, trainer_pub_port = 0, trainer_router_port = 0;
  int threads = 0;  // the server's compute threads; 0: the cores less the trainer's one
  double max_backoff_seconds = 30;
  bool no_train = false;
  std::vector<std::string> serve_args, train_args;
};


bool MakeDir(const std::string& dir) { return mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST; }

// Whether `args` set the option `name` ("--name value" or "--name=value").
bool HasOption(const std::vector<std::string>& args, const std::string& name) {
  for (const std::string& arg : args) {
    if (arg == name || arg.rfind(name + "=", 0) == 0) return true;
  }
  return false;
}

int RunUp(UpArgs a) {
  char exe[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) {
    std::cerr << "specloop up: cannot find the specloop binary (/proc/self/exe)\n";
    return 1;
  }
  exe[n] = 0;
  while (a.data.size() > 1 && a.data.back() == '/') a.data.pop_back();
  const std::string buffer = a.data + "/buffer", checkpoints = a.data + "/checkpoints",
                    drafts = a.data + "/drafts";
  if (!MakeDir(a.data) || !MakeDir(checkpoints) || !MakeDir(drafts)) {
    std::cerr << "specloop up: cannot create the data dir " << a.data << "\n";
    return 1;
  }
  for (int* p : {&a.port, &a.trainer_metrics_port, &a.trainer_pub_port, &a.trainer_router_port}) {
    if (*p == 0) *p = FreeLoopbackPort();
    if (*p <= 0 || *p > 65535) {
      std::cerr << "specloop up: no free port\n";
      return 1;
    }
  }
  const std::string pub = "tcp://127.0.0.1:" + std::to_string(a.trainer_pub_port);
  const std::string router = "tcp://127.0.0.1:" + std::to_string(a.trainer_router_port);

  ChildSpec serve;
  serve.name = "serve";
  serve.argv = {exe,      "serve",         "--target",           a.target,
                "--draft", a.draft,        "--host",             a.host,
                "--port",  std::to_string(a.port), "--buffer",   buffer,
                "--dtype", a.dtype};
  if (!a.no_train) {
    serve.argv.insert(serve.argv.end(), {"--draft-staging", drafts, "--trainer-endpoint", pub,
                                         "--trainer-router", router});
    if (a.trainer_metrics_port > 0) {  // the status page shows the trainer's state
      serve.argv.push_back("--trainer-status=http://127.0.0.1:" +
                           std::to_string(a.trainer_metrics_port));
    }
  }
  if (!HasOption(a.serve_args, "--threads")) {
    const int cores = AvailableCores();
    const int threads = a.threads > 0 ? a.threads : a.no_train ? cores : std::max(1, cores - 1);
    serve.argv.push_back("--threads=" + std::to_string(threads));
  }
  serve.argv.insert(serve.argv.end(), a.serve_args.begin(), a.serve_args.end());
  serve.ready_text = "specloop serve: listening on";
  ChildSpec train;
  train.name = "train";
  train.argv = {exe,           "train",     "--draft",        a.draft,
                "--buffer",    buffer,      "--checkpoints",  checkpoints,
                "--pub",       pub,         "--router",       router,
                "--metrics-port", std::to_string(a.trainer_metrics_port)};
  if (!HasOption(a.train_args, "--threads")) train.argv.push_back("--threads=1");
  train.argv.insert(train.argv.end(), a.train_args.begin(), a.train_args.end());
  train.ready_text = "specloop train: live draft";

  SupervisorOptions so;
  so.name = "specloop up";
  so.max_backoff_seconds = a.max_backoff_seconds;
  Supervisor sup(so);
  sup.Add(std::move(serve));
  if (!a.no_train) sup.Add(std::move(train));
  sup.StopOnSignals();
  std::printf("specloop up: data %s; serving on http://%s:%d (status page /, metrics /metrics); ",
              a.data.c_str(), a.host.c_str(), a.port);
  if (a.no_train) {
    std::printf("no trainer (the draft stays fixed)\n");
  } else {
    std::printf("trainer metrics on http://127.0.0.1:%d/metrics; drafts over %s and %s\n",
                a.trainer_metrics_port, pub.c_str(), router.c_str());
  }
  std::fflush(stdout);
  Status s = sup.Run();
  if (!s.ok()) {
    std::cerr << "specloop up: " << s.ToString() << "\n";
    return 1;
  }
  std::printf("specloop up: stopped\n");
  return 0;
}

}  // namespace

void AddUpCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("up", "run the server and the trainer together (one command)");
  auto a = std::make_shared<UpArgs>();
  cmd->add_option("--target", a->target, "target model directory")->required();
  cmd->add_option("--draft", a->draft, "initial draft model directory")->required();
  cmd->add_option("--data", a->data, "data dir: buffer, checkpoints, fetched drafts")
      ->capture_default_str();
  cmd->add_option("--host", a->host, "the server's bind address")->capture_default_str();
  cmd->add_option("--port", a->port, "the server's port (0 = any free port)")
      ->capture_default_str();
  cmd->add_option("--trainer-metrics-port", a->trainer_metrics_port,
                  "port of the trainer's /metrics (0 = any free port)")
      ->capture_default_str();
  cmd->add_option("--trainer-pub-port", a->trainer_pub_port,
                  "loopback port of draft announcements (0 = any free port)")
      ->capture_default_str();
  cmd->add_option("--trainer-router-port", a->trainer_router_port,
                  "loopback port of draft transfer (0 = any free port)")
      ->capture_default_str();
  cmd->add_option("--max-backoff", a->max_backoff_seconds, "longest restart delay, seconds")
      ->capture_default_str();
  cmd->add_flag("--no-train", a->no_train,
               "serve only: no trainer, the draft stays fixed (still logged to the buffer)");
  cmd->add_option("--threads", a->threads,
                  "the server's compute threads (0: every core but the trainer's one)")
      ->capture_default_str();
  cmd->add_option("--dtype", a->dtype,
                  "the target's weights: auto (float32 on cpu), float32, float16 or bfloat16")
      ->capture_default_str();
  cmd->add_option("--serve-arg", a->serve_args,
                  "extra argument for `specloop serve` (repeatable; --serve-arg=--k=4)");
  cmd->add_option("--train-arg", a->train_args,
                  "extra argument for `specloop train` (repeatable; --train-arg=--lr=1e-4)");
  cmd->callback([a, exit_code] { *exit_code = RunUp(*a); });
}

}  // namespace specloop
