// Domain-shift benchmark (issue 8): the service gets faster as its traffic moves to new domains.
//
// One run, two arms over the same trace, each against its own `specloop up` (a fresh data dir,
// draft-prose-1m at the start, the same fixed k): `static` (--no-train: the draft never
// changes) and `online` (the trainer distils the draft on the logged traffic and hot-swaps it
// in). The trace is a sequence of phases whose domain mix shifts (prose+docs, python, c, legal,
// an even mix, prose again), replayed by --concurrency closed-loop HTTP clients; requests
// alternate temperature 0 and 0.8, with fixed seeds and max_tokens.
//
// Held-out prompts. Every --eval-every'th request of the trace is an evaluation request: its
// prompt is one the trainer holds out (trainer/heldout_split.h, on the ids the server encodes),
// so the trainer's gate sees held-out traffic of every domain. Those requests are left out of
// every statistic; the replayed (measured) requests use only the other prompts, so no replayed
// prompt is one the trainer evaluates on. The run checks the split: the trainer must report no
// more held-out records than evaluation requests were sent.
//
// Output, stdout and --out/faster_over_time.jsonl, JSON lines:
//   per arm, window (--window consecutive trace requests) and domain:
//     {"arm", "window", "phase", "domain", "requests", "alpha", "tokens_per_step",
//      "tokens_per_second", "draft_version", "objective"}
//   alpha = accepted / tested (per token, as specloop_acceptance_rate); tokens_per_step = generated tokens per target forward;
//   tokens_per_second = generated tokens / request latency (per client stream); draft_version:
//   the newest in the window; objective: the trainer's loss at the window's end (online arm).
//   Then summary lines {"name", "params", "value", "unit"} (see Summarize) and, in --out,
//   requests-<arm>.jsonl (one line per request) and faster_over_time.png (gnuplot).
//
// Usage: faster_over_time [--short] [--out DIR] [--concurrency N] [--phase-requests N]
//                         [--window N] [--k N] [--max-tokens N] [--trainer-eval-every N]
//                         [--train-arg FLAG ...] [--binary PATH] [--shared DIR]
// Full mode (default): 6 phases, 640 requests each (the first and last 320), the trainer at
// its default, adaptive evaluation cadence (--trainer-eval-every N fixes one); ~17 minutes on 2 cores (quiet). At 320 requests a phase lasted
// ~45 s here and online alpha was still rising at its end.
// --short: prose+docs (112) then python (224), for the test suite (~4 minutes on 2 cores).
// Its gate lets a domain fall by 0.05 (default 0.03): learning python costs this draft
// ~0.02-0.04 of docs alpha, and at the default the gate's trade-off, not the learning, would
// decide some 4-minute runs (the full mode keeps the default).
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "common/spec/acceptance.h"
#include "common/tokenizer/model_config.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/e2e/e2e_util.h"
#include "trainer/heldout_split.h"

