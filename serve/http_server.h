// HttpServer: the OpenAI-compatible HTTP front (cpp-httplib), DESIGN.md section 9.
//
//   POST /v1/completions   validate + tokenize (completion_params.h), queue to the Scheduler,
//                          then answer in one JSON object or stream server-sent events
//                          ("data: {chunk}\n\n" ... "data: [DONE]\n\n");
//   POST /v1/chat/completions  the same, with messages rendered by the model's chat template
//                          (common/chat/chat_template.h): a "chat.completion" object, or
//                          "chat.completion.chunk" events whose first delta is the role;
//   GET  /v1/models        the served model, with its generation_defaults;
//   GET  /health           200 while the scheduler runs, else 503;
//   GET  /metrics          Prometheus text exposition 0.0.4;
//   GET  /, /status.json   the built-in status page and its data (serve/status_page.h).
//
// Handler threads never touch a model: they wait on (or stream from) the request's channel.
// A streaming client that disconnects cancels its request. Errors are OpenAI error objects:
// 400 bad input, 401 missing or wrong API key, 404 unknown model or route, 413 body too large,
// 429 queue full, 503 shutting down, 500 engine failure; none of them stops the server, and
// each is counted in specloop_http_errors_total{code}.
//
// Security limits (HttpServerOptions): with an api_key every route but GET /health, /metrics,
// / and /status.json needs "Authorization: Bearer KEY" (compared in constant time); bodies,
// prompt tokens and max_tokens are bounded; a client that stalls mid-request, or stops
// reading a response, is disconnected after read/write_timeout_seconds; idle keep-alive
// connections are closed after keep_alive_timeout_seconds.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "common/base/status.h"
#include "common/chat/chat_template.h"
#include "common/tokenizer/model_config.h"
#include "common/tokenizer/tokenizer.h"
#include "serve/completion_params.h"
#include "serve/scheduler.h"
#include "serve/serving_metrics.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}

namespace specloop {

class ReplayLogger;
class SampleLogger;

struct HttpServerOptions {
  // Bind address. Default: 127.0.0.1 (loopback only).
  std::string host = "127.0.0.1";
  // Port; 0 picks a free one (see Bind()). Default: 8000.
  int port = 8000;
  // Largest request body accepted (413 beyond). Default: 1 MiB.
  size_t max_body_bytes = 1 << 20;
  // HTTP worker threads (each waiting request holds one). Default: 96.
  int threads = 96;
  // Name in /v1/models and responses, worker and target ids (system_fingerprint).
  std::string model_name = "specloop";
  // The trainer's metrics server, shown on the status page (StatusPageOptions). Default: none.
  std::string trainer_status_url;
  uint32_t worker_id = 0;
  std::string target_id;
  // Largest max_tokens a request may ask for. Default: the context limit.
  int max_tokens_limit = 1 << 30;
  // Longest prompt in tokens (BOS included); 400 beyond. Default: the context limit.
  int max_prompt_tokens = 1 << 30;
  // Bearer token required on every route but the open ones (see above); empty: none.
  // Default: empty.
  std::string api_key;
  // Seconds one read of a request (headers, body) or one write of a response may wait before
  // the connection is dropped. Default: 10 and 10.
  int read_timeout_seconds = 10;
  int write_timeout_seconds = 10;
  // An idle keep-alive connection is closed after this many seconds, and after this many
  // requests. Default: 5 and 100.
  int keep_alive_timeout_seconds = 5;
  int keep_alive_max_requests = 100;
  // The model's chat template for /v1/chat/completions (ChatTemplate::FromModelDir). Default:
  // null, the plain default template (kDefaultChatTemplate).
  std::shared_ptr<const ChatTemplate> chat_template;
  // What requests that omit sampling fields or max_tokens get, and the extra stop ids
  // (generation_config.json under --generation-config auto); shown in /v1/models. Default: the
  // plain defaults.
  GenerationDefaults generation_defaults;
};


class HttpServer {
 public:
  // None of the pointers is owned; all must outlive the server. `logger` and
  // `sample_logger` may be null (no logging).
  HttpServer(const HttpServerOptions& options, Scheduler* scheduler, ServingMetrics* metrics,
             const Tokenizer* tokenizer, const ModelConfig* config, const ReplayLogger* logger,
             const SampleLogger* sample_logger);
  ~HttpServer();

  // Binds the listening socket (backlog 1024: connections beyond what the accept loop has
  // taken wait in the kernel) and stores the bound port in *port (useful with port 0).
  Status Bind(int* port);
  // Serves until Stop(); returns at once if Stop() came first. REQUIRES: Bind() succeeded.
  // Blocks.
  Status Run();
  // Makes Run() return, or a later Run() not start; safe from any thread, idempotent.
  void Stop();

 private:
  void Routes();
  std::string Fingerprint() const;
  // POST /v1/completions (chat false) and /v1/chat/completions (chat true).
  void Complete(const httplib::Request& req, httplib::Response& res, bool chat);

  const HttpServerOptions options_;
  Scheduler* scheduler_;
  ServingMetrics* metrics_;
  CompletionLimits limits_;
  const ReplayLogger* logger_;
  const SampleLogger* sample_logger_;
  std::unique_ptr<httplib::Server> server_;
  std::mutex run_mu_;
  bool stopped_ = false;             // GUARDED_BY(run_mu_)
  std::atomic<bool> running_{false};  // Run() is between its check and its return
  std::atomic<uint64_t> next_id_{0};
  const uint64_t id_salt_;
};

}  // namespace specloop
