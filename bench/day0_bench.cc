// Day-0 benchmark (issue 46, "Must show: Day 0" and "Acceptance"): a target with no draft at
// all, served by `specloop up --target T` (no --draft: plain decoding at once while the trainer
// grows an EAGLE-3 head from the target and publishes the first one its gate finds faster than
// plain decoding), against plain decoding on the same requests, in one run.
//
// Arms, both started at the beginning and kept running (default target: target-wide-46m):
//   up     `specloop up --target T --serve-arg=--no-suffix` at its defaults otherwise (on two
//          cores: the server on one compute thread, the trainer on the other)
//   plain  `specloop serve --target T --k 0 --no-suffix --no-log --threads 1`: plain decoding
//          on the up server's one thread (the trainer's core is busy in both arms' time)
//   twin   a second, identical plain server: plain-twin over plain is the noise of two
//          identical arms (processes included)
// One streaming client sends N requests (--requests, default 1000) to `up`, one at a time:
// python prompts no request repeats (below), temperature 0 and 0.8 alternating, 64 tokens,
// seed = the request's index, domain "python". Plain decoding answers the same request beside
// every --plain-every'th request and beside each of the last --last (default 100), where the
// twin answers it too; the order of the arms rotates from request to request. Tokens/s is decoding's: the tokens after
// the first over the time after the first streamed token (1 / TPOT), per request.
//
// Prompts, never repeated and never seen by any model in training: the 90 prompts of
// SHARED/prompts/python.jsonl (cut from documents held out of the corpus) and windows of
// SHARED/corpus/python/valid.txt (>= 200 characters to a line end, each followed by >= 180
// characters no prompt contains, so that no prompt holds the text that continues another),
// ~1,000 in all, shuffled with a fixed seed. The python.jsonl prompts the trainer would hold
// out (trainer/heldout_split.h, on the server's ids) are never sent: they are the held-out
// evaluation set, written to OUT/heldout/python.jsonl. The valid-split windows it would hold
// out are sent (the trainer's gate evaluates on their records, never trains on them). A run
// longer than the pool cycles it and says so (recurring_requests).
//
// After the traffic, with the trainer's latest head (DATA/checkpoints/latest, the version it
// published last): spec_bench (one thread, --reps --eval-reps) on the held-out prompts, the head
// and draft-mix-1m in one run, at k = 4 and auto, temperatures 0 and 0.8: each draft's mean
// acceptance length at k = 4 (goal: the head's >= draft-mix-1m's) and tokens/s over plain.
//
// Output (stdout and OUT/day0.jsonl), JSON lines {"name", "params", "value", "unit"}:
//   day0.window_*: per --window requests, up's tokens/s, mean acceptance length (the head's
//     blocks: 1 + accepted per verified draft), draft version at the window's end, and its
//     tokens/s over plain's on the plain-beside requests of the window;
//   day0.first_head_request: the first request answered with a draft version > 0 (goal:
//     <= 300); day0.first_head_block_request: the first whose blocks the head drafted;
//   day0.last_over_plain: up's tokens/s over plain's on the last --last requests (goal: >= 1.3
//     at 1,000 requests), as the ratio of sums and the median of per-request ratios;
//     day0.plain_twin_over_plain: the same for the two identical plain arms (the noise);
//     day0.before_head_over_plain: up over plain on the plain-beside requests before the first
//     head (no draft yet: the up arm's own cost, and the two processes' difference), and
//     day0.last_over_plain_over_before_head: last_over_plain divided by it;
//   day0.heldout_mean_acceptance_length{draft, temperature}, day0.heldout_head_over_mix;
//   startup and wall seconds, failed requests, the trainer's published / refused versions,
//   steps, step seconds, evaluations and last estimated alpha (live and candidate).
// And OUT/requests.jsonl (one line per answered request and arm).
//
// Usage: day0_bench [--requests N] [--out DIR] [--target DIR] [--max-tokens N] [--last N]
//                   [--plain-every N] [--window N] [--eval-reps N] [--eval-prompts N]
//                   [--no-eval | --eval-only] [--up-arg FLAG ...] [--binary PATH]
//                   [--spec-bench PATH] [--shared DIR]
// --eval-only: only the held-out evaluation, of the head a finished run left in OUT/up-data.
// On this 2-core machine (target-wide-46m float32, shared with other work): `up` serves after
// 1-1.5 minutes (draft init's warm-up), then ~1.0-1.4 s per answered request of any arm; 1,000
// requests (1,290 answered with the plain arms) ~22-30 minutes, the evaluation ~5-10 more.
#include <signal.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
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

