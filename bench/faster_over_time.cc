// Domain-shift benchmark (issues 8, 29): the service gets faster as its traffic moves to new
// domains, in tokens per second against plain decoding.
//
// One trace, replayed by --concurrency closed-loop HTTP clients (default 1) against one
// `specloop up` per arm (a fresh data dir each), all with the same --target, `--k auto` (the
// default policy) and the same server compute threads (`--threads 1`: in the online arm the
// trainer has the other core; `specloop up` gives it one by default):
//   static            draft-prose-1m, --no-train: the draft never changes
//   online            draft-prose-1m, the trainer at its defaults distils it on the logged
//                     traffic and hot-swaps it in
//   reference         draft-mix-1m, --no-train: a same-size draft trained offline on every
//                     domain
//   static-no-suffix  the static arm with --no-suffix (every --subsample'th measured request)
//   plain             --k 0: plain decoding (the same subsample), the denominator of "over plain"
// The trace is a sequence of phases whose domain mix shifts (prose+docs, python, c, legal, an
// even mix, prose again); requests alternate temperature 0 and 0.8, with fixed seeds and
// max_tokens. The two subsampled arms carry no state from request to request (no trainer, no
// suffix index; the policy's estimates settle within a request), so a third of the trace
// measures them at the same load.
//
// Held-out prompts. Every --eval-every'th request of the trace is an evaluation request: its
// prompt is one the trainer holds out (trainer/heldout_split.h, on the ids the server encodes),
// so the trainer's gate sees held-out traffic of every domain. Those requests are left out of
// every statistic; the replayed (measured) requests use only the other prompts, so no replayed
// prompt is one the trainer evaluates on. The run checks the split: the trainer must report no
// more held-out records than evaluation requests were sent.
//
// First publish (full mode): one more `specloop up` with nothing but its defaults (draft-prose-1m,
// the trainer running) is fed prompts of c, a domain the draft never saw, by the same clients
// until the trainer publishes a draft; `first_publish_requests` counts the requests answered by
// then (goal: <= 100).
//
// Output, stdout and --out/faster_over_time.jsonl, JSON lines:
//   per arm, window (--window consecutive trace requests per domain of the phase) and domain:
//     {"arm", "window", "phase", "domain", "requests", "alpha", "mean_acceptance_length",
//      "tokens_per_step", "suffix_step_share", "tokens_per_second",
//      "end_to_end_tokens_per_second", "over_plain",
//      "draft_version", "objective"}
//   alpha: the draft model's accepted / tested (as specloop_acceptance_rate; suffix blocks
//   apart); mean_acceptance_length: 1 + the draft's accepted tokens per verified draft (as
//   specloop_mean_acceptance_length); tokens_per_step: generated tokens per target forward
//   (every block); suffix_step_share: the share of steps whose block the suffix proposer made;
//   tokens_per_second: decoding's rate per stream, the tokens after the first over the time
//   after the first token (1 / vLLM's TPOT; requests are streamed): what speculation changes;
//   end_to_end_tokens_per_second: all tokens over the whole latency (the prompt's prefill,
//   ~200 tokens, included: it costs every arm the same); over_plain: tokens_per_second over the
//   plain arm's in the same phase and domain; draft_version: the newest in the window;
//   objective: the trainer's loss at the window's end (online arm).
//   Then summary lines {"name", "params", "value", "unit"} (see Summarize) and, in --out,
//   requests-<arm>.jsonl (one line per request) and faster_over_time.png (gnuplot).
//
// Usage: faster_over_time [--short | --forgetting] [--out DIR] [--target DIR] [--concurrency N]
//                         [--phase-requests N] [--window N] [--k auto|N] [--max-tokens N]
//                         [--trainer-eval-every N] [--train-arg FLAG ...] [--binary PATH]
//                         [--shared DIR]
// Full mode (default): target-wide-46m, one client, 6 phases of 320 requests (the first and
// last 160), all five arms and the first-publish check; ~50 minutes on 2 cores (quiet). A
// request takes ~2x longer on target-wide-46m than on target-6m, so a 320-request phase gives
// the trainer about the time a 640-request one did there. One client: speculation buys
// latency, and a batch already shares each weight read among its sequences; at 4 clients on
// the server's one thread a step's extra rows are not free, and even the reference draft ran
// only 1.12-1.52x plain at phase ends (1.22x over the trace) while online matched it
// (0.95-1.00x): the arms' differences shrink to the noise.
// --short: target-6m, prose+docs (112) then python (224), the static and online arms at a fixed
// k = 4 (on target-6m auto mostly decodes plainly, which leaves no alpha to read), for the test
// suite (~110 s on 2 cores); the trainer at its defaults, gate included.
// --forgetting: target-6m, k = 4, 4 clients, the online arm alone over prose+docs (--phase-requests),
// python, c, then docs again (half a phase): whether the trainer keeps the domains it served.
// At every evaluation of the trainer (polled from its /metrics) the held-out alpha of each
// domain, live and candidate; for each domain while idle (served in an earlier phase, not in
// this one) the largest fall below its best (SummarizeForgetting). ~4 minutes on 2 cores.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "bench/streamed_completion.h"
#include "common/tokenizer/model_config.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/e2e/e2e_util.h"
#include "trainer/heldout_split.h"

