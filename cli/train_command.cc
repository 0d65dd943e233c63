// `specloop train`: the trainer process (DESIGN.md sections 1, 6-8).
//
//   specloop train --draft DIR --buffer DIR [--buffer DIR ...] --checkpoints DIR [options]
//       DIR is a draft model or an EAGLE-3 head (its config.json tells); a head also needs
//       --target DIR, which the trainer runs for the head's features (trainer/trainer.h).
//       long-running: catch up with the buffers, train, evaluate, gate, checkpoint, announce
//       over ZeroMQ (--pub / --router), serve /metrics and /status.json (the trainer's state:
//       trainer::TrainerState) on --metrics-port (0 disables).
//   specloop train ... --offline [--epochs N] [--force]
//       retrain from the logged buffers with no workers; progress on stderr; the last stdout
//       line is one JSON object: {"version": N or null, "alpha_before": {domain: alpha},
//       "alpha_after": {...}, "overall_before", "overall_after", "positions": {domain: n},
//       "regimes": {"greedy": {"alpha_before", "alpha_after", "positions"}, "sampled": {...}},
//       "gate": {"publish", "reason", "detail"}, "objective", "steps", "records_skipped":
//       {reason: n} (damaged records stepped over: ReplayReader::records_skipped)}. Every
//       alpha is held-out alpha-hat, each record scored under its own sampling
//       (trainer/alpha_estimate.h);
//       "regimes" splits it by the records' sampling regime (greedy: temperature 0; sampled:
//       the rest), both always present (alphas null without positions). Exit 0 when a
//       checkpoint was written, 3 when the gate refused it (no checkpoint; --force writes one
//       regardless), 1 on errors, 2 on bad arguments.
#include <httplib.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <nlohmann/json.hpp>
#include <thread>
#include <zmq.hpp>

#include "common/channel/draft_channel.h"
#include "common/model/eagle3_config.h"
#include "common/model/threads.h"
#include "common/observe/process_metrics.h"
#include "common/model/eagle3_head.h"
#include "trainer/head_warmup.h"
#include "cli/train_command.h"
#include "trainer/trainer.h"

namespace specloop {

namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }

struct TrainArgs {
  trainer::TrainerOptions t;
  std::string objective = "jsd:0.5";
  bool offline = false, force = false;
  bool init_head = false;  // grow a head into --draft from --target when it holds none
  int epochs = 1, threads = 1;
  std::string pub = "tcp://127.0.0.1:5557", router = "tcp://127.0.0.1:5558";
  std::string curve_secret_file;
  std::string metrics_host = "127.0.0.1";
  int metrics_port = 9091;
};

const char* const kRegimes[] = {"greedy", "sampled"};

// Held-out alpha of one sampling regime, before and after: null alphas without positions.
nlohmann::json RegimeReport(const trainer::EvalResult& r, const std::string& regime) {
  auto alpha = [&](const trainer::AlphaEstimate& e) {
    auto it = e.regimes.find(regime);
    return it != e.regimes.end() && it->second.positions > 0 ? nlohmann::json(it->second.logged)
                                                             : nlohmann::json(nullptr);
  };
  auto it = r.candidate.regimes.find(regime);
  return {{"alpha_before", alpha(r.live)},
          {"alpha_after", alpha(r.candidate)},
          {"positions", it != r.candidate.regimes.end() ? it->second.positions : 0}};
}

nlohmann::json OfflineReport(const TrainArgs& a, const trainer::Trainer& t,
                             const trainer::EvalResult& r) {
  nlohmann::json positions = nlohmann::json::object();
  for (const auto& [d, x] : r.candidate.domains) positions[d] = x.positions;
  nlohmann::json regimes = nlohmann::json::object();
  for (const char* g : kRegimes) regimes[g] = RegimeReport(r, g);
  return {{"version", r.version ? nlohmann::json(r.version) : nlohmann::json(nullptr)},
          {"alpha_before", r.live.LoggedByDomain()},
          {"alpha_after", r.candidate.LoggedByDomain()},
          {"overall_before", r.live.overall.logged},
          {"overall_after", r.candidate.overall.logged},
          {"positions", positions},
          {"regimes", regimes},
          {"gate",
           {{"publish", r.decision.publish},
            {"reason", r.decision.reason},
            {"detail", r.decision.detail}}},
          {"objective", a.t.objective.ToString()},
          {"draft_kind", t.state().draft_kind},
          {"steps", t.steps()},
          {"records_skipped", t.records_skipped()}};
}