constexpr double kTemperatures[2] = {0.0, 0.8};
constexpr double kHeldOutFraction = 0.1;  // the trainer's default --heldout-fraction
// Valid-split windows: a prompt of at least kWindowChars characters (to the end of its line),
// then at least kGapChars (to the next line start) that no prompt contains: ~63 tokens of this
// tokenizer (2.85 characters a token on python), the continuation a 64-token request writes.
constexpr size_t kWindowChars = 200, kGapChars = 180;

struct Options {
  int requests = 1000, max_tokens = 64, last = 100, plain_every = 10, window = 100;
  int eval_reps = 2, eval_prompts = 8;
  bool eval = true, eval_only = false;
  std::string out = "day0-bench";
  std::string shared = testing::SharedDir();
  std::string target;  // default: SHARED/models/target-wide-46m
  std::string binary = SPECLOOP_BINARY;
  std::string spec_bench = SPECLOOP_SPEC_BENCH;
  std::vector<std::string> up_args;
};

struct Prompt {
  std::string text, source;
};

// One answered request of one arm.
struct Result {
  bool ok = false;
  std::string error;
  int tokens = 0, drafted = 0, accepted = 0, drafts = 0, steps = 0, suffix_steps = 0;
  uint64_t version = 0;
  double start_s = 0, first_token_s = 0, end_s = 0;  // since the traffic began
  double decode_tokens() const { return std::max(0, tokens - 1); }
  double decode_seconds() const { return end_s - first_token_s; }
  double tokens_per_second() const {
    return decode_seconds() > 0 ? decode_tokens() / decode_seconds() : NAN;
  }
};

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

[[noreturn]] void Die(const std::string& message) {
  std::cerr << "day0_bench: " << message << "\n";
  std::exit(1);
}

// The prompt pool (see the head comment): *eval gets the held-out python.jsonl prompts,
// *trace the rest, shuffled.
void BuildPrompts(const Options& o, std::vector<Prompt>* trace, std::vector<Prompt>* eval) {
  std::unique_ptr<Tokenizer> tokenizer;
  ModelConfig config;
  Status s = Tokenizer::Load(o.target, &tokenizer);
  if (s.ok()) s = ModelConfig::FromDir(o.target, &config);
  if (!s.ok()) Die(s.ToString());
  auto fits = [&](const std::string& text, bool* held_out) {
    std::vector<int> ids = tokenizer->Encode(text);  // as serve/completion_params.cc
    if (config.add_bos_token) ids.insert(ids.begin(), config.bos_token_id);
    *held_out = trainer::IsHeldOutPrompt(ids.data(), ids.size(), kHeldOutFraction);
    return static_cast<int64_t>(ids.size()) + o.max_tokens <= config.max_model_len;
  };
  {
    std::ifstream in(o.shared + "/prompts/python.jsonl");
    if (!in) Die("cannot read " + o.shared + "/prompts/python.jsonl");
    int line_no = 0;
    for (std::string line; std::getline(in, line);) {
      ++line_no;
      const std::string text = json::parse(line)["prompt"].get<std::string>();
      bool held_out = false;
      if (!fits(text, &held_out)) continue;
      (held_out ? eval : trace)
          ->push_back({text, "prompts/python.jsonl:" + std::to_string(line_no)});
    }
  }
  const std::string corpus = o.shared + "/corpus/python/valid.txt";
  std::ifstream in(corpus, std::ios::binary);
  if (!in) Die("cannot read " + corpus);
  std::stringstream buf;
  buf << in.rdbuf();
  const std::string all = buf.str();
  size_t doc_start = 0;
  while (doc_start < all.size()) {
    // Documents are separated by a line holding ASCII 0x1E.
    size_t doc_end = all.find("\n\x1e\n", doc_start);
    if (doc_end == std::string::npos) doc_end = all.size();
    size_t pos = doc_start;
    while (pos + kWindowChars + kGapChars <= doc_end) {
      size_t end = all.find('\n', pos + kWindowChars);
      if (end == std::string::npos || end > doc_end) break;
      end += 1;
      const std::string text = all.substr(pos, end - pos);
      bool held_out = false;
      if (fits(text, &held_out)) {
        trace->push_back({text, "corpus/python/valid.txt@" + std::to_string(pos)});
      }
      const size_t next = all.find('\n', end + kGapChars);
      if (next == std::string::npos || next >= doc_end) break;
      pos = next + 1;
    }
    doc_start = doc_end + 3;
  }
  std::mt19937_64 rng(20261127);
  std::shuffle(trace->begin(), trace->end(), rng);
  if (trace->empty() || eval->empty()) Die("no trace or no held-out prompt");
}

