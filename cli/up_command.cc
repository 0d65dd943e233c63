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
// Without --draft the servers start at once with none (plain decoding and suffix blocks), and
// the trainer grows an EAGLE-3 head from the target: it writes the first one to DATA/head-init
// (`train --init-head`: draft init's defaults, once; a restarted `up` resumes from the
// trainer's checkpoints), distils it on the traffic, and its gate publishes the first version
// that it finds faster than plain decoding; the servers then hot-swap it in.
//
// A fleet on one machine (--workers N > 1, or --redis): N servers (`--worker-id i`, so their
// metrics carry worker="i"), each with its own buffer and a shipper (`specloop buffer ship`)
// into a Redis stream, one ingester (`specloop buffer ingest`) that writes the stream into
// the trainer's buffer, and one trainer whose drafts reach every server. With N > 1 clients
// call one port, PORT, where `specloop proxy` (fleet/front_proxy.h) hands each request to the
// least loaded server and sends it to another when a server dies before answering; the
// servers listen on PORT+1 .. PORT+N. Without --redis a redis-server is started too
// (loopback, a free port, its append-only file in DATA/redis, fsync on every write: killed,
// it loses no acknowledged record). The ingester trims the stream of what the trainer's group
// acknowledged; --max-stream-length caps it besides (drops counted); each shipper and the
// ingester serve /metrics (--stream-metrics-port). Layout:
//
//   DATA/worker-i/buffer, DATA/worker-i/drafts   server i's buffer and fetched drafts
//   DATA/buffer        the ingested union of the workers' records, read by the trainer
//   DATA/checkpoints   as above
//   DATA/redis         the started redis-server's data
//
// Start order: redis-server, then each server followed by its shipper, the proxy, the
// ingester, the trainer.
//
// Cores: the servers and the trainer share the machine. Unless told otherwise (--threads, or
// --serve-arg=--threads / --train-arg=--threads), the trainer gets one compute thread and the
// servers split every other core this process may run on, at least one each (on 2 cores: 1
// and 1); with --no-train the servers split every core.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "common/base/free_port.h"
#include "common/model/threads.h"
#include "cli/commands.h"
#include "fleet/supervisor.h"

