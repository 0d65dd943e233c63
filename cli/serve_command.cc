// `specloop serve`: the serving process (DESIGN.md section 1): loads the target and draft,
// opens the replay buffer, starts the scheduler and the HTTP server, and stops cleanly on
// SIGINT/SIGTERM.
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <iostream>
#include <thread>

#include <zmq.hpp>

#include "buffer/replay_logger.h"
#include "common/chat/chat_template.h"
#include "common/tokenizer/generation_config.h"
#include "common/model/threads.h"
#include "cli/commands.h"
#include "serve/draft_swapper.h"
#include "serve/http_server.h"
#include "serve/sample_logger.h"
#include "fleet/signal_watcher.h"
#include "serve/scheduler.h"
#include "serve/spec_decode_metrics.h"
#include "serve/serving_metrics.h"

namespace specloop {

namespace {

struct ServeArgs {
  std::string target, draft, host = "127.0.0.1", buffer, trainer_endpoint, k = "auto";
  std::string trainer_router, trainer_public_key, draft_staging, trainer_status;
  std::string device = "cpu", dtype = "auto", model_name, chat_template;
  std::string generation_config = "auto";
  bool no_cuda_graphs = false;
  int port = 8000, max_batch = 16, threads = 0, http_threads = 96, log_top_k = 64;
  int max_waiting = 64, max_domains = 16, k_max = 8;
  uint64_t buffer_max_mb = 4096;
  // Security limits (HttpServerOptions); 0 for the two token limits means the context.
  std::string api_key;
  size_t max_body_bytes = 1 << 20;
  int max_prompt_tokens = 0, max_tokens = 0;
  int read_timeout = 10, write_timeout = 10, keep_alive_timeout = 5, keep_alive_max = 100;
  uint64_t draft_chunk_bytes = 1u << 20;
  uint32_t worker_id = 0;
  CLI::Option* worker_id_option = nullptr;  // set: metrics carry worker="<id>"
  bool no_log = false;
  bool no_suffix = false;
  bool prompt_lookup = false;
  std::string draft_mode = "chain", tree = "2,2,1,1";
  double kv_cache_mb = 0;
  int max_model_len = 0;
  bool no_prefix_caching = false;
  std::string per_request_spec_metrics = "none";  // none, summary or detailed
};

// tcp://HOST:PORT -> tcp://HOST:PORT+1 (the trainer's ROUTER beside its PUB by default).
std::string NextPort(const std::string& endpoint) {
  const size_t colon = endpoint.find_last_of(':');
  if (colon == std::string::npos) return endpoint;
  return endpoint.substr(0, colon + 1) + std::to_string(std::atoi(endpoint.c_str() + colon + 1) + 1);
}

std::string BaseName(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const size_t slash = dir.find_last_of('/');
  return slash == std::string::npos ? dir : dir.substr(slash + 1);
}

// "<dir name>-<FNV-1a of config.json, 8 hex>": names the target in records and fingerprints.
std::string TargetId(const std::string& dir) {
  std::string text;
  uint32_t h = 2166136261u;
  if (ReadFileToString(dir + "/config.json", &text).ok()) {
    for (unsigned char c : text) h = (h ^ c) * 16777619u;
  }
  char hex[16];
  std::snprintf(hex, sizeof(hex), "%08x", h);
  return BaseName(dir) + "-" + hex;
}

int RunServe(const ServeArgs& a) {
  int k = -1;
  if (a.k != "auto") {
    try {
      k = std::stoi(a.k);
    } catch (const std::exception&) {
      k = -2;
    }
    if (k < 0) {
      std::cerr << "specloop serve: --k takes auto or a number >= 0\n";
      return 2;
    }
  }
  SpecMetricsLevel spec_metrics = SpecMetricsLevel::kNone;
  if (!ParseSpecMetricsLevel(a.per_request_spec_metrics, &spec_metrics)) {
    std::cerr << "specloop serve: --per-request-spec-metrics takes none, summary or detailed, "
                 "not '" << a.per_request_spec_metrics << "'\n";
    return 2;
  }
  if (spec_metrics != SpecMetricsLevel::kNone && k == 0) {  // as vLLM without a spec config
    std::cerr << "specloop serve: --per-request-spec-metrics needs speculation (--k 0 is off)\n";
    return 2;
  }
  std::vector<int> branching;
  if (a.draft_mode == "tree" && !ParseTreeBranching(a.tree, &branching)) {
    std::cerr << "specloop serve: --tree takes branching factors in [1, 16], e.g. 2,2,1,1\n";
    return 2;
  }
  LoadOptions load;
  load.device = a.device;
  load.dtype = a.dtype;
  load.max_model_len = a.max_model_len;
  load.cuda_graphs = !a.no_cuda_graphs;
  std::unique_ptr<LlamaModel> target;
  Draft draft;
  std::unique_ptr<Tokenizer> tokenizer;
  Status s = LlamaModel::Load(a.target, load, &target);
  if (s.ok()) s = Tokenizer::Load(a.target, &tokenizer);
  LoadOptions draft_load = load;
  draft_load.dtype = "auto";  // --dtype is the target's; a draft model's weights stay in cache
  if (s.ok() && !a.draft.empty()) {
    s = LoadDraft(a.draft, *target, draft_load, &draft).Annotate("--draft");
  }
  if (s.ok() && a.draft.empty() && k > 0) {
    s = Status::InvalidArgument("--k " + a.k + " needs a --draft");
  }
  // The chat template: --chat-template FILE (Jinja source, with the target's special tokens),
  // else the target directory's own, else the plain default.
  std::unique_ptr<ChatTemplate> chat_template;
  if (s.ok()) s = ChatTemplate::FromModelDir(a.target, &chat_template);
  if (s.ok() && !a.chat_template.empty()) {
    std::string source;
    s = ReadFileToString(a.chat_template, &source).Annotate("--chat-template");
    nlohmann::json special = nlohmann::json::object();
    if (!chat_template->bos_token().empty()) special["bos_token"] = chat_template->bos_token();
    if (!chat_template->eos_token().empty()) special["eos_token"] = chat_template->eos_token();
    if (s.ok()) s = ChatTemplate::Compile(source, special, &chat_template).Annotate("--chat-template");
  }
  // Request defaults from the target's generation_config.json (--generation-config).
  GenerationConfigMode generation_mode = GenerationConfigMode::kAuto;
  GenerationConfig generation_config;
  GenerationDefaults generation_defaults;
  if (s.ok()) s = ParseGenerationConfigMode(a.generation_config, &generation_mode);
  if (s.ok()) s = GenerationConfig::FromDir(a.target, &generation_config);
  if (s.ok()) {
    s = ResolveGenerationDefaults(generation_config, generation_mode,
                                  target->config().eos_token_ids, target->config().vocab_size,
                                  &generation_defaults);
  }
  if (!s.ok()) {
    std::cerr << "specloop serve: " << s.ToString() << "\n";
    return 1;
  }
  std::printf("specloop serve: request defaults: %s\n", generation_defaults.Describe().c_str());
  for (const std::string& w : generation_defaults.not_applied) {
    std::printf("specloop serve: warning: %s/generation_config.json: %s\n", a.target.c_str(),
                w.c_str());
  }
  const std::string target_id = TargetId(a.target);

  ServingMetricsOptions mo;
  mo.max_domains = a.max_domains;
  mo.k_max = a.k_max;
  if (a.worker_id_option != nullptr && a.worker_id_option->count() > 0) {
    mo.constant_labels = {{"worker", std::to_string(a.worker_id)}};
  }
  std::unique_ptr<ServingMetrics> metrics;
  s = ServingMetrics::Create(mo, &metrics);
  std::unique_ptr<ReplayLogger> logger;
  if (s.ok() && !a.no_log && !a.buffer.empty()) {
    BufferOptions bo;
    bo.max_bytes = a.buffer_max_mb << 20;
    s = ReplayLogger::Open(bo, LoggerOptions(), a.buffer, &logger)
            .Annotate("--buffer " + a.buffer);
  }
  if (!s.ok()) {
    std::cerr << "specloop serve: " << s.ToString() << "\n";
    return 1;
  }
  std::unique_ptr<SampleLogger> sample_logger;
  if (logger) {
    SampleLoggerOptions so;
    so.top_k = a.log_top_k;
    so.worker_id = a.worker_id;
    so.target_id = target_id;
    sample_logger = std::make_unique<SampleLogger>(logger.get(), so);
  }
  // Draft hot-swap: follow the trainer's announcements (DESIGN.md section 7).
  zmq::context_t zmq_context;
  std::unique_ptr<DraftSwapper> swapper;
  if (!a.trainer_endpoint.empty() && k != 0) {
    DraftSwapperOptions wo;
    wo.fetcher.pub_endpoint = a.trainer_endpoint;
    wo.fetcher.router_endpoint =
        a.trainer_router.empty() ? NextPort(a.trainer_endpoint) : a.trainer_router;
    wo.fetcher.curve_server_key = a.trainer_public_key;
    wo.fetcher.chunk_bytes = a.draft_chunk_bytes;
    wo.staging_dir = !a.draft_staging.empty() ? a.draft_staging
                     : !a.buffer.empty()      ? a.buffer + "-drafts"
                                              : "specloop-drafts";
    wo.load.device = a.device;
    wo.initial_draft_dir = a.draft;
    Status ws = mkdir(wo.staging_dir.c_str(), 0755) == 0 || errno == EEXIST
                    ? DraftSwapper::Start(&zmq_context, wo, *target, metrics.get(),
                                          &swapper)
                    : Status::IOError("cannot create " + wo.staging_dir);
    if (!ws.ok()) {
      std::cerr << "specloop serve: --trainer-endpoint: " << ws.ToString() << "\n";
      return 1;
    }
    std::printf("specloop serve: following drafts from %s (staging %s)\n",
                a.trainer_endpoint.c_str(), wo.staging_dir.c_str());
  }

  SchedulerOptions so;
  so.max_batch = a.max_batch;
  so.max_waiting = a.max_waiting;
  so.k = k;
  so.policy.k_max = a.k_max;
  if (a.no_suffix) so.suffix_tokens = 0;
  so.prompt_lookup = a.prompt_lookup;
  so.tree_branching = branching;
  so.kv_cache_mb = a.kv_cache_mb;
  so.prefix_caching = !a.no_prefix_caching;
  so.per_request_spec_metrics = spec_metrics;
  Scheduler scheduler(target.get(), std::move(draft), tokenizer.get(), metrics.get(),
                      sample_logger.get(), so);
  if (swapper) scheduler.set_swap_hook(swapper.get());
  s = scheduler.Start();
  HttpServerOptions ho;
  ho.host = a.host;
  ho.port = a.port;
  ho.threads = std::max(a.http_threads, a.max_batch + a.max_waiting + 8);
  ho.model_name = a.model_name.empty() ? BaseName(a.target) : a.model_name;
  ho.trainer_status_url = a.trainer_status;
  ho.worker_id = a.worker_id;
  ho.target_id = target_id;
  ho.api_key = a.api_key;
  ho.max_body_bytes = a.max_body_bytes;
  if (a.max_prompt_tokens > 0) ho.max_prompt_tokens = a.max_prompt_tokens;
  if (a.max_tokens > 0) ho.max_tokens_limit = a.max_tokens;
  ho.read_timeout_seconds = a.read_timeout;
  ho.write_timeout_seconds = a.write_timeout;
  ho.keep_alive_timeout_seconds = a.keep_alive_timeout;
  ho.keep_alive_max_requests = a.keep_alive_max;
  ho.chat_template = std::move(chat_template);
  ho.generation_defaults = generation_defaults;
  HttpServer server(ho, &scheduler, metrics.get(), tokenizer.get(), &target->config(),
                    logger.get(), sample_logger.get());
  int port = 0;
  if (s.ok()) s = server.Bind(&port);
  if (!s.ok()) {
    std::cerr << "specloop serve: " << s.ToString() << "\n";
    return 1;
  }
  std::printf("specloop serve: listening on http://%s:%d (model %s, k %s, logging %s, api key %s)\n",
              a.host.c_str(), port, ho.model_name.c_str(), a.k.c_str(),
              logger ? a.buffer.c_str() : "off", a.api_key.empty() ? "off" : "on");
  std::fflush(stdout);

  {
    SignalWatcher signals;
    s = signals.Start([&server] { server.Stop(); });
    if (!s.ok()) {
      std::cerr << "specloop serve: " << s.ToString() << "\n";
      return 1;
    }
    s = server.Run();
  }
  scheduler.Stop();
  sample_logger.reset();  // drains finished requests into the logger
  if (logger) {
    Status c = logger->Close();
    if (!c.ok()) std::cerr << "specloop serve: closing buffer: " << c.ToString() << "\n";
  }
  std::printf("specloop serve: stopped\n");
  return s.ok() ? 0 : 1;
}

}  // namespace

void AddServeCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server with speculation");
  auto a = std::make_shared<ServeArgs>();
  cmd->add_option("--target", a->target, "target model directory")->required();
  cmd->add_option("--draft", a->draft,
                  "draft: a model directory, or an EAGLE-3 head (LlamaForCausalLMEagle3); "
                  "none: plain decoding and suffix blocks until the trainer publishes a head");
  cmd->add_option("--host", a->host, "bind address")->capture_default_str();
  cmd->add_option("--port", a->port, "port (0 = any free port)")->capture_default_str();
  cmd->add_option("--buffer", a->buffer, "replay buffer directory (logging on)");
  cmd->add_option("--buffer-max-mb", a->buffer_max_mb,
                  "replay buffer size limit in MiB; the oldest records are dropped beyond it "
                  "(0 = unbounded)")
      ->capture_default_str();
  cmd->add_option("--trainer-endpoint", a->trainer_endpoint,
                  "the trainer's ZeroMQ PUB endpoint: follow its drafts (hot-swap)");
  cmd->add_option("--trainer-router", a->trainer_router,
                  "the trainer's ROUTER endpoint (default: the PUB endpoint's port + 1)");
  cmd->add_option("--trainer-public-key", a->trainer_public_key,
                  "the trainer's CURVE public key (Z85): authenticate the trainer");
  cmd->add_option("--trainer-status", a->trainer_status,
                  "the trainer's metrics server (http://HOST:PORT), whose state the status "
                  "page shows");
  cmd->add_option("--draft-staging", a->draft_staging,
                  "where fetched drafts are unpacked (default: BUFFER-drafts)");
  cmd->add_option("--draft-chunk-bytes", a->draft_chunk_bytes,
                  "bytes asked per chunk when fetching a draft")
      ->check(CLI::Range(uint64_t{1}, uint64_t{64} << 20))
      ->capture_default_str();
  cmd->add_option("--api-key", a->api_key,
                  "require 'Authorization: Bearer KEY' on /v1/* (prefer $SPECLOOP_API_KEY: "
                  "arguments show in ps)")
      ->envname("SPECLOOP_API_KEY");
  cmd->add_option("--max-body-bytes", a->max_body_bytes, "largest request body (413 beyond)")
      ->capture_default_str();
  cmd->add_option("--max-prompt-tokens", a->max_prompt_tokens,
                  "longest prompt in tokens (400 beyond; 0 = the context)")
      ->capture_default_str();
  cmd->add_option("--max-tokens", a->max_tokens,
                  "largest max_tokens a request may ask (400 beyond; 0 = the context)")
      ->capture_default_str();
  cmd->add_option("--read-timeout", a->read_timeout,
                  "seconds a stalled client may take per read of its request")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  cmd->add_option("--write-timeout", a->write_timeout,
                  "seconds a client that stops reading may block one write")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  cmd->add_option("--keep-alive-timeout", a->keep_alive_timeout,
                  "seconds an idle keep-alive connection is kept")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  cmd->add_option("--keep-alive-max", a->keep_alive_max, "requests per keep-alive connection")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--max-batch", a->max_batch, "most sequences per batch")->capture_default_str();
  cmd->add_option("--max-waiting", a->max_waiting, "most queued requests (429 beyond)")
      ->capture_default_str();
  cmd->add_option("--k", a->k, "speculation length: auto, or a number (0 = off)")
      ->capture_default_str();
  cmd->add_option("--k-max", a->k_max, "largest k the adaptive policy picks")
      ->capture_default_str();
  cmd->add_flag("--no-log", a->no_log, "do not log samples into the buffer");
  cmd->add_flag("--no-suffix", a->no_suffix,
                "no suffix proposals (continuations of earlier requests of the domain; with "
                "--k auto they replace the draft's block where they promise more tokens/s)");
  cmd->add_flag("--prompt-lookup", a->prompt_lookup,
                "with --k auto, also draft from the request's own context (the tokens after the "
                "last earlier occurrence of its last 2-4 tokens) where that promises more "
                "tokens/s than the draft and the suffix block");
  cmd->add_option("--draft-mode", a->draft_mode,
                  "chain, or tree: token trees of --tree's shape (with --k auto, per sequence "
                  "and step where they promise more tokens/s than a chain)")
      ->check(CLI::IsMember({"chain", "tree"}))
      ->capture_default_str();
  cmd->add_option("--tree", a->tree,
                  "tree mode: children per node at each depth; the depth is at most --k")
      ->capture_default_str();
  cmd->add_option("--max-model-len", a->max_model_len,
                  "context limit in positions (0: the model's max_position_embeddings, or its "
                  "sliding window where smaller)")
      ->check(CLI::Range(0, 1 << 30))
      ->capture_default_str();
  cmd->add_option("--kv-cache-mb", a->kv_cache_mb,
                  "KV cache memory of the target and the draft, MiB (0: max-batch sequences at "
                  "the context limit, within a quarter of this machine's memory); requests wait "
                  "for blocks, and longer ones get a 400")
      ->check(CLI::Range(0.0, 1e7))
      ->capture_default_str();
  cmd->add_flag("--no-prefix-caching", a->no_prefix_caching,
                "do not reuse the cached KV blocks of earlier requests' common prefixes");
  cmd->add_option("--per-request-spec-metrics,--per-request-spec-decode-metrics",
                  a->per_request_spec_metrics,
                  "per-request speculative metrics in each response, as vLLM's "
                  "--per-request-spec-decode-metrics: none, summary (\"metrics\": "
                  "{\"speculative_decoding\": {mean_acceptance_length, draft_acceptance_rate, "
                  "acceptance_histogram, num_spec_steps, ...}}) or detailed (adds "
                  "per_step_accepted / per_step_drafted)")
      ->capture_default_str();
  cmd->add_option("--log-top-k", a->log_top_k, "target log-probs kept per position")
      ->capture_default_str();
  cmd->add_option("--max-domains", a->max_domains, "distinct domains kept by name in metrics, per-domain state and logged records (later ones: \"other\")")
      ->capture_default_str();
  a->worker_id_option =
      cmd->add_option("--worker-id", a->worker_id,
                      "worker id in records; when given, also a worker label on every metric")
          ->capture_default_str();
  cmd->add_option("--model-name", a->model_name, "served model id (default: target dir name)");
  cmd->add_option("--chat-template", a->chat_template,
                  "Jinja chat template file for /v1/chat/completions (default: the target's "
                  "tokenizer_config.json chat_template, else \"ROLE: content\" lines)");
  cmd->add_option("--generation-config", a->generation_config,
                  "auto: requests that omit temperature, top_p, top_k or max_tokens get the "
                  "target's generation_config.json values (do_sample false: greedy), as vLLM; "
                  "ignore: temperature 1, top_p 1, top_k off. Its eos_token_id ids end "
                  "generation in both")
      ->check(CLI::IsMember({"auto", "ignore"}))
      ->capture_default_str();
  cmd->add_option("--device", a->device, "cpu or cuda")->capture_default_str();
  cmd->add_flag("--no-cuda-graphs", a->no_cuda_graphs,
                "on cuda, run every forward eagerly instead of replaying CUDA graphs");
  cmd->add_option("--dtype", a->dtype,
                  "target weights: auto (float32 on cpu), float32, float16 or bfloat16 (on cpu: "
                  "16-bit weights, float32 arithmetic; half the bytes per decode step)")
      ->capture_default_str();
  cmd->add_option("--threads", a->threads, "compute threads (0: every core)")
      ->capture_default_str();
  cmd->add_option("--http-threads", a->http_threads, "HTTP worker threads")
      ->capture_default_str();
  cmd->callback([a, exit_code] {
    // As many malloc arenas as cores (MALLOC_ARENA_MAX overrides), not glibc's eight a core:
    // each HTTP thread (one a connection) would otherwise keep an arena of what it touched,
    // 28-38 MiB beyond --kv-cache-mb under 64 concurrent streams (bench/RESULTS.md,
    // "kv_cache_bench").
    if (std::getenv("MALLOC_ARENA_MAX") == nullptr) {
      mallopt(M_ARENA_MAX, std::max(2, AvailableCores()));
    }
    SetComputeThreads(a->threads);
    *exit_code = RunServe(*a);
  });
}

}  // namespace specloop