// One streamed completion to `port`.
Result Send(httplib::Client* cli, const Prompt& prompt, int index, double temperature,
            const Options& o, double t0) {
  const bench::StreamedCompletion c = bench::PostStreamedCompletion(
      cli,
      json{{"prompt", prompt.text}, {"max_tokens", o.max_tokens}, {"temperature", temperature},
           {"seed", index},         {"domain", "python"}},
      t0);
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
  out.drafts = s["drafts"].get<int>();
  out.steps = s["steps"].get<int>();
  out.suffix_steps = s["suffix"]["steps"].get<int>();
  out.version = s["draft_version"].get<uint64_t>();
  out.ok = true;
  return out;
}

// Decoding tokens/s and the draft's counts over a set of results.
struct Tally {
  int requests = 0;
  double decode_tokens = 0, decode_seconds = 0, accepted = 0, drafts = 0;
  uint64_t version = 0;
  void Add(const Result& r) {
    if (!r.ok) return;
    ++requests;
    decode_tokens += r.decode_tokens();
    decode_seconds += r.decode_seconds();
    accepted += r.accepted;
    drafts += r.drafts - r.suffix_steps;  // suffix blocks are off; counted out all the same
    version = std::max(version, r.version);
  }
  double tokens_per_second() const {
    return decode_seconds > 0 ? decode_tokens / decode_seconds : NAN;
  }
  double mean_acceptance_length() const { return drafts > 0 ? 1 + accepted / drafts : NAN; }
};

json Num(double v) { return std::isnan(v) ? json(nullptr) : json(v); }

std::ofstream* g_file = nullptr;
void Emit(const std::string& name, const json& params, double value, const std::string& unit) {
  const std::string line = json{{"name", "day0." + name}, {"params", params},
                                {"value", Num(value)}, {"unit", unit}}
                               .dump();
  std::cout << line << std::endl;
  if (g_file != nullptr) *g_file << line << "\n";
}

// Starts a child, waits for `ready` in its output, or exits with its output.
std::unique_ptr<e2e::Child> Start(const std::string& name, const std::vector<std::string>& argv,
                                  const std::string& ready, double seconds) {
  auto child = std::make_unique<e2e::Child>(argv, /*echo=*/false);
  if (child->WaitForLine(ready, seconds).empty()) {
    Die(name + " did not start:\n" + child->Output());
  }
  return child;
}

void Stop(const std::string& name, e2e::Child* child) {
  child->Signal(SIGINT);
  if (child->Wait(60) == -1) std::cerr << "day0_bench: " << name << " did not stop in 60 s\n";
}

// Runs spec_bench on the held-out prompts with `head` and draft-mix-1m at `temperature`;
// returns its JSON lines.
std::vector<json> RunSpecBench(const Options& o, const std::string& head, double temperature,
                               int prompts) {
  std::ostringstream t;
  t << temperature;
  e2e::Child bench({o.spec_bench, "--shared", o.shared, "--target", o.target, "--drafts",
                    head + "," + o.shared + "/models/draft-mix-1m", "--domains", "python",
                    "--prompts-dir", o.out + "/heldout", "--prompts", std::to_string(prompts),
                    "--tokens", std::to_string(o.max_tokens), "--reps",
                    std::to_string(o.eval_reps), "--temperature", t.str(), "--ks", "4",
                    "--threads", "1"},
                   /*echo=*/false);
  const int status = bench.Wait(3600);
  std::vector<json> lines;
  std::istringstream in(bench.Output());
  for (std::string line; std::getline(in, line);) {
    json j = json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.contains("name")) lines.push_back(std::move(j));
  }
  if (status != 0) std::cerr << "day0_bench: spec_bench failed:\n" << bench.Output();
  return lines;
}