namespace specloop {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr double kHeldOutFraction = 0.1;  // passed to the trainer as --heldout-fraction
// The trace's two temperatures (greedy and sampled), alternating in pairs of requests.
constexpr double kTemperatures[2] = {0.0, 0.8};
constexpr const char* kDomains[] = {"prose", "docs", "python", "c", "legal"};

struct Options {
  bool short_mode = false;
  bool forgetting = false;  // --forgetting: the long trace of idle domains (online arm only)
  std::string out = "faster-over-time";
  std::string shared = testing::SharedDir();
  std::string target;  // default: target-wide-46m (--short: target-6m)
  std::string binary = SPECLOOP_BINARY;
  int concurrency = 0;  // default: 1 (--short: 4)
  int phase_requests = 320;
  int window = 16;
  std::string k;  // default: auto (--short: 4)
  int max_tokens = 64;
  int eval_every = 8;
  int subsample = 3;  // the stateless arms replay every subsample'th measured request
  // Trainer steps between evaluations (the gate); 0: the trainer's default, adaptive cadence.
  int trainer_eval_every = 0;
  std::vector<std::string> train_args;  // more `specloop train` flags for the online arm
};

// One `specloop up` over the trace.
struct ArmSpec {
  std::string name, draft;
  bool train = false;
  std::vector<std::string> serve_args;  // beyond --k
  std::string k;
  bool subsampled = false;  // replays only the subsample
};

struct Phase {
  std::string name;
  std::vector<std::string> domains;
  int requests;
};

struct TraceRequest {
  int index = 0, phase = 0;
  std::string domain, prompt;
  bool eval = false;
  bool subsample = false;  // replayed by the subsampled arms too
  double temperature = 0;
};

struct Result {
  bool ok = false;
  std::string error;
  int tokens = 0, drafted = 0, accepted = 0, tested = 0, steps = 0, drafts = 0;
  int suffix_steps = 0, suffix_drafted = 0, suffix_accepted = 0, suffix_tested = 0;
  uint64_t version = 0;
  // Since the arm's first request: sent, first text chunk (the first token), last chunk.
  double start_s = 0, first_token_s = 0, end_s = 0;
};

// What the trainer's /metrics said at one moment.
struct TrainerSample {
  double t = 0;  // since the arm's first request
  double loss = NAN;
  uint64_t version = 0, published = 0, refused = 0, heldout = 0;
  // Where the trainer's time went: optimizer steps and evaluations (seconds in all), and the
  // held-out records each draft was run on.
  double step_s = 0, evaluation_s = 0, evaluated_live = 0, evaluated_candidate = 0;
  // Evaluations so far, and the last one's held-out alpha per (domain, model: live or
  // candidate), from specloop_train_estimated_alpha.
  uint64_t evaluations = 0;
  std::map<std::pair<std::string, std::string>, double> alpha;
};

struct Arm {
  std::string name;
  std::vector<Result> results;  // by trace index (requests an arm skips stay !ok, unsent)
  std::vector<bool> sent;
  std::vector<TrainerSample> trainer;
  double wall_s = 0;
  std::string server_metrics;  // the server's /metrics at the arm's end
};

std::vector<Phase> Phases(const Options& o) {
  const int n = o.phase_requests;
  if (o.forgetting) {
    return {{"prose+docs", {"prose", "docs"}, n},
            {"python", {"python"}, n},
            {"c", {"c"}, n},
            {"docs", {"docs"}, n / 2}};
  }
  if (o.short_mode) return {{"prose+docs", {"prose", "docs"}, n / 2}, {"python", {"python"}, n}};
  return {{"prose+docs", {"prose", "docs"}, n / 2},
          {"python", {"python"}, n},
          {"c", {"c"}, n},
          {"legal", {"legal"}, n},
          {"mix", {"prose", "python", "c", "legal", "docs"}, n},
          {"prose", {"prose"}, n / 2}};
}

std::vector<ArmSpec> Arms(const Options& o) {
  const std::string prose = o.shared + "/models/draft-prose-1m";
  std::vector<ArmSpec> arms = {{"static", prose, false, {}, o.k, false},
                               {"online", prose, true, {}, o.k, false}};
  if (o.forgetting) return {arms[1]};
  if (o.short_mode) return arms;
  arms.push_back({"reference", o.shared + "/models/draft-mix-1m", false, {}, o.k, false});
  arms.push_back({"static-no-suffix", prose, false, {"--no-suffix"}, o.k, true});
  arms.push_back({"plain", prose, false, {}, "0", true});
  return arms;
}

// Loads `dir`'s tokenizer and config, or exits.
void LoadTokenizer(const std::string& dir, std::unique_ptr<Tokenizer>* tokenizer,
                   ModelConfig* config) {
  Status s = Tokenizer::Load(dir, tokenizer);
  if (s.ok()) s = ModelConfig::FromDir(dir, config);
  if (!s.ok()) {
    std::cerr << "faster_over_time: " << s.ToString() << "\n";
    std::exit(1);
  }
}

// The trace: phases of requests; each domain's prompts split into replay and held-out (eval)
// prompts by the trainer's rule, each list shuffled with a fixed seed and cycled.
std::vector<TraceRequest> BuildTrace(const Options& o, const std::vector<Phase>& phases) {
  std::unique_ptr<Tokenizer> tokenizer;
  ModelConfig config;
  LoadTokenizer(o.target, &tokenizer, &config);
  std::mt19937_64 rng(20261121);
  std::map<std::string, std::vector<std::string>> replay, eval;
  std::map<std::string, size_t> next_replay, next_eval;
  for (const Phase& p : phases) {
    for (const std::string& d : p.domains) {
      if (replay.count(d)) continue;
      std::ifstream in(o.shared + "/prompts/" + d + ".jsonl");
      std::string line;
      int too_long = 0;
      while (std::getline(in, line)) {
        const std::string prompt = json::parse(line)["prompt"].get<std::string>();
        std::vector<int> ids = tokenizer->Encode(prompt);  // as serve/completion_params.cc
        if (config.add_bos_token) ids.insert(ids.begin(), config.bos_token_id);
        // A prompt that leaves no room for max_tokens would be refused (400) or cut short.
        if (static_cast<int64_t>(ids.size()) + o.max_tokens > config.max_model_len) {
          ++too_long;
          continue;
        }
        const bool held = trainer::IsHeldOutPrompt(ids.data(), ids.size(), kHeldOutFraction);
        (held ? eval : replay)[d].push_back(prompt);
      }
      if (replay[d].empty() || eval[d].empty()) {
        std::cerr << "faster_over_time: domain " << d << " has no replay or no held-out prompt\n";
        std::exit(1);
      }
      if (too_long > 0) {
        std::cerr << "faster_over_time: " << too_long << " " << d
                  << " prompt(s) left out: no room for " << o.max_tokens << " tokens\n";
      }
      std::shuffle(replay[d].begin(), replay[d].end(), rng);
      std::shuffle(eval[d].begin(), eval[d].end(), rng);
    }
  }
  std::vector<TraceRequest> trace;
  for (size_t p = 0; p < phases.size(); ++p) {
    for (int i = 0; i < phases[p].requests; ++i) {
      TraceRequest r;
      r.index = static_cast<int>(trace.size());
      r.phase = static_cast<int>(p);
      r.domain = phases[p].domains[rng() % phases[p].domains.size()];
      r.eval = r.index % o.eval_every == o.eval_every - 1;
      // Every third index: temperatures 0 and 0.8 alike (they alternate in pairs).
      r.subsample = !r.eval && r.index % o.subsample == 0;
      auto& list = r.eval ? eval[r.domain] : replay[r.domain];
      size_t& next = (r.eval ? next_eval : next_replay)[r.domain];
      r.prompt = list[next++ % list.size()];
      r.temperature = kTemperatures[(r.index / 2) % 2];  // replay requests alternate too
      trace.push_back(std::move(r));
    }
  }
  return trace;
}

bool PollTrainer(int port, double t, TrainerSample* s) {
  std::string body;
  if (e2e::HttpGet(port, "/metrics", &body) != 200) return false;
  s->t = t;
  // No loss before the first step (the series appears then).
  s->loss = body.find("\nspecloop_train_loss{") == std::string::npos
                ? NAN
                : e2e::MetricValue(body, "specloop_train_loss");
  s->version = static_cast<uint64_t>(e2e::MetricValue(body, "specloop_train_draft_version"));
  s->published =
      static_cast<uint64_t>(e2e::MetricValue(body, "specloop_train_checkpoints_published_total"));
  s->refused =
      static_cast<uint64_t>(e2e::MetricValue(body, "specloop_train_checkpoints_rejected_total"));
  s->heldout = static_cast<uint64_t>(e2e::MetricValue(body, "specloop_train_heldout_records"));
  s->step_s = e2e::MetricValue(body, "specloop_train_step_duration_seconds_sum");
  s->evaluation_s = e2e::MetricValue(body, "specloop_train_evaluation_duration_seconds_sum");
  s->evaluated_live =
      e2e::MetricValue(body, "specloop_train_evaluated_records_total", "model=\"live\"");
  s->evaluated_candidate =
      e2e::MetricValue(body, "specloop_train_evaluated_records_total", "model=\"candidate\"");
  s->evaluations =
      static_cast<uint64_t>(e2e::MetricValue(body, "specloop_train_evaluations_total"));
  for (const char* d : kDomains) {
    for (const char* m : {"live", "candidate"}) {
      const std::string label = std::string("domain=\"") + d + "\",model=\"" + m + "\"";
      if (body.find("specloop_train_estimated_alpha{" + label) == std::string::npos &&
          body.find("," + label) == std::string::npos) {
        continue;  // not evaluated on this domain yet
      }
      s->alpha[{d, m}] = e2e::MetricValue(body, "specloop_train_estimated_alpha", label);
    }
  }
  return true;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// One streamed completion: the time of the first text chunk (the first token) and of the end,
// and the last chunk's usage and speculative counts.
Result Send(httplib::Client* cli, const TraceRequest& r, const Options& o, double t0_s) {
  const bench::StreamedCompletion c = bench::PostStreamedCompletion(
      cli,
      json{{"prompt", r.prompt},           {"max_tokens", o.max_tokens},
           {"temperature", r.temperature}, {"seed", r.index},
           {"domain", r.domain}},
      t0_s);
  Result out;
  out.start_s = c.start_s;
  out.first_token_s = c.first_token_s;
  out.end_s = c.end_s;
  if (!c.ok()) {
    out.error = c.error;
    return out;
  }
  const json& s = c.last["speculative"];
  out.tokens = c.last["usage"]["completion_tokens"].get<int>();
  out.drafted = s["drafted"].get<int>();
  out.accepted = s["accepted"].get<int>();
  out.tested = s["tested"].get<int>();
  out.steps = s["steps"].get<int>();
  out.drafts = s["drafts"].get<int>();
  out.suffix_steps = s["suffix"]["steps"].get<int>();
  out.suffix_drafted = s["suffix"]["drafted"].get<int>();
  out.suffix_accepted = s["suffix"]["accepted"].get<int>();
  out.suffix_tested = s["suffix"]["tested"].get<int>();
  out.version = s["draft_version"].get<uint64_t>();
  out.ok = true;
  return out;
}

// Starts `specloop up` with `argv`'s arguments after the binary's, waits until it serves (and
// trains, with `train`), or exits.
std::unique_ptr<e2e::Child> StartUp(const std::string& name, std::vector<std::string> argv,
                                    bool train) {
  auto up = std::make_unique<e2e::Child>(argv, /*echo=*/false);
  const bool ready = !up->WaitForLine("specloop up: serve is ready", 120).empty() &&
                     (!train || !up->WaitForLine("specloop up: train is ready", 120).empty());
  if (!ready) {
    std::cerr << "faster_over_time: " << name << ": `specloop up` did not start:\n"
              << up->Output();
    std::exit(1);
  }
  return up;
}

// Stops `up` and echoes its lines about drafts (published, refused, rolled back) and restarts.
void StopUp(const std::string& name, e2e::Child* up) {
  up->Signal(SIGINT);
  if (up->Wait(60) == -1) std::cerr << "faster_over_time: `specloop up` did not stop in 60 s\n";
  for (const char* l : {"published", "refused", "rejected", "restart", "rollback"}) {
    for (size_t from = 0;;) {
      const std::string line = up->WaitForLine(l, 0, &from);
      if (line.empty()) break;
      std::cerr << "  [" << name << "] " << line << "\n";
    }
  }
}

// Starts `specloop up` for one arm, replays the trace (or its subsample), stops it.
Arm RunArm(const ArmSpec& spec, const Options& o, const std::vector<TraceRequest>& trace) {
  Arm arm;
  arm.name = spec.name;
  const std::string data = o.out + "/" + spec.name + "-data";
  fs::remove_all(data);
  const int port = e2e::FreePort(), metrics_port = e2e::FreePort();
  std::vector<std::string> argv = {o.binary, "up", "--target", o.target, "--draft", spec.draft,
                                   "--data", data, "--port", std::to_string(port),
                                   "--trainer-metrics-port", std::to_string(metrics_port),
                                   "--threads", "1", "--serve-arg=--k=" + spec.k};
  for (const std::string& a : spec.serve_args) argv.push_back("--serve-arg=" + a);
  if (spec.train) {
    for (const std::string& a :
         {"--eval-every=" + std::to_string(o.trainer_eval_every),
          "--heldout-fraction=" + std::to_string(kHeldOutFraction)}) {
      if (a != "--eval-every=0") argv.push_back("--train-arg=" + a);  // 0: the default
    }
    for (const std::string& a : o.train_args) argv.push_back("--train-arg=" + a);
  } else {
    argv.push_back("--no-train");
  }
  std::unique_ptr<e2e::Child> up = StartUp(spec.name, argv, spec.train);
  std::vector<size_t> order;
  arm.sent.assign(trace.size(), false);
  for (size_t i = 0; i < trace.size(); ++i) {
    if (spec.subsampled && !trace[i].subsample) continue;
    order.push_back(i);
    arm.sent[i] = true;
  }
  std::cerr << "faster_over_time: arm " << spec.name << ": " << order.size() << " requests, "
            << o.concurrency << " clients\n";

  const double t0 = Now();
  arm.results.resize(trace.size());
  std::atomic<size_t> next{0};
  std::atomic<bool> done{false};
  std::mutex mu;
  std::thread poller;
  if (spec.train) {
    poller = std::thread([&] {
      while (!done.load()) {
        TrainerSample s;
        if (PollTrainer(metrics_port, Now() - t0, &s)) {
          std::lock_guard<std::mutex> lock(mu);
          arm.trainer.push_back(s);
        }
        std::this_thread::sleep_for(std::chrono::seconds(1));
      }
    });
  }
  std::vector<std::thread> clients;
  for (int c = 0; c < o.concurrency; ++c) {
    clients.emplace_back([&] {
      httplib::Client cli("127.0.0.1", port);
      cli.set_read_timeout(300);
      for (size_t n; (n = next.fetch_add(1)) < order.size();) {
        arm.results[order[n]] = Send(&cli, trace[order[n]], o, t0);
        if ((n + 1) % 200 == 0) {
          std::cerr << "faster_over_time: arm " << spec.name << ": " << n + 1 << " requests, "
                    << static_cast<int>(Now() - t0) << " s\n";
        }
      }
    });
  }
  for (std::thread& t : clients) t.join();
  arm.wall_s = Now() - t0;
  done = true;
  if (poller.joinable()) poller.join();
  if (spec.train) {  // the last word: after one more catch-up period
    std::this_thread::sleep_for(std::chrono::seconds(6));
    TrainerSample s;
    if (PollTrainer(metrics_port, Now() - t0, &s)) arm.trainer.push_back(s);
  }
  if (e2e::HttpGet(port, "/metrics", &arm.server_metrics) != 200) arm.server_metrics.clear();
  StopUp(spec.name, up.get());
  std::ofstream per_request(o.out + "/requests-" + spec.name + ".jsonl");
  for (size_t i = 0; i < trace.size(); ++i) {
    if (!arm.sent[i]) continue;
    const Result& r = arm.results[i];
    per_request << json{{"index", i},
                        {"phase", trace[i].phase},
                        {"domain", trace[i].domain},
                        {"eval", trace[i].eval},
                        {"temperature", trace[i].temperature},
                        {"ok", r.ok},
                        {"error", r.error},
                        {"tokens", r.tokens},
                        {"drafted", r.drafted},
                        {"accepted", r.accepted},
                        {"tested", r.tested},
                        {"steps", r.steps},
                        {"drafts", r.drafts},
                        {"suffix_steps", r.suffix_steps},
                        {"suffix_drafted", r.suffix_drafted},
                        {"suffix_accepted", r.suffix_accepted},
                        {"draft_version", r.version},
                        {"start_s", r.start_s},
                        {"first_token_s", r.first_token_s},
                        {"end_s", r.end_s}}
                       .dump()
                << "\n";
  }
  return arm;
}

// `specloop up` at its defaults (draft-prose-1m, trainer on) fed c prompts, a domain the draft
// never saw, by --concurrency clients until the trainer publishes a draft (or 400 requests):
// the requests answered by then; -1 when none was published.
int FirstPublish(const Options& o) {
  const std::string data = o.out + "/first-publish-data";
  fs::remove_all(data);
  const int port = e2e::FreePort(), metrics_port = e2e::FreePort();
  std::unique_ptr<e2e::Child> up = StartUp(
      "first-publish",
      {o.binary, "up", "--target", o.target, "--draft", o.shared + "/models/draft-prose-1m",
       "--data", data, "--port", std::to_string(port), "--trainer-metrics-port",
       std::to_string(metrics_port)},
      /*train=*/true);
  std::vector<std::string> prompts;
  {
    std::ifstream in(o.shared + "/prompts/c.jsonl");
    for (std::string line; std::getline(in, line);) {
      prompts.push_back(json::parse(line)["prompt"].get<std::string>());
    }
  }
  constexpr int kMaxRequests = 400;
  std::atomic<int> next{0}, answered{0}, failed{0}, at_publish{-1};
  std::atomic<bool> done{false};
  std::thread poller([&] {
    while (!done.load()) {
      TrainerSample s;
      if (PollTrainer(metrics_port, 0, &s) && s.published > 0) {
        at_publish = answered.load();  // at most 0.2 s and a scrape after the publish
        done = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  std::vector<std::thread> clients;
  for (int c = 0; c < o.concurrency; ++c) {
    clients.emplace_back([&] {
      httplib::Client cli("127.0.0.1", port);
      cli.set_read_timeout(300);
      for (int i; !done.load() && (i = next.fetch_add(1)) < kMaxRequests;) {
        TraceRequest r;
        r.index = i;
        r.domain = "c";
        r.prompt = prompts[i % prompts.size()];
        r.temperature = kTemperatures[(i / 2) % 2];
        const Result res = Send(&cli, r, o, 0);
        (res.ok ? answered : failed)++;
      }
    });
  }
  for (std::thread& t : clients) t.join();
  done = true;
  poller.join();
  StopUp("first-publish", up.get());
  if (failed > 0) std::cerr << "faster_over_time: first-publish: " << failed << " failed\n";
  return failed > 0 ? -2 : at_publish.load();
}

// Sums over a set of replayed (non-eval, successful) requests.
struct Tally {
  int requests = 0;
  double tokens = 0, drafted = 0, accepted = 0, tested = 0, steps = 0, drafts = 0, latency = 0;
  double suffix_steps = 0, suffix_accepted = 0, suffix_tested = 0;
  double decode_tokens = 0, decode_seconds = 0;
  uint64_t version = 0;
  void Add(const Result& r) {
    ++requests;
    tokens += r.tokens;
    drafted += r.drafted;
    accepted += r.accepted;
    tested += r.tested;
    steps += r.steps;
    drafts += r.drafts;
    suffix_steps += r.suffix_steps;
    suffix_accepted += r.suffix_accepted;
    suffix_tested += r.suffix_tested;
    latency += r.end_s - r.start_s;
    // After the first token: prefill (the prompt's forward) and queueing left out, as TPOT.
    decode_tokens += std::max(0, r.tokens - 1);
    decode_seconds += r.end_s - r.first_token_s;
    version = std::max(version, r.version);
  }
  // The draft model's: suffix blocks left out.
  double alpha() const {
    return tested > suffix_tested ? (accepted - suffix_accepted) / (tested - suffix_tested) : NAN;
  }
  double mean_acceptance_length() const {
    return drafts > suffix_steps ? 1 + (accepted - suffix_accepted) / (drafts - suffix_steps)
                                 : NAN;
  }
  double tokens_per_step() const { return steps > 0 ? tokens / steps : NAN; }
  double suffix_step_share() const { return steps > 0 ? suffix_steps / steps : NAN; }
  // End to end: generated tokens over request latency (prefill included).
  double end_to_end_tokens_per_second() const { return latency > 0 ? tokens / latency : NAN; }
  // Decoding: tokens after the first over the time after the first (1 / vLLM's TPOT), where
  // speculation acts; prefill costs every arm the same and is issue 30's (prefix caching).
  double tokens_per_second() const {
    return decode_seconds > 0 ? decode_tokens / decode_seconds : NAN;
  }
};

// The measured requests of `domain` ("" = all) in [from, to) that `keep` accepts (default:
// all); with `held_out`, the evaluation requests instead (prompts the trainer never trains on).
template <typename Keep>
Tally SumIf(const Arm& arm, const std::vector<TraceRequest>& trace, int from, int to,
            const std::string& domain, bool held_out, Keep keep) {
  Tally t;
  for (int i = from; i < to; ++i) {
    if (trace[i].eval != held_out || !arm.results[i].ok) continue;
    if (!domain.empty() && trace[i].domain != domain) continue;
    if (keep(i)) t.Add(arm.results[i]);
  }
  return t;
}

Tally Sum(const Arm& arm, const std::vector<TraceRequest>& trace, int from, int to,
          const std::string& domain, bool held_out = false) {
  return SumIf(arm, trace, from, to, domain, held_out, [](int) { return true; });
}

json Num(double v) { return std::isnan(v) ? json(nullptr) : json(v); }

void Emit(std::ostream& file, const json& j) {
  std::cout << j.dump() << std::endl;
  file << j.dump() << "\n";
}

void EmitSummary(std::ostream& file, const std::string& name, const json& params, double value,
                 const std::string& unit) {
  Emit(file, {{"name", "faster_over_time." + name}, {"params", params}, {"value", Num(value)},
              {"unit", unit}});
}

const Arm* Find(const std::vector<Arm>& arms, const std::string& name) {
  for (const Arm& a : arms) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

// Plain decoding's tokens/s per stream in each phase and domain (NaN without a plain arm).
double PlainRate(const Arm* plain, const std::vector<TraceRequest>& trace,
                 const std::vector<Phase>& phases, int phase, const std::string& domain) {
  if (plain == nullptr) return NAN;
  int from = 0;
  for (int p = 0; p < phase; ++p) from += phases[p].requests;
  return Sum(*plain, trace, from, from + phases[phase].requests, domain).tokens_per_second();
}

// Plot data: "request alpha tokens/s over-plain" rows per (arm, domain).
using Series = std::map<std::pair<std::string, std::string>, std::string>;

// Per window and domain lines for one arm; adds the arm's rows to *series.
void EmitWindows(std::ostream& file, const Arm& arm, const Arm* plain,
                 const std::vector<TraceRequest>& trace, const std::vector<Phase>& phases,
                 const Options& o, Series* series) {
  // Windows within each phase, of --window requests per domain of the phase (the mix phase's
  // windows are five times as long, so that each domain's point still sums ~--window requests).
  std::vector<std::pair<int, int>> windows;
  for (int p = 0, first = 0; p < static_cast<int>(phases.size()); first += phases[p++].requests) {
    const int size = o.window * static_cast<int>(phases[p].domains.size());
    for (int from = first; from < first + phases[p].requests; from += size) {
      windows.emplace_back(from, std::min(first + phases[p].requests, from + size));
    }
  }
  std::map<std::string, int> last_window;  // per domain, the last window with a point
  for (int w = 0; w < static_cast<int>(windows.size()); ++w) {
    const auto [from, to] = windows[w];
    double end_s = 0;
    for (int i = from; i < to; ++i) end_s = std::max(end_s, arm.results[i].end_s);
    double objective = NAN;
    for (const TrainerSample& s : arm.trainer) {
      if (s.t <= end_s && !std::isnan(s.loss)) objective = s.loss;
    }
    std::set<std::string> domains;
    for (int i = from; i < to; ++i) domains.insert(trace[i].domain);
    for (const std::string& d : domains) {
      const Tally t = Sum(arm, trace, from, to, d);
      if (t.requests == 0) continue;
      const double over_plain =
          t.tokens_per_second() / PlainRate(plain, trace, phases, trace[from].phase, d);
      Emit(file, {{"arm", arm.name},
                  {"window", w},
                  {"phase", phases[trace[from].phase].name},
                  {"domain", d},
                  {"requests", t.requests},
                  {"alpha", Num(t.alpha())},
                  {"mean_acceptance_length", Num(t.mean_acceptance_length())},
                  {"tokens_per_step", Num(t.tokens_per_step())},
                  {"suffix_step_share", Num(t.suffix_step_share())},
                  {"tokens_per_second", Num(t.tokens_per_second())},
                  {"end_to_end_tokens_per_second", Num(t.end_to_end_tokens_per_second())},
                  {"over_plain", Num(over_plain)},
                  {"draft_version", t.version},
                  {"objective", Num(objective)}});
      char row[160];
      std::snprintf(row, sizeof(row), "%d %.4f %.3f %.4f\n", (from + to) / 2, t.alpha(),
                    t.tokens_per_second(), over_plain);
      std::string& rows = (*series)[{arm.name, d}];
      if (last_window.count(d) && last_window[d] != w - 1) rows += "\n";  // a gap: break the line
      last_window[d] = w;
      rows += row;
    }
  }
}

// The suffix proposer's share: the static arm against static-no-suffix on the same
// (subsampled) requests, split by whether the request's prompt had been answered before it
// started in the static arm (so its earlier answer was in the domain's index) or not.
void SummarizeSuffix(std::ostream& file, const Arm& with, const Arm& without,
                     const std::vector<TraceRequest>& trace) {
  std::vector<bool> recurring(trace.size(), false);
  std::map<std::string, double> first_end;  // prompt -> the earliest end of a request of it
  std::vector<int> by_start(trace.size());
  for (size_t i = 0; i < trace.size(); ++i) by_start[i] = static_cast<int>(i);
  std::sort(by_start.begin(), by_start.end(), [&](int a, int b) {
    return with.results[a].start_s < with.results[b].start_s;
  });
  // Walk requests by start time; a prompt recurs if an earlier request of it already ended.
  std::vector<int> by_end = by_start;
  std::sort(by_end.begin(), by_end.end(), [&](int a, int b) {
    return with.results[a].end_s < with.results[b].end_s;
  });
  std::set<std::string> answered;
  size_t e = 0;
  for (int i : by_start) {
    if (!with.results[i].ok) continue;
    for (; e < by_end.size() && with.results[by_end[e]].end_s <= with.results[i].start_s; ++e) {
      if (with.results[by_end[e]].ok) {
        answered.insert(trace[by_end[e]].domain + "\n" + trace[by_end[e]].prompt);
      }
    }
    recurring[i] = answered.count(trace[i].domain + "\n" + trace[i].prompt) > 0;
  }
  const int n = static_cast<int>(trace.size());
  for (const bool rec : {true, false}) {
    for (const double temperature : {kTemperatures[0], kTemperatures[1], -1.0}) {  // -1: both
      const auto keep = [&](int i) {
        return without.sent[i] && without.results[i].ok && recurring[i] == rec &&
               (temperature < 0 || trace[i].temperature == temperature);
      };
      const Tally on = SumIf(with, trace, 0, n, "", false, keep);
      const Tally off = SumIf(without, trace, 0, n, "", false, keep);
      const json params = {{"prompts", rec ? "recurring" : "seen_once"},
                           {"temperature", temperature < 0 ? json("all") : json(temperature)},
                           {"requests", on.requests}};
      EmitSummary(file, "suffix_tokens_per_second_ratio", params,
                  on.tokens_per_second() / off.tokens_per_second(), "x");
      EmitSummary(file, "suffix_end_to_end_ratio", params,
                  on.end_to_end_tokens_per_second() / off.end_to_end_tokens_per_second(), "x");
      if (temperature < 0) {
        EmitSummary(file, "suffix_step_share", params, on.suffix_step_share(), "fraction");
      }
    }
  }
}

// The statements, per shifted domain and for the run; returns false when a request
// failed or the held-out split did not hold (the statistics would mean nothing).
bool Summarize(std::ostream& file, const std::vector<Arm>& arms,
               const std::vector<TraceRequest>& trace, const std::vector<Phase>& phases,
               const Options& o) {
  bool valid = true;
  const Arm& stat = *Find(arms, "static");
  const Arm& online = *Find(arms, "online");
  const Arm* reference = Find(arms, "reference");
  const Arm* plain = Find(arms, "plain");
  int first = 0;
  for (size_t p = 0; p < phases.size(); ++p) {
    const int from = first, to = first + phases[p].requests;
    first = to;
    const Phase& ph = phases[p];
    const bool shifted = ph.domains.size() == 1 && ph.domains[0] != "prose";
    const bool final_prose = p + 1 == phases.size() && ph.name == "prose";
    if (!shifted && !final_prose) continue;
    const std::string d = ph.domains[0];
    // Phase end: the last quarter of the phase.
    const int quarter = (to - from) / 4, tail = to - quarter;
    const Tally s = Sum(stat, trace, tail, to, d), n = Sum(online, trace, tail, to, d);
    const json params = {{"domain", d}, {"phase", ph.name}, {"k", o.k}};
    EmitSummary(file, "phase_end_alpha_static", params, s.alpha(), "ratio");
    EmitSummary(file, "phase_end_alpha_online", params, n.alpha(), "ratio");
    EmitSummary(file, "phase_end_alpha_gain", params, n.alpha() - s.alpha(), "ratio");
    // The same on the evaluation requests' prompts, which the trainer never trains on: how
    // much of the gain carries over to prompts the draft has not learnt (measured prompts
    // recur within a phase: a domain has 81-400 prompts).
    EmitSummary(file, "phase_end_alpha_heldout_static", params,
                Sum(stat, trace, tail, to, d, /*held_out=*/true).alpha(), "ratio");
    EmitSummary(file, "phase_end_alpha_heldout_online", params,
                Sum(online, trace, tail, to, d, /*held_out=*/true).alpha(), "ratio");
    if (reference != nullptr) {
      EmitSummary(file, "phase_end_alpha_reference", params,
                  Sum(*reference, trace, tail, to, d).alpha(), "ratio");
    }
    if (final_prose) continue;
    EmitSummary(file, "phase_end_mean_acceptance_length_online", params,
                n.mean_acceptance_length(), "tokens");
    EmitSummary(file, "phase_end_tokens_per_second_online_over_static", params,
                n.tokens_per_second() / s.tokens_per_second(), "x");
    if (reference != nullptr) {
      EmitSummary(file, "phase_end_tokens_per_second_online_over_reference", params,
                  n.tokens_per_second() / Sum(*reference, trace, tail, to, d).tokens_per_second(),
                  "x");
    }
    // The same ratios by temperature, and the greedy requests' share of the online arm's
    // decoding time. A domain's prompts recur by its phase's end, and a recurring greedy request
    // is answered by the suffix proposer 6.5-8 tokens a step in every arm, so there arms tie:
    // the phase-end ratio is the sampled requests' ratio diluted by that share.
    for (const double temperature : kTemperatures) {
      const auto at = [&](int i) { return trace[i].temperature == temperature; };
      const Tally nt = SumIf(online, trace, tail, to, d, false, at);
      const json tparams = {{"domain", d}, {"phase", ph.name}, {"temperature", temperature}};
      EmitSummary(
          file, "phase_end_tokens_per_second_online_over_static_by_temperature", tparams,
          nt.tokens_per_second() / SumIf(stat, trace, tail, to, d, false, at).tokens_per_second(),
          "x");
      if (reference != nullptr) {
        EmitSummary(file, "phase_end_tokens_per_second_online_over_reference_by_temperature",
                    tparams,
                    nt.tokens_per_second() /
                        SumIf(*reference, trace, tail, to, d, false, at).tokens_per_second(),
                    "x");
      }
      if (temperature == kTemperatures[0]) {
        EmitSummary(file, "phase_end_greedy_share_of_online_decode_seconds", params,
                    nt.decode_seconds / n.decode_seconds, "fraction");
      }
    }
    if (plain != nullptr) {
      const Tally base = Sum(*plain, trace, tail, to, d);
      for (const Arm& a : arms) {
        if (a.name == "plain" || a.name == "static-no-suffix") continue;
        const Tally t = Sum(a, trace, tail, to, d);
        const json arm_params = {{"domain", d}, {"phase", ph.name}, {"arm", a.name}};
        EmitSummary(file, "phase_end_tokens_per_second_over_plain", arm_params,
                    t.tokens_per_second() / base.tokens_per_second(), "x");
        EmitSummary(file, "phase_end_end_to_end_over_plain", arm_params,
                    t.end_to_end_tokens_per_second() / base.end_to_end_tokens_per_second(), "x");
      }
    }
    // Adaptation: the online arm's tokens/s over the phase's second quarter against its last
    // quarter (>= 0.9: 90% of the phase-end speed within the first half), and the first
    // window (of --window requests, two windows averaged) reaching 90% of it, as a fraction of
    // the phase.
    const int q2 = from + quarter, q3 = from + 2 * quarter;
    const double online_q2 = Sum(online, trace, q2, q3, d).tokens_per_second();
    EmitSummary(file, "adaptation_second_quarter_over_phase_end", params,
                online_q2 / n.tokens_per_second(), "x");
    // The same ratio for the arms that do not learn: what the trace alone does to tokens/s
    // between the two quarters (a domain's prompts start to recur part way through its phase,
    // and the suffix proposer answers a recurring greedy request 6.5-8 tokens a step, in every
    // arm). And online's tokens/s over the reference arm's on the same requests, second
    // quarter against last: adaptation with the trace's composition divided out.
    for (const Arm* control : {&stat, reference}) {
      if (control == nullptr) continue;
      EmitSummary(file, "adaptation_second_quarter_over_phase_end_control",
                  {{"domain", d}, {"phase", ph.name}, {"arm", control->name}},
                  Sum(*control, trace, q2, q3, d).tokens_per_second() /
                      Sum(*control, trace, tail, to, d).tokens_per_second(),
                  "x");
    }
    if (reference != nullptr) {
      const double second = online_q2 / Sum(*reference, trace, q2, q3, d).tokens_per_second();
      const double last =
          n.tokens_per_second() / Sum(*reference, trace, tail, to, d).tokens_per_second();
      EmitSummary(file, "adaptation_second_quarter_over_phase_end_vs_reference", params,
                  second / last, "x");
    }
    double reached = 1.0;
    for (int w = from; w < to; w += o.window) {
      const Tally t = Sum(online, trace, w, std::min(to, w + 2 * o.window), d);
      if (t.tokens_per_second() >= 0.9 * n.tokens_per_second()) {
        reached = static_cast<double>(std::min(to, w + 2 * o.window) - from) / (to - from);
        break;
      }
    }
    EmitSummary(file, "adaptation_phase_fraction", params, reached, "fraction");
  }
  if (plain != nullptr) {
    // Over the whole trace, on the requests the plain arm replayed (the same requests).
    const int n = static_cast<int>(trace.size());
    const auto same = [&](int i) { return plain->sent[i]; };
    const Tally base = Sum(*plain, trace, 0, n, "");
    for (const Arm& a : arms) {
      if (a.name == "plain") continue;
      const Tally t = SumIf(a, trace, 0, n, "", false, same);
      EmitSummary(file, "trace_tokens_per_second_over_plain", {{"arm", a.name}},
                  t.tokens_per_second() / base.tokens_per_second(), "x");
      EmitSummary(file, "trace_end_to_end_over_plain", {{"arm", a.name}},
                  t.end_to_end_tokens_per_second() / base.end_to_end_tokens_per_second(), "x");
    }
  }
  if (plain != nullptr) {
    // The server's own estimate of its speed over plain decoding (specloop_plain_equivalent_
    // seconds_total over specloop_decode_seconds_total, decode steps only), beside the measured
    // one over the whole arm (per request, prefill and HTTP included).
    const int n = static_cast<int>(trace.size());
    for (const Arm& a : arms) {
      if (a.name == "plain" || a.name == "static-no-suffix") continue;
      for (const std::string d : {"prose", "docs", "python", "c", "legal"}) {
        const std::string label = "domain=\"" + d + "\"";
        const double decode =
            e2e::MetricValue(a.server_metrics, "specloop_decode_seconds_total", label);
        const double plain_s =
            e2e::MetricValue(a.server_metrics, "specloop_plain_equivalent_seconds_total", label);
        const Tally measured = Sum(a, trace, 0, n, d), base = Sum(*plain, trace, 0, n, d);
        if (measured.requests == 0 || base.requests == 0) continue;
        const json params = {{"arm", a.name}, {"domain", d}};
        EmitSummary(file, "server_estimated_over_plain", params,
                    decode > 0 ? plain_s / decode : NAN, "x");
        EmitSummary(file, "measured_over_plain", params,
                    measured.tokens_per_second() / base.tokens_per_second(), "x");
      }
    }
  }
  const Arm* no_suffix = Find(arms, "static-no-suffix");
  if (no_suffix != nullptr) SummarizeSuffix(file, stat, *no_suffix, trace);
  for (const Arm& a : arms) {
    int failed = 0;
    for (size_t i = 0; i < a.results.size(); ++i) failed += a.sent[i] && !a.results[i].ok;
    for (size_t i = 0; i < a.results.size() && failed > 0; ++i) {
      if (a.sent[i] && !a.results[i].ok) {
        std::cerr << "faster_over_time: " << a.name << " request " << i
                  << " failed: " << a.results[i].error << "\n";
        break;
      }
    }
    EmitSummary(file, "failed_requests", {{"arm", a.name}}, failed, "requests");
    EmitSummary(file, "wall_seconds", {{"arm", a.name}}, a.wall_s, "s");
    valid = valid && failed == 0;
  }
  const TrainerSample last = online.trainer.empty() ? TrainerSample() : online.trainer.back();
  int eval_requests = 0;
  for (const TraceRequest& r : trace) eval_requests += r.eval ? 1 : 0;
  EmitSummary(file, "versions_published", {{"arm", "online"}}, last.published, "versions");
  EmitSummary(file, "versions_refused_by_gate", {{"arm", "online"}}, last.refused, "versions");
  EmitSummary(file, "trainer_heldout_records", {{"eval_requests", eval_requests}}, last.heldout,
              "records");
  EmitSummary(file, "trainer_evaluation_time_share", {{"arm", "online"}},
              last.evaluation_s / std::max(1e-9, last.evaluation_s + last.step_s), "fraction");
  // Steps and evaluations over the arm's length: below 1 the trainer waited, for traffic
  // (max_replay) or its next catch-up.
  EmitSummary(file, "trainer_busy_share", {{"arm", "online"}},
              (last.evaluation_s + last.step_s) / std::max(1e-9, last.t), "fraction");
  // The live draft runs only on records new since the last evaluation: its share of the
  // records the two drafts were run on, against 0.5 when both ran on every one.
  EmitSummary(file, "trainer_evaluated_records_live_share", {{"arm", "online"}},
              last.evaluated_live /
                  std::max(1.0, last.evaluated_live + last.evaluated_candidate),
              "fraction");
  if (last.heldout > static_cast<uint64_t>(eval_requests)) {
    std::cerr << "faster_over_time: the trainer holds out " << last.heldout
              << " records but only " << eval_requests
              << " evaluation requests were sent: replayed prompts leaked into evaluation\n";
    valid = false;
  }
  return valid;
}

// --forgetting: the trainer's held-out alpha per domain at each of its evaluations (polled from
// /metrics), and for each domain while it is idle (served in an earlier phase, not in this one)
// how far the live and the candidate draft fall below the domain's best. The best is the
// highest live alpha on the domain at an evaluation since it went idle: its held-out set no
// longer changes then, and the first such evaluation scores the draft trained while it was
// served. Emits forgetting.heldout_alpha per evaluation, forgetting.idle_max_drop per domain,
// idle phase and model, and forgetting.idle_max_drop_all per model; returns the largest drop
// of the live and the candidate draft (NaN when no idle domain was evaluated).
std::pair<double, double> SummarizeForgetting(std::ostream& file, const Arm& online,
                                              const std::vector<TraceRequest>& trace,
                                              const std::vector<Phase>& phases) {
  std::vector<double> phase_start(phases.size(), INFINITY);
  for (size_t i = 0; i < trace.size(); ++i) {
    const Result& r = online.results[i];
    if (r.ok) phase_start[trace[i].phase] = std::min(phase_start[trace[i].phase], r.start_s);
  }
  const auto phase_at = [&](double t) {
    size_t p = 0;
    for (size_t q = 0; q < phases.size(); ++q) {
      if (phase_start[q] <= t) p = q;
    }
    return p;
  };
  std::map<std::string, size_t> first_served;  // domain -> its first phase
  for (size_t p = 0; p < phases.size(); ++p) {
    for (const std::string& d : phases[p].domains) first_served.emplace(d, p);
  }
  std::map<std::string, double> best;                              // since idle, live
  std::map<std::pair<std::string, size_t>, std::string> idle_key;  // (domain, phase) seen
  // (domain, phase, model) -> the largest drop and the best it fell from.
  std::map<std::tuple<std::string, size_t, std::string>, std::pair<double, double>> max_drop;
  std::map<std::string, double> all_drop = {{"live", NAN}, {"candidate", NAN}};
  uint64_t evaluations = 0;
  for (const TrainerSample& s : online.trainer) {
    if (s.evaluations <= evaluations) continue;
    evaluations = s.evaluations;
    const size_t p = phase_at(s.t);
    for (const auto& [dm, a] : s.alpha) {
      const auto& [d, m] = dm;
      const auto fs = first_served.find(d);
      const bool idle = fs != first_served.end() && fs->second < p &&
                        std::find(phases[p].domains.begin(), phases[p].domains.end(), d) ==
                            phases[p].domains.end();
      EmitSummary(file, "forgetting.heldout_alpha",
                  {{"domain", d}, {"model", m}, {"evaluation", s.evaluations},
                   {"t", std::round(s.t * 10) / 10}, {"phase", phases[p].name}, {"idle", idle},
                   {"version", s.version}},
                  a, "ratio");
      if (!idle) {
        best.erase(d);  // served again: a new idle period starts afresh
        continue;
      }
      const auto live = s.alpha.find({d, "live"});
      if (live != s.alpha.end()) best[d] = std::max(best.count(d) ? best[d] : 0.0, live->second);
    }
    for (const auto& [dm, a] : s.alpha) {
      const auto& [d, m] = dm;
      if (!best.count(d)) continue;  // not idle
      const double drop = best[d] - a;
      auto& [worst, worst_best] =
          max_drop.try_emplace({d, p, m}, -INFINITY, NAN).first->second;
      if (drop > worst) std::tie(worst, worst_best) = std::make_pair(drop, best[d]);
      double& all = all_drop[m];
      all = std::isnan(all) ? drop : std::max(all, drop);
    }
  }
  for (const auto& [key, value] : max_drop) {
    const auto& [d, p, m] = key;
    EmitSummary(file, "forgetting.idle_max_drop",
                {{"domain", d}, {"phase", phases[p].name}, {"model", m}, {"best", value.second}},
                value.first, "ratio");
  }
  for (const auto& [m, drop] : all_drop) {
    EmitSummary(file, "forgetting.idle_max_drop_all", {{"model", m}}, drop, "ratio");
  }
  return {all_drop["live"], all_drop["candidate"]};
}

// Per domain over the trace, for the static (dashed), online (solid) and reference (dotted)
// arms: tokens/s over plain decoding (or tokens/s, without a plain arm) above, alpha below;
// phases and draft versions marked. Skipped with a message when gnuplot is missing.
void Plot(const Options& o, const Series& data, const Arm& online, bool over_plain,
          const std::vector<TraceRequest>& trace, const std::vector<Phase>& phases) {
  const std::string dat = o.out + "/faster_over_time.dat", gp = o.out + "/faster_over_time.gp";
  std::map<std::pair<std::string, std::string>, int> block;  // gnuplot's `index`
  {
    std::ofstream out(dat);
    for (const auto& [key, rows] : data) {
      out << "# " << key.first << " " << key.second << "\n" << rows << "\n\n";
      block[key] = static_cast<int>(block.size());
    }
  }
  std::ofstream g(gp);
  g << "set terminal pngcairo size 1400,900 font 'DejaVu Sans,10'\n"
    << "set output '" << o.out << "/faster_over_time.png'\n"
    << "set multiplot layout 2,1 title 'specloop on " << fs::path(o.target).filename().string()
    << ": draft-prose-1m static vs online, draft-mix-1m reference (k " << o.k << ", "
    << o.concurrency << (o.concurrency == 1 ? " client" : " clients")
    << ")'\nset grid\nset key outside right\nset lmargin 10\n";
  std::string marks;
  int first = 0;
  for (const Phase& p : phases) {
    marks += "set arrow from " + std::to_string(first) + ", graph 0 to " +
             std::to_string(first) + ", graph 1 nohead lc rgb 'black' lw 1\n";
    marks += "set label '" + p.name + "' at " + std::to_string(first + 4) +
             ", graph 0.96 font ',9'\n";
    first += p.requests;
  }
  uint64_t version = 0;
  for (size_t i = 0; i < trace.size(); ++i) {
    const Result& r = online.results[i];
    if (r.ok && r.version > version) {
      version = r.version;
      marks += "set arrow from " + std::to_string(i) + ", graph 0 to " + std::to_string(i) +
               ", graph 0.9 nohead dt 3 lc rgb 'gray40'\n";
      marks += "set label 'v" + std::to_string(version) + "' at " + std::to_string(i) +
               ", graph 0.05 font ',7' tc rgb 'gray40'\n";
    }
  }
  const std::vector<std::pair<std::string, std::string>> colors = {
      {"prose", "#1b9e77"}, {"docs", "#7570b3"}, {"python", "#d95f02"}, {"c", "#e7298a"},
      {"legal", "#66a61e"}};
  const std::map<std::string, std::string> dash = {
      {"static", "2"}, {"online", "1"}, {"reference", "3"}};
  const auto series = [&](int column) {
    std::string s;
    for (const auto& [d, color] : colors) {
      for (const auto& [arm, dt] : dash) {
        auto it = block.find({arm, d});
        if (it == block.end()) continue;
        s += std::string(s.empty() ? "plot " : ", ") + "'" + dat + "' index " +
             std::to_string(it->second) + " using 1:" + std::to_string(column) +
             " with linespoints pt 7 ps 0.4 lw " + (arm == "online" ? "2" : "1") +
             " lc rgb '" + color + "' dt " + dt + " title '" + d + " " + arm + "'";
      }
    }
    return s + "\n";
  };
  g << marks;
  if (over_plain) {
    g << "set ylabel 'tokens/s over plain decoding'\nset yrange [0:*]\n" << series(4);
  } else {
    g << "set ylabel 'tokens/s per stream'\nset yrange [0:*]\n" << series(3);
  }
  g << "set ylabel 'alpha (the draft model, per token)'\nset xlabel 'request (trace order)'\n"
    << "set yrange [0:1]\n" << series(2) << "unset multiplot\n";
  g.close();
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    std::cerr << "faster_over_time: gnuplot not found; no PNG (apt-get install gnuplot-nox)\n";
    return;
  }
  if (std::system(("gnuplot '" + gp + "'").c_str()) != 0) {
    std::cerr << "faster_over_time: gnuplot failed on " << gp << "\n";
  }
}

int Main(int argc, char** argv) {
  Options o;
  bool phase_requests_set = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "faster_over_time: " << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--short") {
      o.short_mode = true;
    } else if (a == "--forgetting") {
      o.forgetting = true;
    } else if (a == "--out") {
      o.out = value();
    } else if (a == "--shared") {
      o.shared = value();
    } else if (a == "--target") {
      o.target = value();
    } else if (a == "--binary") {
      o.binary = value();
    } else if (a == "--concurrency") {
      o.concurrency = std::stoi(value());
    } else if (a == "--phase-requests") {
      o.phase_requests = std::stoi(value());
      phase_requests_set = true;
    } else if (a == "--window") {
      o.window = std::stoi(value());
    } else if (a == "--k") {
      o.k = value();
    } else if (a == "--max-tokens") {
      o.max_tokens = std::stoi(value());
    } else if (a == "--train-arg") {
      o.train_args.push_back(value());
    } else if (a == "--trainer-eval-every") {
      o.trainer_eval_every = std::stoi(value());
    } else {
      std::cerr << "usage: faster_over_time [--short | --forgetting] [--out DIR] [--target DIR] "
                   "[--concurrency N] [--phase-requests N] [--window N] [--k auto|N] "
                   "[--max-tokens N] [--trainer-eval-every N] [--train-arg FLAG ...] "
                   "[--binary PATH] [--shared DIR]\n";
      return 2;
    }
  }
  const bool small = o.short_mode || o.forgetting;  // target-6m, k = 4, 4 clients
  if (o.target.empty()) {
    o.target = o.shared + (small ? "/models/target-6m" : "/models/target-wide-46m");
  }
  if (o.k.empty()) o.k = small ? "4" : "auto";
  if (o.concurrency <= 0) o.concurrency = small ? 4 : 1;
  if (o.short_mode && !phase_requests_set) o.phase_requests = 224;
  fs::create_directories(o.out);
  const std::vector<Phase> phases = Phases(o);
  const std::vector<TraceRequest> trace = BuildTrace(o, phases);
  std::vector<Arm> arms;
  for (const ArmSpec& spec : Arms(o)) arms.push_back(RunArm(spec, o, trace));
  std::ofstream file(o.out + "/faster_over_time.jsonl");
  const Arm* plain = Find(arms, "plain");
  Series series;
  for (const Arm& a : arms) {
    if (a.name == "static" || a.name == "online" || a.name == "reference") {
      EmitWindows(file, a, plain, trace, phases, o, &series);
    }
  }
  bool valid = true;
  if (o.forgetting) {
    const auto [live, candidate] = SummarizeForgetting(file, arms[0], trace, phases);
    std::cerr << "faster_over_time: idle domains' largest held-out alpha drop below their best: "
              << "live " << live << ", candidate " << candidate << "\n";
    int failed = 0;
    for (size_t i = 0; i < trace.size(); ++i) failed += arms[0].sent[i] && !arms[0].results[i].ok;
    EmitSummary(file, "failed_requests", {{"arm", "online"}}, failed, "requests");
    EmitSummary(file, "versions_published", {{"arm", "online"}},
                arms[0].trainer.empty() ? 0 : arms[0].trainer.back().published, "versions");
    valid = failed == 0;
  } else {
    valid = Summarize(file, arms, trace, phases, o);
  }
  if (!o.short_mode && !o.forgetting) {
    const int at = FirstPublish(o);
    EmitSummary(file, "first_publish_requests",
                {{"domain", "c"}, {"target", fs::path(o.target).filename().string()}},
                at < 0 ? NAN : at, "requests");
    valid = valid && at != -2;
  }
  Plot(o, series, *Find(arms, "online"), plain != nullptr, trace, phases);
  return valid ? 0 : 1;
}

}  // namespace
}  // namespace specloop

int main(int argc, char** argv) { return specloop::Main(argc, argv); }