int RunOffline(const TrainArgs& a) {
  std::unique_ptr<trainer::Trainer> t;
  Status s = trainer::Trainer::Open(a.t, nullptr, &t);
  if (!s.ok()) {
    std::cerr << "specloop train: " << s.ToString() << "\n";
    return 1;
  }
  const bool tty = isatty(STDERR_FILENO);
  int64_t last_shown = -1;
  auto progress = [&](const trainer::OfflineProgress& p) {
    const int64_t pct = p.steps ? 100 * p.step / p.steps : 100;
    if (!tty && pct / 10 == last_shown / 10 && p.step != p.steps) return;
    last_shown = pct;
    const int width = 30, filled = static_cast<int>(width * pct / 100);
    char line[160];
    std::snprintf(line, sizeof(line), "epoch %d/%d  step %lld/%lld  [%s%s] %3lld%%  loss %.4f",
                  p.epoch, p.epochs, static_cast<long long>(p.step),
                  static_cast<long long>(p.steps), std::string(filled, '#').c_str(),
                  std::string(width - filled, ' ').c_str(), static_cast<long long>(pct), p.loss);
    std::cerr << (tty ? "\r" : "") << line << (tty ? "" : "\n") << std::flush;
  };
  std::cerr << "specloop train: offline, " << a.epochs << " epoch(s), " << t->heldout_size()
            << " held-out records\n";
  trainer::EvalResult r;
  s = t->RunOffline(a.epochs, a.force, progress, &r);
  if (tty) std::cerr << "\n";
  if (!s.ok()) {
    std::cerr << "specloop train: " << s.ToString() << "\n";
    return 1;
  }
  for (const auto& [reason, n] : t->records_skipped()) {
    if (n > 0) {
      std::fprintf(stderr, "  skipped %llu damaged records (%s; `specloop buffer verify`)\n",
                   static_cast<unsigned long long>(n), reason.c_str());
    }
  }
  for (const auto& [d, x] : r.candidate.domains) {
    std::fprintf(stderr, "  %-10s alpha %.4f -> %.4f  (%lld positions)\n", d.c_str(),
                 r.live.domains[d].logged, x.logged, static_cast<long long>(x.positions));
  }
  for (const char* g : kRegimes) {
    auto it = r.candidate.regimes.find(g);
    if (it == r.candidate.regimes.end()) continue;
    std::fprintf(stderr, "  %-10s alpha %.4f -> %.4f  (%lld positions; sampling regime)\n", g,
                 r.live.regimes[g].logged, it->second.logged,
                 static_cast<long long>(it->second.positions));
  }
  std::cout << OfflineReport(a, *t, r).dump() << std::endl;
  return r.version ? 0 : 3;
}

nlohmann::json Number(double v) { return std::isnan(v) ? nlohmann::json() : nlohmann::json(v); }

// GET /status.json: the trainer's state (trainer::TrainerState), read by the server's status page.
nlohmann::json StateJson(const trainer::TrainerState& st) {
  nlohmann::json j = {{"objective", st.objective},       {"draft_kind", st.draft_kind},
                      {"activity", st.activity},
                      {"steps", st.steps},               {"loss", Number(st.loss)},
                      {"live_version", st.live_version}, {"evaluations", st.evaluations}};
  if (st.evaluations > 0) {
    j["last_evaluation"] = {{"time", st.evaluated_unix},
                            {"step", st.evaluated_step},
                            {"published", st.published},
                            {"reason", st.reason},
                            {"detail", st.detail},
                            {"live_alpha", Number(st.live_alpha)},
                            {"candidate_alpha", Number(st.candidate_alpha)},
                            {"version", st.published_version}};
  }
  return j;
}