// The value of spec_bench line `name` for `draft` (its --drafts entry) and `k`; NaN if absent.
double Find(const std::vector<json>& lines, const std::string& name, const std::string& draft,
            const json& k) {
  for (const json& j : lines) {
    const json& p = j["params"];
    if (j["name"] == name && p.value("draft", "") == draft && p.contains("k") && p["k"] == k &&
        j["value"].is_number()) {
      return j["value"].get<double>();
    }
  }
  return NAN;
}

void Evaluate(const Options& o, const std::string& data, int prompts) {
  std::ifstream latest_file(data + "/checkpoints/latest");
  std::string latest;
  std::getline(latest_file, latest);
  if (latest.empty()) {
    std::cerr << "day0_bench: no head was published (" << data
              << "/checkpoints/latest): nothing to evaluate\n";
    Emit("heldout_mean_acceptance_length", {{"draft", "head"}}, NAN, "tokens");
    return;
  }
  const std::string head = data + "/checkpoints/" + latest;
  const std::string mix = o.shared + "/models/draft-mix-1m";
  for (const double temperature : kTemperatures) {
    const std::vector<json> lines = RunSpecBench(o, head, temperature, prompts);
    double mal[2];
    for (int d = 0; d < 2; ++d) {
      const std::string draft = d == 0 ? head : mix;
      const json p = {{"draft", d == 0 ? "head " + latest : std::string("draft-mix-1m")},
                      {"temperature", temperature},
                      {"prompts", prompts},
                      {"held_out", true}};
      json pk = p;
      pk["k"] = 4;
      mal[d] = Find(lines, "mean_acceptance_length", draft, 4);
      Emit("heldout_mean_acceptance_length", pk, mal[d], "tokens");
      Emit("heldout_alpha", pk, Find(lines, "alpha", draft, 4), "ratio");
      Emit("heldout_speedup", pk, Find(lines, "speedup", draft, 4), "x plain");
      json pa = p;
      pa["k"] = "auto";
      Emit("heldout_speedup", pa, Find(lines, "speedup", draft, "auto"), "x plain");
      Emit("heldout_k_mean", pa, Find(lines, "k_mean", draft, "auto"), "tokens");
      for (const json& j : lines) {
        if (j["name"] == "draft_cost_ratio_c" && j["params"].value("draft", "") == draft) {
          Emit("heldout_draft_cost_c", p, j["value"].get<double>(), "x target step");
        }
      }
    }
    Emit("heldout_head_over_mix_mean_acceptance_length",
         {{"temperature", temperature}, {"k", 4}, {"goal", ">= 1"}}, mal[0] / mal[1], "ratio");
  }
}