namespace specloop {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr double kHeldOutFraction = 0.1;  // passed to the trainer as --heldout-fraction

struct Options {
  bool short_mode = false;
  std::string out = "faster-over-time";
  std::string shared = testing::SharedDir();
  std::string binary = SPECLOOP_BINARY;
  int concurrency = 4;
  int phase_requests = 640;
  int window = 16;
  int k = 4;
  int max_tokens = 64;
  int eval_every = 8;
  // Trainer steps between evaluations (the gate); 0: the trainer's default, adaptive cadence.
  int trainer_eval_every = 0;
  std::vector<std::string> train_args;  // more `specloop train` flags for the online arm
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
  double temperature = 0;
};

struct Result {
  bool ok = false;
  std::string error;
  int tokens = 0, drafted = 0, accepted = 0, tested = 0, steps = 0;
  uint64_t version = 0;
  double start_s = 0, end_s = 0;  // since the arm's first request
};

// What the trainer's /metrics said at one moment.
struct TrainerSample {
  double t = 0;  // since the arm's first request
  double loss = NAN;
  uint64_t version = 0, published = 0, refused = 0, heldout = 0;
  // Where the trainer's time went: optimizer steps and evaluations (seconds in all), and the
  // held-out records each draft was run on.
  double step_s = 0, evaluation_s = 0, evaluated_live = 0, evaluated_candidate = 0;
};

struct Arm {
  std::string name;
  std::vector<Result> results;  // by trace index
  std::vector<TrainerSample> trainer;
  double wall_s = 0;
};

std::vector<Phase> Phases(const Options& o) {
  const int n = o.phase_requests;
  if (o.short_mode) return {{"prose+docs", {"prose", "docs"}, n / 2}, {"python", {"python"}, n}};
  return {{"prose+docs", {"prose", "docs"}, n / 2},
          {"python", {"python"}, n},
          {"c", {"c"}, n},
          {"legal", {"legal"}, n},
          {"mix", {"prose", "python", "c", "legal", "docs"}, n},
          {"prose", {"prose"}, n / 2}};
}

// The trace: phases of requests; each domain's prompts split into replay and held-out (eval)
// prompts by the trainer's rule, each list shuffled with a fixed seed and cycled.
std::vector<TraceRequest> BuildTrace(const Options& o, const std::vector<Phase>& phases) {
  const std::string target = o.shared + "/models/target-6m";
  std::unique_ptr<Tokenizer> tokenizer;
  ModelConfig config;
  Status s = Tokenizer::Load(target, &tokenizer);
  if (s.ok()) s = ModelConfig::FromDir(target, &config);
  if (!s.ok()) {
    std::cerr << "faster_over_time: " << s.ToString() << "\n";
    std::exit(1);
  }
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
        if (static_cast<int64_t>(ids.size()) + o.max_tokens > config.max_position_embeddings) {
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
      auto& list = r.eval ? eval[r.domain] : replay[r.domain];
      size_t& next = (r.eval ? next_eval : next_replay)[r.domain];
      r.prompt = list[next++ % list.size()];
      r.temperature = (r.index / 2) % 2 == 0 ? 0.0 : 0.8;  // replay requests alternate too
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
  return true;
}

Result Send(httplib::Client* cli, const TraceRequest& r, const Options& o, double t0_s) {
  using Clock = std::chrono::steady_clock;
  const auto now = [] {
    return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
  };
  Result out;
  out.start_s = now() - t0_s;
  const json req = {{"prompt", r.prompt},           {"max_tokens", o.max_tokens},
                    {"temperature", r.temperature}, {"seed", r.index},
                    {"domain", r.domain}};
  auto res = cli->Post("/v1/completions", req.dump(), "application/json");
  out.end_s = now() - t0_s;
  if (!res) {
    out.error = "transport: " + httplib::to_string(res.error());
    return out;
  }
  if (res->status != 200) {
    out.error = "HTTP " + std::to_string(res->status) + ": " + res->body.substr(0, 200);
    return out;
  }
  const json j = json::parse(res->body, nullptr, false);
  if (j.is_discarded() || !j.contains("speculative") || !j.contains("usage")) {
    out.error = "malformed response: " + res->body.substr(0, 200);
    return out;
  }
  const json& s = j["speculative"];
  out.tokens = j["usage"]["completion_tokens"].get<int>();
  out.drafted = s["drafted"].get<int>();
  out.accepted = s["accepted"].get<int>();
  out.tested = s["tested"].get<int>();
  out.steps = s["steps"].get<int>();
  out.version = s["draft_version"].get<uint64_t>();
  out.ok = true;
  return out;
}

// Starts `specloop up` for one arm, replays the trace, stops it.
Arm RunArm(const std::string& name, const Options& o, const std::vector<TraceRequest>& trace) {
  Arm arm;
  arm.name = name;
  const bool online = name == "online";
  const std::string data = o.out + "/" + name + "-data";
  fs::remove_all(data);
  const int port = e2e::FreePort(), metrics_port = e2e::FreePort();
  std::vector<std::string> argv = {o.binary, "up", "--target", o.shared + "/models/target-6m",
                                   "--draft", o.shared + "/models/draft-prose-1m",
                                   "--data", data, "--port", std::to_string(port),
                                   "--trainer-metrics-port", std::to_string(metrics_port),
                                   "--serve-arg=--k=" + std::to_string(o.k),
                                   "--serve-arg=--threads=1"};
  if (online) {
    for (const std::string& a :
         {"--eval-every=" + std::to_string(o.trainer_eval_every),
          "--heldout-fraction=" + std::to_string(kHeldOutFraction), std::string("--threads=1")}) {
      if (a != "--eval-every=0") argv.push_back("--train-arg=" + a);  // 0: the default
    }
    for (const std::string& a : o.train_args) argv.push_back("--train-arg=" + a);
  } else {
    argv.push_back("--no-train");
  }
  e2e::Child up(argv, /*echo=*/false);
  const bool ready = !up.WaitForLine("specloop up: serve is ready", 120).empty() &&
                     (!online || !up.WaitForLine("specloop up: train is ready", 120).empty());
  if (!ready) {
    std::cerr << "faster_over_time: `specloop up` did not start:\n" << up.Output();
    std::exit(1);
  }
  std::cerr << "faster_over_time: arm " << name << ": " << trace.size() << " requests, "
            << o.concurrency << " clients\n";

  using Clock = std::chrono::steady_clock;
  const double t0 = std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
  const auto since = [t0] {
    return std::chrono::duration<double>(Clock::now().time_since_epoch()).count() - t0;
  };
  arm.results.resize(trace.size());
  std::atomic<size_t> next{0};
  std::atomic<bool> done{false};
  std::mutex mu;
  std::thread poller;
  if (online) {
    poller = std::thread([&] {
      while (!done.load()) {
        TrainerSample s;
        if (PollTrainer(metrics_port, since(), &s)) {
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
      for (size_t i; (i = next.fetch_add(1)) < trace.size();) {
        arm.results[i] = Send(&cli, trace[i], o, t0);
        if ((i + 1) % 100 == 0) {
          std::cerr << "faster_over_time: arm " << name << ": " << i + 1 << " requests, "
                    << static_cast<int>(since()) << " s\n";
        }
      }
    });
  }
  for (std::thread& t : clients) t.join();
  arm.wall_s = since();
  done = true;
  if (poller.joinable()) poller.join();
  if (online) {  // the last word: after one more catch-up period
    std::this_thread::sleep_for(std::chrono::seconds(6));
    TrainerSample s;
    if (PollTrainer(metrics_port, since(), &s)) arm.trainer.push_back(s);
  }
  up.Signal(SIGINT);
  if (up.Wait(60) == -1) std::cerr << "faster_over_time: `specloop up` did not stop in 60 s\n";
  for (const char* l : {"published", "refused", "rejected", "restart", "rollback"}) {
    for (size_t from = 0;;) {
      const std::string line = up.WaitForLine(l, 0, &from);
      if (line.empty()) break;
      std::cerr << "  [" << name << "] " << line << "\n";
    }
  }
  std::ofstream per_request(o.out + "/requests-" + name + ".jsonl");
  for (size_t i = 0; i < trace.size(); ++i) {
    const Result& r = arm.results[i];
    per_request << json{{"index", i},          {"phase", trace[i].phase},
                        {"domain", trace[i].domain}, {"eval", trace[i].eval},
                        {"temperature", trace[i].temperature}, {"ok", r.ok},
                        {"error", r.error},    {"tokens", r.tokens},
                        {"drafted", r.drafted}, {"accepted", r.accepted},
                        {"tested", r.tested},  {"steps", r.steps},    {"draft_version", r.version},
                        {"start_s", r.start_s}, {"end_s", r.end_s}}
                       .dump()
                << "\n";
  }
  return arm;
}

// Sums over a set of replayed (non-eval, successful) requests.
struct Tally {
  int requests = 0;
  double tokens = 0, drafted = 0, accepted = 0, tested = 0, steps = 0, latency = 0;
  uint64_t version = 0;
  void Add(const Result& r) {
    ++requests;
    tokens += r.tokens;
    drafted += r.drafted;
    accepted += r.accepted;
    tested += r.tested;
    steps += r.steps;
    latency += r.end_s - r.start_s;
    version = std::max(version, r.version);
  }
  double alpha() const { return tested > 0 ? accepted / tested : NAN; }
  double tokens_per_step() const { return steps > 0 ? tokens / steps : NAN; }
  double tokens_per_second() const { return latency > 0 ? tokens / latency : NAN; }
};

// The measured requests of `domain` in [from, to); with `held_out`, the evaluation requests
// instead (prompts the trainer never trains on).
Tally Sum(const Arm& arm, const std::vector<TraceRequest>& trace, int from, int to,
          const std::string& domain, bool held_out = false) {
  Tally t;
  for (int i = from; i < to; ++i) {
    if (trace[i].eval != held_out || !arm.results[i].ok || trace[i].domain != domain) continue;
    t.Add(arm.results[i]);
  }
  return t;
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

// Plot data: "request alpha tokens/s" rows per (arm, domain).
using Series = std::map<std::pair<std::string, std::string>, std::string>;

// Per window and domain lines for one arm; adds the arm's rows to *series.
void EmitWindows(std::ostream& file, const Arm& arm, const std::vector<TraceRequest>& trace,
                 const std::vector<Phase>& phases, const Options& o, Series* series) {
  std::map<std::string, int> last_window;  // per domain, the last window with a point
  for (int w = 0; w * o.window < static_cast<int>(trace.size()); ++w) {
    const int from = w * o.window, to = std::min<int>(trace.size(), from + o.window);
    const double end_s = arm.results[to - 1].end_s;
    double objective = NAN;
    for (const TrainerSample& s : arm.trainer) {
      if (s.t <= end_s && !std::isnan(s.loss)) objective = s.loss;
    }
    std::set<std::string> domains;
    for (int i = from; i < to; ++i) domains.insert(trace[i].domain);
    for (const std::string& d : domains) {
      const Tally t = Sum(arm, trace, from, to, d);
      if (t.requests == 0) continue;
      Emit(file, {{"arm", arm.name},
                  {"window", w},
                  {"phase", phases[trace[from].phase].name},
                  {"domain", d},
                  {"requests", t.requests},
                  {"alpha", Num(t.alpha())},
                  {"tokens_per_step", Num(t.tokens_per_step())},
                  {"tokens_per_second", Num(t.tokens_per_second())},
                  {"draft_version", t.version},
                  {"objective", Num(objective)}});
      char row[128];
      std::snprintf(row, sizeof(row), "%d %.4f %.3f\n", (from + to) / 2, t.alpha(),
                    t.tokens_per_second());
      std::string& rows = (*series)[{arm.name, d}];
      if (last_window.count(d) && last_window[d] != w - 1) rows += "\n";  // a gap: break the line
      last_window[d] = w;
      rows += row;
    }
  }
}

// The statements, per shifted domain and for the run; returns false when a request
// failed or the held-out split did not hold (the statistics would mean nothing).
bool Summarize(std::ostream& file, const Arm& stat, const Arm& online,
               const std::vector<TraceRequest>& trace, const std::vector<Phase>& phases,
               const Options& o) {
  bool valid = true;
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
    const int tail = to - (to - from) / 4;
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
    if (final_prose) continue;
    EmitSummary(file, "tokens_per_step_ratio", params, n.tokens_per_step() / s.tokens_per_step(),
                "x");
    EmitSummary(file, "tokens_per_second_ratio", params,
                n.tokens_per_second() / s.tokens_per_second(), "x");
    // Same k, draft and target in both arms: the cost of a step is the same, so the predicted
    // speed ratio is the ratio of expected tokens per step at the measured alphas.
    EmitSummary(file, "tokens_per_second_ratio_predicted", params,
                spec::ExpectedTokensPerStep(n.alpha(), o.k) /
                    spec::ExpectedTokensPerStep(s.alpha(), o.k),
                "x");
    // Adaptation: the first window of the phase whose online alpha reaches 90% of the
    // phase-end value, as a fraction of the phase.
    double reached = 1.0;
    for (int w = from; w < to; w += o.window) {
      const Tally t = Sum(online, trace, w, std::min(to, w + o.window), d);
      if (t.alpha() >= 0.9 * n.alpha()) {
        reached = static_cast<double>(std::min(to, w + o.window) - from) / (to - from);
        break;
      }
    }
    EmitSummary(file, "adaptation_phase_fraction", params, reached, "fraction");
    // Measured prompts recur within a phase, so alpha by the prompt's visit (1: its first
    // request in the phase): a temperature-0 visit repeats the continuation of the prompt's
    // earlier ones at temperature 0, and what the draft learnt of those prompts shows as a
    // rise over visits; the static arm's values are the same draft on the same requests. A
    // prompt listed twice in its file has twice the visits, so the highest visits hold few
    // requests.
    std::map<std::string, int> seen;
    std::vector<std::pair<int, int>> visits;  // (trace index, visit) of the measured requests
    for (int i = from; i < to; ++i) {
      if (!trace[i].eval && trace[i].domain == d) visits.emplace_back(i, ++seen[trace[i].prompt]);
    }
    for (const Arm* a : {&stat, &online}) {
      std::map<int, Tally> by_visit;
      for (const auto& [i, visit] : visits) {
        if (a->results[i].ok) by_visit[visit].Add(a->results[i]);
      }
      for (const auto& [v, t] : by_visit) {
        EmitSummary(file, "alpha_by_visit",
                    {{"domain", d},
                     {"phase", ph.name},
                     {"arm", a->name},
                     {"visit", v},
                     {"requests", t.requests},
                     {"k", o.k}},
                    t.alpha(), "ratio");
      }
    }
  }
  for (const Arm* a : {&stat, &online}) {
    int failed = 0;
    for (const Result& r : a->results) failed += r.ok ? 0 : 1;
    for (size_t i = 0; i < a->results.size() && failed > 0; ++i) {
      if (!a->results[i].ok) {
        std::cerr << "faster_over_time: " << a->name << " request " << i
                  << " failed: " << a->results[i].error << "\n";
        break;
      }
    }
    EmitSummary(file, "failed_requests", {{"arm", a->name}}, failed, "requests");
    EmitSummary(file, "wall_seconds", {{"arm", a->name}}, a->wall_s, "s");
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

// alpha and tokens/s over the trace per domain (static dashed, online solid), phases and
// draft versions marked. Skipped with a message when gnuplot is missing.
void Plot(const Options& o, const Series& data, const Arm& online,
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
    << "set multiplot layout 2,1 title 'specloop: draft-prose-1m on target-6m, static vs online "
       "(k = "
    << o.k << ", " << o.concurrency << " clients)'\nset grid\nset key outside right\n";
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
  const auto series = [&](int column) {
    std::string s;
    for (const auto& [d, color] : colors) {
      for (const std::string arm : {"static", "online"}) {
        auto it = block.find({arm, d});
        if (it == block.end()) continue;
        s += std::string(s.empty() ? "plot " : ", ") + "'" + dat + "' index " +
             std::to_string(it->second) + " using 1:" + std::to_string(column) +
             " with linespoints pt 7 ps 0.5 lw 1.5 lc rgb '" + color + "' dt " +
             (arm == "static" ? "2" : "1") + " title '" + d + " " + arm + "'";
      }
    }
    return s + "\n";
  };
  g << marks << "set ylabel 'alpha (acceptance)'\nset yrange [0:1]\n" << series(2)
    << "set ylabel 'tokens/s per stream'\nset xlabel 'request (trace order)'\nset yrange [0:*]\n"
    << series(3) << "unset multiplot\n";
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
    } else if (a == "--out") {
      o.out = value();
    } else if (a == "--shared") {
      o.shared = value();
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
      o.k = std::stoi(value());
    } else if (a == "--max-tokens") {
      o.max_tokens = std::stoi(value());
    } else if (a == "--train-arg") {
      o.train_args.push_back(value());
    } else if (a == "--trainer-eval-every") {
      o.trainer_eval_every = std::stoi(value());
    } else {
      std::cerr << "usage: faster_over_time [--short] [--out DIR] [--concurrency N] "
                   "[--phase-requests N] [--window N] [--k N] [--max-tokens N] "
                   "[--trainer-eval-every N] [--train-arg FLAG ...] [--binary PATH] "
                   "[--shared DIR]\n";
      return 2;
    }
  }
  if (o.short_mode) {  // a shorter phase, a looser domain tolerance
    if (!phase_requests_set) o.phase_requests = 224;
    o.train_args.insert(o.train_args.begin(), "--max-domain-regression=0.05");
  }
  fs::create_directories(o.out);
  const std::vector<Phase> phases = Phases(o);
  const std::vector<TraceRequest> trace = BuildTrace(o, phases);
  const Arm stat = RunArm("static", o, trace);
  const Arm online = RunArm("online", o, trace);
  std::ofstream file(o.out + "/faster_over_time.jsonl");
  Series series;
  EmitWindows(file, stat, trace, phases, o, &series);
  EmitWindows(file, online, trace, phases, o, &series);
  const bool valid = Summarize(file, stat, online, trace, phases, o);
  Plot(o, series, online, trace, phases);
  return valid ? 0 : 1;
}

}  // namespace
}  // namespace specloop

int main(int argc, char** argv) { return specloop::Main(argc, argv); }