int RunOnline(const TrainArgs& a) {
  metrics::Registry registry;
  std::unique_ptr<trainer::Trainer> t;
  Status s = AddProcessMetrics(&registry);
  if (s.ok()) s = trainer::Trainer::Open(a.t, &registry, &t);
  if (!s.ok()) {
    std::cerr << "specloop train: " << s.ToString() << "\n";
    return 1;
  }
  PublisherOptions po;
  po.pub_endpoint = a.pub;
  po.router_endpoint = a.router;
  if (!a.curve_secret_file.empty()) {
    s = ReadFileToString(a.curve_secret_file, &po.curve_secret_key);
    while (!po.curve_secret_key.empty() && std::isspace(po.curve_secret_key.back())) {
      po.curve_secret_key.pop_back();
    }
    if (!s.ok() || po.curve_secret_key.size() != 40) {
      std::cerr << "specloop train: --curve-secret-key-file: need a 40-character Z85 key\n";
      return 2;
    }
  }
  zmq::context_t ctx;
  std::unique_ptr<DraftPublisher> publisher;
  s = DraftPublisher::Start(&ctx, po, a.t.checkpoint_dir, &publisher);
  if (s.ok() && t->live_version() > 0) s = publisher->Publish(t->live_version());
  if (!s.ok()) {
    std::cerr << "specloop train: " << s.ToString() << "\n";
    return 1;
  }
  httplib::Server http;
  std::thread http_thread;
  if (a.metrics_port > 0) {
    http.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
      res.set_content(registry.Serialize(), "text/plain; version=0.0.4; charset=utf-8");
    });
    http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("{\"status\":\"ok\"}", "application/json");
    });
    http.Get("/status.json", [&](const httplib::Request&, httplib::Response& res) {
      res.set_content(StateJson(t->state()).dump(), "application/json");
    });
    if (!http.bind_to_port(a.metrics_host.c_str(), a.metrics_port)) {
      std::cerr << "specloop train: cannot bind " << a.metrics_host << ":" << a.metrics_port << "\n";
      return 1;
    }
    http_thread = std::thread([&] { http.listen_after_bind(); });
  }
  std::cerr << "specloop train: live draft v" << t->live_version() << ", announcing on "
            << publisher->pub_endpoint() << ", serving on " << publisher->router_endpoint()
            << (a.metrics_port > 0 ? ", metrics on http://" + a.metrics_host + ":" +
                                         std::to_string(a.metrics_port) + "/metrics"
                                   : std::string())
            << "\n";
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  s = t->RunOnline(g_stop, publisher.get());
  if (http_thread.joinable()) {
    http.stop();
    http_thread.join();
  }
  publisher->Stop();
  if (!s.ok()) {
    std::cerr << "specloop train: " << s.ToString() << "\n";
    return 1;
  }
  return 0;
}

// --init-head: an EAGLE-3 head grown from the target into `out`, as `specloop draft init` does
// with its defaults (the target's layers and vocabulary, then the warm-up on text the target
// samples), so that `specloop up` without --draft serves while its trainer does this.
Status GrowHead(const std::string& target_dir, const std::string& out) {
  std::unique_ptr<LlamaModel> target;
  SPECLOOP_RETURN_IF_ERROR(LlamaModel::Load(target_dir, LoadOptions(), &target));
  std::unique_ptr<Eagle3Head> head;
  SPECLOOP_RETURN_IF_ERROR(Eagle3Head::InitFromTarget(*target, {}, &head));
  trainer::HeadWarmupOptions warmup;
  warmup.tokens = trainer::kDefaultWarmupTokens;
  trainer::HeadWarmupReport report;
  SPECLOOP_RETURN_IF_ERROR(trainer::WarmUpHead(*target, head.get(), warmup, &report));
  SPECLOOP_RETURN_IF_ERROR(head->Save(out, "float32"));
  std::printf("specloop train: grew an EAGLE-3 head from %s into %s (warm-up: %lld tokens, "
              "%.1f s)\n",
              target_dir.c_str(), out.c_str(), static_cast<long long>(report.tokens),
              report.sample_seconds + report.train_seconds);
  std::fflush(stdout);
  return Status::OK();
}

// --below-best-blends: "none" (no blends) or comma-separated lambdas, each in (0, 1). False on
// anything else (*out then unspecified).
bool ParseBlends(const std::string& text, std::vector<double>* out) {
  out->clear();
  if (text == "none") return true;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    char* end = nullptr;
    const double x = std::strtod(item.c_str(), &end);
    if (item.empty() || end != item.c_str() + item.size() || !(x > 0 && x < 1)) return false;
    out->push_back(x);
  }
  return !out->empty();
}

}  // namespace

void AddTrainCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("train", "distil the draft toward the target on replay buffers");
  auto a = std::make_shared<TrainArgs>();
  trainer::TrainerOptions& t = a->t;
  cmd->add_option("--draft", t.draft_dir,
                  "initial draft directory: a draft model or an EAGLE-3 head")->required();
  cmd->add_option("--target", t.target_dir,
                  "target model directory (required for an EAGLE-3 head: the trainer computes "
                  "its features; unused for a draft model)");
  cmd->add_flag("--init-head", a->init_head,
               "when --draft holds no draft yet, grow an EAGLE-3 head from --target into it "
               "first (specloop draft init's defaults)");
  cmd->add_option("--initial-draft-served", t.initial_draft_served,
                  "whether workers serve --draft until the first checkpoint; false: the first "
                  "candidate must beat plain decoding (expected speedup from its alpha)")
      ->capture_default_str();
  cmd->add_option("--unroll-steps", t.unroll_steps,
                  "EAGLE-3 heads: training-time-test steps")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  cmd->add_option("--step-decay", t.step_decay,
                  "EAGLE-3 heads: loss weight of unrolled step j is decay^j, decay in (0, 1]")
      ->check(CLI::Range(1e-6, 1.0))
      ->capture_default_str();
  cmd->add_option("--buffer", t.buffer_dirs, "replay buffer directory (repeatable)")->required();
  cmd->add_option("--checkpoints", t.checkpoint_dir, "checkpoint directory")->required();
  cmd->add_option("--objective", a->objective, "fkl, rkl, tvd, jsd or jsd:<beta>")
      ->capture_default_str();
  cmd->add_flag("--offline", a->offline, "retrain from the buffers once, with no workers");
  cmd->add_option("--epochs", a->epochs, "offline: passes over the buffers")->capture_default_str();
  cmd->add_flag("--force", a->force, "offline: write the checkpoint even if the gate refuses it");
  cmd->add_option("--lr", t.adamw.lr, "AdamW learning rate")->capture_default_str();
  cmd->add_option("--weight-decay", t.adamw.weight_decay, "AdamW weight decay")
      ->capture_default_str();
  cmd->add_option("--max-grad-norm", t.adamw.max_grad_norm, "gradient clipping")
      ->capture_default_str();
  cmd->add_option("--batch-records", t.batch_records, "records per step")->capture_default_str();
  cmd->add_option("--context-grad", t.context_gradient,
                  "backpropagate into each record's prompt too (costs 1.5x; false: prompt forward only)")
      ->capture_default_str();
  cmd->add_option("--max-replay", t.max_replay,
                  "online: most samples trained per training record (then wait for traffic)")
      ->capture_default_str();
  cmd->add_option("--eval-every", t.eval_every_steps,
                  "steps between evaluations; 0: adaptive (after 25 steps following a publish or "
                  "a traffic shift, doubling after each refusal up to 200, at most 25% of the time)")
      ->capture_default_str();
  cmd->add_option("--catch-up-interval-ms", t.catch_up_interval_ms,
                  "online: period of reading new buffer records, milliseconds")
      ->check(CLI::Range(uint32_t{10}, uint32_t{600000}))
      ->capture_default_str();
  cmd->add_option("--heldout-fraction", t.heldout_fraction, "records held out for evaluation")
      ->capture_default_str();
  cmd->add_option("--max-heldout-per-domain", t.max_heldout_per_domain,
                  "newest held-out records kept per domain (bounds evaluation time and memory)")
      ->capture_default_str();
  cmd->add_option("--replay-floor-records", t.replay_floor_records,
                  "online: records of each seen domain in every batch (at most half the batch; "
                  "0: none)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--heldout-floor-per-domain", t.heldout_floor_per_domain,
                  "held-out records per domain kept for evaluation after retention removed them")
      ->capture_default_str();
  cmd->add_option("--traffic-half-life", t.traffic_half_life_seconds,
                  "age half-life of the domain mix (follows traffic shifts), seconds")
      ->capture_default_str();
  cmd->add_option("--half-life", t.half_life_seconds, "recency half-life of sampling, seconds")
      ->capture_default_str();
  cmd->add_option("--min-gain", t.gate.min_gain, "gate: least overall alpha gain")
      ->capture_default_str();
  cmd->add_option("--max-domain-regression", t.gate.max_domain_regression,
                  "gate: most a domain's alpha may fall")
      ->capture_default_str();
  cmd->add_option("--max-regression-per-gain", t.gate.max_regression_per_gain,
                  "gate: or this fraction of the overall gain, when larger")
      ->capture_default_str();
  cmd->add_option("--max-fall-below-best", t.gate.max_fall_below_best,
                  "gate: most a domain's alpha may lie below the best draft served there "
                  "(same held-out records), whatever the gain; < 0: no such rule")
      ->check(CLI::Range(-1.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--below-best-floor-boost", t.below_best_floor_boost,
                  "online: replay floor multiplier of a domain the gate refused a candidate "
                  "for (below its best); 1: none")
      ->check(CLI::Range(1.0, 1e6))
      ->capture_default_str();
  cmd->add_option_function<std::string>(
         "--below-best-blends",
         [&t](const std::string& text) { ParseBlends(text, &t.below_best_blends); },
         "lambdas, in order, of blends live + lambda * (candidate - live) tried when the gate "
         "refused a candidate for below_best alone; the first it accepts is published "
         "(comma-separated, each in (0, 1); none: no blends)")
      ->check([](const std::string& text) {
        std::vector<double> v;
        return ParseBlends(text, &v) ? std::string()
                                     : "expected none or comma-separated numbers in (0, 1), got " +
                                           text;
      })
      ->default_str("0.5,0.25");
  cmd->add_option("--first-draft-cost", t.gate.draft_cost,
                  "gate, first draft vs plain decoding: a drafted token's cost, fraction of a "
                  "target step; < 0: by kind (0.26 for an EAGLE-3 head, 0.01 for a draft model: "
                  "target-wide-46m's)")
      ->capture_default_str();
  cmd->add_option("--first-verify-cost", t.gate.verify_cost,
                  "gate, first draft vs plain decoding: each verified token's extra cost, "
                  "fraction of a target step")
      ->capture_default_str();
  cmd->add_option("--first-min-speedup", t.gate.min_speedup,
                  "gate, first draft vs plain decoding: least expected speedup")
      ->capture_default_str();
  cmd->add_option("--keep-last", t.keep_last, "checkpoints kept")->capture_default_str();
  cmd->add_option("--seed", t.seed, "sampling seed")->capture_default_str();
  cmd->add_option("--device", t.device, "cpu or cuda")->capture_default_str();
  cmd->add_option("--threads", a->threads, "compute threads")->capture_default_str();
  cmd->add_option("--pub", a->pub, "ZeroMQ PUB endpoint (announcements)")->capture_default_str();
  cmd->add_option("--router", a->router, "ZeroMQ ROUTER endpoint (checkpoint transfer)")
      ->capture_default_str();
  cmd->add_option("--curve-secret-key-file", a->curve_secret_file,
                  "file holding the trainer's CURVE secret key (Z85); enables CURVE");
  cmd->add_option("--metrics-host", a->metrics_host, "address of /metrics")->capture_default_str();
  cmd->add_option("--metrics-port", a->metrics_port, "port of /metrics; 0 disables")
      ->capture_default_str();
  cmd->callback([a, exit_code] {
    Status s = trainer::ObjectiveSpec::Parse(a->objective, &a->t.objective);
    if (!s.ok() || a->epochs < 1 || a->t.batch_records < 1) {
      std::cerr << "specloop train: " << (s.ok() ? "--epochs and --batch-records must be >= 1"
                                                 : s.ToString())
                << "\n";
      *exit_code = 2;
      return;
    }
    if (a->init_head && !std::filesystem::exists(a->t.draft_dir + "/config.json")) {
      if (a->t.target_dir.empty()) {
        std::cerr << "specloop train: --init-head needs --target\n";
        *exit_code = 2;
        return;
      }
      SetComputeThreads(a->threads);
      Status g = GrowHead(a->t.target_dir, a->t.draft_dir);
      if (!g.ok()) {
        std::cerr << "specloop train: --init-head: " << g.ToString() << "\n";
        *exit_code = 1;
        return;
      }
    }
    if (a->t.target_dir.empty() && IsEagle3Dir(a->t.draft_dir)) {
      std::cerr << "specloop train: --draft " << a->t.draft_dir
                << " is an EAGLE-3 head: --target DIR is required\n";
      *exit_code = 2;
      return;
    }
    SetComputeThreads(a->threads);
    *exit_code = a->offline ? RunOffline(*a) : RunOnline(*a);
  });
}

}  // namespace specloop