int Main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) Die(a + " needs a value");
      return argv[++i];
    };
    const auto number = [&](int min) {
      const std::string v = value();
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != 0 || n < min) {
        Die(a + " takes an integer >= " + std::to_string(min) + ", not '" + v + "'");
      }
      return static_cast<int>(n);
    };
    if (a == "--requests") {
      o.requests = number(1);
    } else if (a == "--max-tokens") {
      o.max_tokens = number(2);
    } else if (a == "--last") {
      o.last = number(1);
    } else if (a == "--plain-every") {
      o.plain_every = number(0);
    } else if (a == "--window") {
      o.window = number(1);
    } else if (a == "--eval-reps") {
      o.eval_reps = number(1);
    } else if (a == "--eval-prompts") {
      o.eval_prompts = number(1);
    } else if (a == "--no-eval") {
      o.eval = false;
    } else if (a == "--eval-only") {
      o.eval_only = true;
    } else if (a == "--out") {
      o.out = value();
    } else if (a == "--target") {
      o.target = value();
    } else if (a == "--shared") {
      o.shared = value();
    } else if (a == "--binary") {
      o.binary = value();
    } else if (a == "--spec-bench") {
      o.spec_bench = value();
    } else if (a == "--up-arg") {
      o.up_args.push_back(value());
    } else {
      std::cerr << "usage: day0_bench [--requests N] [--out DIR] [--target DIR] "
                   "[--max-tokens N] [--last N] [--plain-every N] [--window N] [--eval-reps N] "
                   "[--eval-prompts N] [--no-eval | --eval-only] [--up-arg FLAG ...] [--binary PATH] "
                   "[--spec-bench PATH] [--shared DIR]\n";
      return 2;
    }
  }
  if (o.target.empty()) o.target = o.shared + "/models/target-wide-46m";
  o.last = std::min(o.last, o.requests);
  fs::create_directories(o.out + "/heldout");
  std::ofstream file(o.out + "/day0.jsonl");
  g_file = &file;

  std::vector<Prompt> pool, eval;
  BuildPrompts(o, &pool, &eval);
  const int eval_prompts = std::min<int>(o.eval_prompts, eval.size());
  {
    std::ofstream heldout(o.out + "/heldout/python.jsonl");
    for (const Prompt& p : eval) {
      heldout << json{{"domain", "python"}, {"source", p.source}, {"prompt", p.text}}.dump()
              << "\n";
    }
  }
  const std::string data = o.out + "/up-data";
  if (o.eval_only) {  // a finished run's head (OUT/up-data) evaluated again
    Evaluate(o, data, eval_prompts);
    return 0;
  }
  const int recurring = std::max(0, o.requests - static_cast<int>(pool.size()));
  Emit("prompt_pool", {{"trace", pool.size()}, {"held_out_eval", eval.size()}},
       static_cast<double>(pool.size()), "prompts");
  Emit("recurring_requests", {{"requests", o.requests}}, recurring, "requests");
  if (recurring > 0) {
    std::cerr << "day0_bench: " << o.requests << " requests from " << pool.size()
              << " prompts: the last " << recurring << " repeat earlier prompts\n";
  }

  fs::remove_all(data);
  const int port = e2e::FreePort(), metrics_port = e2e::FreePort();
  const int plain_port = e2e::FreePort(), twin_port = e2e::FreePort();
  std::vector<std::string> up_argv = {o.binary, "up", "--target", o.target, "--data", data,
                                      "--port", std::to_string(port), "--trainer-metrics-port",
                                      std::to_string(metrics_port), "--serve-arg=--no-suffix"};
  up_argv.insert(up_argv.end(), o.up_args.begin(), o.up_args.end());
  const double launch = Now();
  // Without --draft, `up` first initializes a head (specloop draft init), then serves.
  auto up = Start("specloop up", up_argv, "specloop up: serve is ready", 900);
  const double startup = Now() - launch;
  auto plain_server = [&](int p) {
    return Start("specloop serve (plain)",
                 {o.binary, "serve", "--target", o.target, "--port", std::to_string(p), "--k", "0",
                  "--no-suffix", "--no-log", "--threads", "1"},
                 "specloop serve: listening on", 300);
  };
  auto plain = plain_server(plain_port), twin = plain_server(twin_port);
  Emit("startup_seconds", {{"arm", "up"}}, startup, "s");
  std::cerr << "day0_bench: up serving after " << static_cast<int>(startup) << " s; "
            << o.requests << " requests\n";

  // The trainer's publications as they happen (seconds since the traffic began).
  std::atomic<bool> done{false};
  std::mutex mu;
  std::vector<std::pair<double, double>> published;  // (t, published total)
  const double t0 = Now();
  std::thread poller([&] {
    double last = 0;
    while (!done.load()) {
      std::string body;
      if (e2e::HttpGet(metrics_port, "/metrics", &body) == 200) {
        const double n = e2e::MetricValue(body, "specloop_train_checkpoints_published_total");
        if (n > last) {
          std::lock_guard<std::mutex> lock(mu);
          published.emplace_back(Now() - t0, n);
          last = n;
        }
      }
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  });

  enum { kUp, kPlain, kTwin, kArms };
  const char* kArmNames[kArms] = {"up", "plain", "plain-twin"};
  std::vector<std::array<Result, kArms>> results(o.requests);
  std::vector<std::array<bool, kArms>> sent(o.requests, {false, false, false});
  httplib::Client up_cli("127.0.0.1", port), plain_cli("127.0.0.1", plain_port),
      twin_cli("127.0.0.1", twin_port);
  twin_cli.set_read_timeout(300);
  up_cli.set_read_timeout(300);
  plain_cli.set_read_timeout(300);
  std::ofstream per_request(o.out + "/requests.jsonl");
  const int last_from = o.requests - o.last;
  for (int i = 0; i < o.requests; ++i) {
    const Prompt& prompt = pool[i % pool.size()];
    const double temperature = kTemperatures[i % 2];
    std::vector<int> arms = {kUp};
    if (i >= last_from) {
      arms = {kUp, kPlain, kTwin};
    } else if (o.plain_every > 0 && i % o.plain_every == 0) {
      arms = {kUp, kPlain};
    }
    std::rotate(arms.begin(), arms.begin() + (i / 2) % arms.size(), arms.end());
    for (int arm : arms) {
      httplib::Client* cli = arm == kUp ? &up_cli : arm == kPlain ? &plain_cli : &twin_cli;
      Result r = Send(cli, prompt, i, temperature, o, t0);
      sent[i][arm] = true;
      per_request << json{{"index", i},           {"arm", kArmNames[arm]},
                          {"source", prompt.source}, {"temperature", temperature},
                          {"ok", r.ok},           {"error", r.error},
                          {"tokens", r.tokens},   {"tokens_per_second", Num(r.tokens_per_second())},
                          {"draft_version", r.version}, {"drafted", r.drafted},
                          {"accepted", r.accepted}, {"drafts", r.drafts},
                          {"steps", r.steps},     {"suffix_steps", r.suffix_steps},
                          {"start_s", r.start_s}, {"first_token_s", r.first_token_s},
                          {"end_s", r.end_s}}
                         .dump()
                  << "\n";
      results[i][arm] = std::move(r);
    }
    if ((i + 1) % 50 == 0) {
      std::cerr << "day0_bench: " << i + 1 << " requests, " << static_cast<int>(Now() - t0)
                << " s, draft version " << results[i][kUp].version << "\n";
    }
  }
  const double wall = Now() - t0;
  done = true;
  poller.join();
  std::string trainer_metrics;
  e2e::HttpGet(metrics_port, "/metrics", &trainer_metrics);
  Stop("specloop serve (plain)", plain.get());
  Stop("specloop serve (plain twin)", twin.get());
  Stop("specloop up", up.get());
  for (const char* l : {"specloop train: published", "not published", "restart", "rollback"}) {
    for (size_t from = 0;;) {
      const std::string line = up->WaitForLine(l, 0, &from);
      if (line.empty()) break;
      std::cerr << "  [up] " << line << "\n";
    }
  }

  // Windows of up's requests; over plain on the plain-beside requests of the window.
  for (int from = 0; from < o.requests; from += o.window) {
    const int to = std::min(o.requests, from + o.window);
    Tally all, up_beside, plain_beside;
    for (int i = from; i < to; ++i) {
      all.Add(results[i][kUp]);
      if (sent[i][kPlain] && results[i][kPlain].ok && results[i][kUp].ok) {
        up_beside.Add(results[i][kUp]);
        plain_beside.Add(results[i][kPlain]);
      }
    }
    const json p = {{"from", from}, {"to", to}, {"plain_beside", plain_beside.requests}};
    Emit("window_tokens_per_second", p, all.tokens_per_second(), "tokens/s");
    Emit("window_mean_acceptance_length", p, all.mean_acceptance_length(), "tokens");
    Emit("window_draft_version", p, static_cast<double>(all.version), "version");
    Emit("window_over_plain", p, up_beside.tokens_per_second() / plain_beside.tokens_per_second(),
         "x plain");
  }
  int first_version = -1, first_block = -1, failed = 0;
  double before_head = NAN;
  for (int i = 0; i < o.requests; ++i) {
    for (int arm = 0; arm < kArms; ++arm) failed += sent[i][arm] && !results[i][arm].ok;
    const Result& r = results[i][kUp];
    if (first_version < 0 && r.ok && r.version > 0) first_version = i;
    if (first_block < 0 && r.ok && r.drafts - r.suffix_steps > 0) first_block = i;
  }
  // Before the first head: up (no draft yet) over plain on the plain-beside requests: what the
  // up arm's server costs before any draft (and this pair of processes' own difference).
  {
    Tally up_before, plain_before;
    const int until = first_version < 0 ? last_from : std::min(first_version, last_from);
    for (int i = 0; i < until; ++i) {
      if (sent[i][kPlain] && results[i][kPlain].ok && results[i][kUp].ok) {
        up_before.Add(results[i][kUp]);
        plain_before.Add(results[i][kPlain]);
      }
    }
    before_head = up_before.tokens_per_second() / plain_before.tokens_per_second();
    Emit("before_head_over_plain", {{"requests", up_before.requests}}, before_head, "x plain");
  }
  Emit("first_head_request", {{"goal", "<= 300"}}, first_version < 0 ? NAN : first_version,
       "request index");
  Emit("first_head_block_request", json::object(), first_block < 0 ? NAN : first_block, "request index");
  {
    std::lock_guard<std::mutex> lock(mu);
    Emit("first_publish_seconds", json::object(), published.empty() ? NAN : published.front().first, "s");
  }
  // The last requests: up against plain, and the twin against plain (the noise).
  Tally up_last, plain_last, twin_last;
  std::vector<double> ratio, twin_ratio;
  for (int i = last_from; i < o.requests; ++i) {
    const auto& r = results[i];
    if (!r[kUp].ok || !r[kPlain].ok || !r[kTwin].ok) continue;
    up_last.Add(r[kUp]);
    plain_last.Add(r[kPlain]);
    twin_last.Add(r[kTwin]);
    ratio.push_back(r[kUp].tokens_per_second() / r[kPlain].tokens_per_second());
    twin_ratio.push_back(r[kTwin].tokens_per_second() / r[kPlain].tokens_per_second());
  }
  auto median = [](std::vector<double> v) -> double {
    if (v.empty()) return NAN;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const json lp = {{"last", o.last}, {"requests", o.requests}, {"paired", up_last.requests}};
  Emit("last_tokens_per_second", {{"arm", "up"}, {"last", o.last}}, up_last.tokens_per_second(),
       "tokens/s");
  Emit("last_tokens_per_second", {{"arm", "plain"}, {"last", o.last}},
       plain_last.tokens_per_second(), "tokens/s");
  json g = lp;
  g["goal"] = ">= 1.3 (1000 requests)";
  Emit("last_over_plain", g, up_last.tokens_per_second() / plain_last.tokens_per_second(),
       "x plain");
  Emit("last_over_plain_median_per_request", lp, median(ratio), "x plain");
  // The same over up's own ratio before any head: a constant difference between the two
  // server processes divides out (one was seen to run 0.85-1.27x the other with no draft).
  Emit("last_over_plain_over_before_head", lp,
       up_last.tokens_per_second() / plain_last.tokens_per_second() / before_head, "ratio");
  Emit("plain_twin_over_plain", lp, twin_last.tokens_per_second() / plain_last.tokens_per_second(),
       "ratio");
  Emit("plain_twin_over_plain_median_per_request", lp, median(twin_ratio), "ratio");
  Emit("last_mean_acceptance_length", {{"last", o.last}}, up_last.mean_acceptance_length(),
       "tokens");
  Emit("versions_published", json::object(),
       e2e::MetricValue(trainer_metrics, "specloop_train_checkpoints_published_total"),
       "versions");
  Emit("versions_refused", json::object(),
       e2e::MetricValue(trainer_metrics, "specloop_train_checkpoints_rejected_total"),
       "versions");
  // Where the trainer stood at the end: its steps, their CPU time, evaluations, and the last
  // estimated alpha of the live head and of the candidate.
  Emit("trainer_steps", json::object(),
       e2e::MetricValue(trainer_metrics, "specloop_train_steps_total"), "steps");
  Emit("trainer_step_seconds", json::object(),
       e2e::MetricValue(trainer_metrics, "specloop_train_step_duration_seconds_sum"), "s");
  Emit("trainer_evaluations", json::object(),
       e2e::MetricValue(trainer_metrics, "specloop_train_evaluations_total"), "evaluations");
  for (const char* model : {"live", "candidate"}) {
    Emit("trainer_estimated_alpha", {{"model", model}},
         e2e::MetricValue(trainer_metrics, "specloop_train_estimated_alpha",
                          "domain=\"all\",model=\"" + std::string(model) + "\""),
         "ratio");
  }
  Emit("failed_requests", json::object(), failed, "requests");
  Emit("wall_seconds", {{"requests", o.requests}}, wall, "s");
  if (o.eval) {
    const double t = Now();
    Evaluate(o, data, eval_prompts);
    Emit("eval_seconds", json::object(), Now() - t, "s");
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace specloop

int main(int argc, char** argv) { return specloop::Main(argc, argv); }