namespace specloop {

namespace {

struct UpArgs {
  std::string target, draft, data = "./specloop-data", host = "127.0.0.1", dtype = "auto";
  std::string generation_config = "auto";  // the servers' --generation-config
  std::string per_request_spec_metrics = "none";  // the servers' --per-request-spec-metrics
  int port = 8000, trainer_metrics_port = 9091, trainer_pub_port = 0, trainer_router_port = 0;
  int threads = 0;  // each server's compute threads; 0: the cores less the trainer's one, split
  int workers = 1;
  int max_model_len = 0;  // the servers' --max-model-len (0: the model's own)
  std::string redis;  // HOST:PORT of a Redis server to ship records through; empty: see workers
  uint64_t max_stream_length = 0;  // the shippers' --max-stream-length (0: no cap)
  int stream_metrics_port = 0;     // the ingester's /metrics; shipper i's on +i (0: free ports)
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

// `name`'s path on $PATH, or empty.
std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t end = std::min(dirs.find(':', start), dirs.size());
    const std::string file = (end > start ? dirs.substr(start, end - start) : ".") + "/" + name;
    if (access(file.c_str(), X_OK) == 0) return file;
    start = end + 1;
  }
  return "";
}

int RunUp(UpArgs a) {
  char exe[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) {
    std::cerr << "specloop up: cannot find the specloop binary (/proc/self/exe)\n";
    return 1;
  }
  exe[n] = 0;
  if (a.workers < 1) {
    std::cerr << "specloop up: --workers must be at least 1\n";
    return 2;
  }
  const bool fleet = a.workers > 1 || !a.redis.empty();
  std::string redis_server;
  if (fleet && a.redis.empty()) {
    redis_server = FindOnPath("redis-server");
    if (redis_server.empty()) {
      std::cerr << "specloop up: --workers " << a.workers
                << " ships records through Redis, and redis-server is not on PATH (apt-get "
                   "install redis-server), or give --redis HOST:PORT\n";
      return 2;
    }
  }
  while (a.data.size() > 1 && a.data.back() == '/') a.data.pop_back();
  const std::string buffer = a.data + "/buffer", checkpoints = a.data + "/checkpoints";
  std::vector<std::string> dirs = {a.data, checkpoints};
  const bool grow_head = a.draft.empty();  // no draft: a feature draft from the target
  if (!fleet) dirs.push_back(a.data + "/drafts");
  for (int i = 1; fleet && i <= a.workers; ++i) {
    dirs.push_back(a.data + "/worker-" + std::to_string(i));
    dirs.push_back(a.data + "/worker-" + std::to_string(i) + "/drafts");
  }
  if (!redis_server.empty()) dirs.push_back(a.data + "/redis");
  for (const std::string& dir : dirs) {
    if (!MakeDir(dir)) {
      std::cerr << "specloop up: cannot create " << dir << "\n";
      return 1;
    }
  }
  // With a proxy in front (N > 1) it takes PORT and the servers the ports after it.
  const bool proxy = a.workers > 1;
  int proxy_port = a.port;
  std::vector<int> ports;
  for (int i = 0; i < a.workers; ++i) {
    ports.push_back(a.port == 0 ? 0 : a.port + i + (proxy ? 1 : 0));
  }
  int redis_port = 0;
  std::vector<int*> to_pick = {&a.trainer_metrics_port, &a.trainer_pub_port,
                               &a.trainer_router_port};
  if (proxy) to_pick.push_back(&proxy_port);
  for (int& p : ports) to_pick.push_back(&p);
  if (!redis_server.empty()) to_pick.push_back(&redis_port);
  // The record stream's ends' /metrics: [0] the ingester's, [i] shipper i's.
  std::vector<int> stream_ports(fleet ? a.workers + 1 : 0);
  for (size_t i = 0; i < stream_ports.size(); ++i) {
    stream_ports[i] = a.stream_metrics_port == 0 ? 0 : a.stream_metrics_port + static_cast<int>(i);
    to_pick.push_back(&stream_ports[i]);
  }
  for (int* p : to_pick) {
    if (*p == 0) *p = FreeLoopbackPort();
    if (*p <= 0 || *p > 65535) {
      std::cerr << "specloop up: no free port\n";
      return 1;
    }
  }
  if (!redis_server.empty()) a.redis = "127.0.0.1:" + std::to_string(redis_port);
  // The trainer's draft: the given one, or a head it grows from the target into
  // DATA/head-init before its first step (once: a restarted up resumes from the checkpoints).
  const std::string train_draft = grow_head ? a.data + "/head-init" : a.draft;
  if (grow_head && !a.no_train) {
    std::printf("specloop up: no --draft: initializing a feature draft from the target into %s "
                "(the trainer grows it while the server serves)\n",
                train_draft.c_str());
    std::fflush(stdout);
  }
  const std::string pub = "tcp://127.0.0.1:" + std::to_string(a.trainer_pub_port);
  const std::string router = "tcp://127.0.0.1:" + std::to_string(a.trainer_router_port);

  SupervisorOptions so;
  so.name = "specloop up";
  so.max_backoff_seconds = a.max_backoff_seconds;
  Supervisor sup(so);
  if (!redis_server.empty()) {
    ChildSpec redis;
    redis.name = "redis";
    redis.argv = {redis_server, "--bind", "127.0.0.1", "--port", std::to_string(redis_port),
                  "--dir", a.data + "/redis", "--appendonly", "yes", "--appendfsync", "always",
                  "--save", "", "--protected-mode", "no"};
    redis.ready_text = "Ready to accept connections";
    sup.Add(std::move(redis));
  }

  // Each server's compute threads: the cores less the trainer's one, split among the servers.
  const int cores = AvailableCores();
  const int threads = a.threads > 0 ? a.threads
                                    : std::max(1, (a.no_train ? cores : cores - 1) / a.workers);
  for (int i = 1; i <= a.workers; ++i) {
    const std::string dir = fleet ? a.data + "/worker-" + std::to_string(i) : a.data;
    ChildSpec serve;
    serve.name = fleet ? "serve-" + std::to_string(i) : "serve";
    serve.argv = {exe,      "serve",  "--target", a.target, "--host", a.host,
                  "--port", std::to_string(ports[i - 1]), "--buffer", dir + "/buffer",
                  "--dtype", a.dtype};
    if (!a.draft.empty()) serve.argv.insert(serve.argv.end(), {"--draft", a.draft});
    if (!HasOption(a.serve_args, "--generation-config")) {
      serve.argv.insert(serve.argv.end(), {"--generation-config", a.generation_config});
    }
    if (a.per_request_spec_metrics != "none") {
      serve.argv.push_back("--per-request-spec-metrics=" + a.per_request_spec_metrics);
    }
    if (fleet) serve.argv.insert(serve.argv.end(), {"--worker-id", std::to_string(i)});
    if (a.max_model_len > 0) {
      serve.argv.insert(serve.argv.end(), {"--max-model-len", std::to_string(a.max_model_len)});
    }
    if (!a.no_train) {
      serve.argv.insert(serve.argv.end(), {"--draft-staging", dir + "/drafts",
                                           "--trainer-endpoint", pub, "--trainer-router", router});
      if (a.trainer_metrics_port > 0) {  // the status page shows the trainer's state
        serve.argv.push_back("--trainer-status=http://127.0.0.1:" +
                             std::to_string(a.trainer_metrics_port));
      }
    }
    if (!HasOption(a.serve_args, "--threads")) {
      serve.argv.push_back("--threads=" + std::to_string(threads));
    }
    serve.argv.insert(serve.argv.end(), a.serve_args.begin(), a.serve_args.end());
    serve.ready_text = "specloop serve: listening on";
    sup.Add(std::move(serve));
    if (fleet) {
      ChildSpec ship;
      ship.name = "ship-" + std::to_string(i);
      ship.argv = {exe,      "buffer",  "ship", dir + "/buffer", "--redis",
                   a.redis,  "--id",    "worker-" + std::to_string(i),
                   "--metrics-port", std::to_string(stream_ports[i])};
      if (a.max_stream_length > 0) {
        ship.argv.insert(ship.argv.end(),
                         {"--max-stream-length", std::to_string(a.max_stream_length)});
      }
      ship.ready_text = "specloop buffer ship: ";
      sup.Add(std::move(ship));
    }
  }
  // The servers' address as the proxy dials it: a wildcard bind is reached on loopback.
  const std::string dial = a.host == "0.0.0.0" || a.host == "::" ? "127.0.0.1" : a.host;
  if (proxy) {
    ChildSpec front;
    front.name = "proxy";
    front.argv = {exe, "proxy", "--host", a.host, "--port", std::to_string(proxy_port)};
    for (int p : ports) {
      front.argv.insert(front.argv.end(), {"--upstream", dial + ":" + std::to_string(p)});
    }
    front.ready_text = "specloop proxy: listening on";
    sup.Add(std::move(front));
  }
  if (fleet && !a.no_train) {
    ChildSpec ingest;
    ingest.name = "ingest";
    ingest.argv = {exe,      "buffer", "ingest", buffer, "--redis", a.redis, "--metrics-port",
                   std::to_string(stream_ports[0])};
    ingest.ready_text = "specloop buffer ingest: ";
    sup.Add(std::move(ingest));
  }
  if (!a.no_train) {
    ChildSpec train;
    train.name = "train";
    train.argv = {exe,           "train",     "--draft",        train_draft,
                  "--buffer",    buffer,      "--checkpoints",  checkpoints,
                  "--pub",       pub,         "--router",       router,
                  "--metrics-port", std::to_string(a.trainer_metrics_port)};
    if (!HasOption(a.train_args, "--threads")) train.argv.push_back("--threads=1");
    if (grow_head) {  // nothing is served yet: the first head must beat plain decoding
      train.argv.insert(train.argv.end(), {"--target", a.target, "--init-head",
                                           "--initial-draft-served", "false"});
    }
    train.argv.insert(train.argv.end(), a.train_args.begin(), a.train_args.end());
    train.ready_text = "specloop train: live draft";
    sup.Add(std::move(train));
  }
  sup.StopOnSignals();
  std::printf("specloop up: data %s; serving on", a.data.c_str());
  if (proxy) {
    std::printf(" http://%s:%d (proxy, its metrics /metrics) over workers", a.host.c_str(),
                proxy_port);
  }
  for (int p : ports) std::printf(" http://%s:%d", a.host.c_str(), p);
  std::printf(" (status page /, metrics /metrics); ");
  if (fleet) {
    std::printf("records through Redis at %s (stream metrics: ingester http://127.0.0.1:%d/metrics, "
                "shippers",
                a.redis.c_str(), stream_ports[0]);
    for (size_t i = 1; i < stream_ports.size(); ++i) std::printf(" %d", stream_ports[i]);
    std::printf("); ");
  }
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
  cmd->add_option("--draft", a->draft,
                  "initial draft: a model or an EAGLE-3 head directory (none: serve at once "
                  "without one, and grow a feature draft from the target)");
  cmd->add_option("--data", a->data, "data dir: buffer, checkpoints, fetched drafts")
      ->capture_default_str();
  cmd->add_option("--host", a->host, "the server's bind address")->capture_default_str();
  cmd->add_option("--port", a->port,
                  "the server's port; with --workers N, the proxy's, and the servers' "
                  "PORT+1 .. PORT+N (0 = any free ports)")
      ->capture_default_str();
  cmd->add_option("--workers", a->workers,
                  "serving workers: more than 1 ship their records through Redis to the "
                  "trainer, and each follows its drafts")
      ->capture_default_str();
  cmd->add_option("--redis", a->redis,
                  "ship records through this Redis server, HOST:PORT (default with --workers "
                  "> 1: start redis-server on loopback, data in DATA/redis)");
  cmd->add_option("--max-stream-length", a->max_stream_length,
                  "cap of the record stream, entries: each shipper drops the oldest beyond it "
                  "even if the trainer has not ingested them (counted; 0: no cap, the "
                  "ingester trims what it acknowledged)")
      ->capture_default_str();
  cmd->add_option("--stream-metrics-port", a->stream_metrics_port,
                  "with a fleet: the ingester's /metrics port, shipper i's on PORT+i (0 = any "
                  "free ports)")
      ->check(CLI::Range(0, 65535))
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
                  "each server's compute threads (0: every core but the trainer's one, split "
                  "among the servers)")
      ->capture_default_str();
  cmd->add_option("--dtype", a->dtype,
                  "the target's weights: auto (float32 on cpu), float32, float16 or bfloat16")
      ->capture_default_str();
  cmd->add_option("--max-model-len", a->max_model_len,
                  "the servers' context limit in positions (0: the model's own)")
      ->check(CLI::Range(0, 1 << 30))
      ->capture_default_str();
  cmd->add_option("--generation-config", a->generation_config,
                  "the servers' request defaults: auto (the target's generation_config.json) "
                  "or ignore (temperature 1, top_p 1, top_k off)")
      ->check(CLI::IsMember({"auto", "ignore"}))
      ->capture_default_str();
  cmd->add_option("--per-request-spec-metrics,--per-request-spec-decode-metrics",
                  a->per_request_spec_metrics,
                  "the servers' per-request speculative metrics in each response, as vLLM's: "
                  "none, summary or detailed (see specloop serve --help)")
      ->check(CLI::IsMember({"none", "summary", "detailed"}))
      ->capture_default_str();
  cmd->add_option("--serve-arg", a->serve_args,
                  "extra argument for `specloop serve` (repeatable; --serve-arg=--k=4)");
  cmd->add_option("--train-arg", a->train_args,
                  "extra argument for `specloop train` (repeatable; --train-arg=--lr=1e-4)");
  cmd->callback([a, exit_code] { *exit_code = RunUp(*a); });
}

}  // namespace specloop
