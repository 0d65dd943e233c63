#include "serve/http_server.h"

#include <sys/socket.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "serve/api_key.h"
#include "serve/logprobs_json.h"
#include "serve/sample_logger.h"
#include "serve/status_page.h"

namespace specloop {

using json = nlohmann::json;

namespace {

constexpr const char* kJson = "application/json";
constexpr int kListenBacklog = 1024;  // the kernel caps it at net.core.somaxconn

std::string Dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

json UsageJson(const RequestEvent& done) {
  return {{"prompt_tokens", done.prompt_tokens},
          {"completion_tokens", done.completion_tokens},
          {"total_tokens", done.prompt_tokens + done.completion_tokens}};
}

json SpeculativeJson(const SpeculativeUsage& s) {
  return {{"drafted", s.drafted},
          {"accepted", s.accepted},
          {"tested", s.tested},
          {"acceptance_rate", s.acceptance_rate()},
          {"steps", s.steps},
          {"drafts", s.drafts},
          {"draft_version", s.draft_version},
          {"suffix",
           {{"steps", s.suffix.steps},
            {"drafted", s.suffix.drafted},
            {"accepted", s.suffix.accepted},
            {"tested", s.suffix.tested}}},
          {"lookup",
           {{"steps", s.lookup.steps},
            {"drafted", s.lookup.drafted},
            {"accepted", s.lookup.accepted},
            {"tested", s.lookup.tested}}},
          {"tree",
           {{"steps", s.tree.steps},
            {"drafted", s.tree.drafted},
            {"accepted", s.tree.accepted},
            {"tested", s.tree.tested}}}};
}

// vLLM's per-request block (PR 48915; serve/spec_decode_metrics.h), as the response's
// top-level {"metrics": {"speculative_decoding": {...}}}.
json SpecDecodeMetricsJson(const RequestSpecDecodeMetrics& m) {
  json j = {{"mean_acceptance_length", m.mean_acceptance_length()},
            {"draft_acceptance_rate", m.draft_acceptance_rate()},
            {"acceptance_histogram", m.histogram},
            {"num_spec_steps", m.num_spec_steps()},
            {"num_accepted_draft_tokens", m.num_accepted_draft_tokens},
            {"num_draft_tokens", m.num_draft_tokens},
            {"num_spec_tokens", m.num_spec_tokens}};
  if (m.level == SpecMetricsLevel::kDetailed) {
    j["per_step_accepted"] = m.per_step_accepted;
    j["per_step_drafted"] = m.per_step_drafted;
  }
  return {{"speculative_decoding", std::move(j)}};
}

ApiError ServerError(int status, const std::string& message) {
  ApiError e;
  e.status = status;
  e.message = message;
  e.type = status == 429 ? "rate_limit_error" : status >= 500 ? "server_error"
                                                               : "invalid_request_error";
  return e;
}

// Answers with `e` (an OpenAI error object), counted in specloop_http_errors_total{code}.
void SendError(ServingMetrics* metrics, httplib::Response& res, const ApiError& e) {
  metrics->ObserveHttpError(e.status);
  res.status = e.status;
  res.set_content(Dump(e.ToJson()), kJson);
}

// The routes that stay open when an API key is set (probes, scrapes, the status page).
bool IsOpenRoute(const httplib::Request& req) {
  return req.method == "GET" && (req.path == "/health" || req.path == "/metrics" ||
                                 req.path == "/" || req.path == "/status.json");
}

}  // namespace

HttpServer::HttpServer(const HttpServerOptions& options, Scheduler* scheduler,
                       ServingMetrics* metrics, const Tokenizer* tokenizer,
                       const ModelConfig* config, const ReplayLogger* logger,
                       const SampleLogger* sample_logger)
    : options_(options),
      scheduler_(scheduler),
      metrics_(metrics),
      logger_(logger),
      sample_logger_(sample_logger),
      server_(std::make_unique<httplib::Server>()),
      id_salt_(std::random_device{}() ^ (uint64_t{std::random_device{}()} << 32)) {
  limits_.model_name = options.model_name;
  limits_.config = config;
  limits_.tokenizer = tokenizer;
  limits_.max_tokens_limit = options.max_tokens_limit;
  limits_.max_prompt_tokens = options.max_prompt_tokens;
  limits_.chat_template = options_.chat_template.get();  // null: the default template
  limits_.defaults = &options_.generation_defaults;
  Routes();
}

HttpServer::~HttpServer() { Stop(); }

std::string HttpServer::Fingerprint() const {
  return "specloop-w" + std::to_string(options_.worker_id) + "-" + options_.target_id;
}

Status HttpServer::Bind(int* port) {
  const int threads = std::max(4, options_.threads);
  server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server_->set_payload_max_length(options_.max_body_bytes);
  // A response goes out in several writes (headers, body; a stream's events): with Nagle's
  // algorithm each small write after the first waits for the client's delayed ACK (~40 ms).
  server_->set_tcp_nodelay(true);
  server_->set_read_timeout(std::max(1, options_.read_timeout_seconds), 0);
  server_->set_write_timeout(std::max(1, options_.write_timeout_seconds), 0);
  server_->set_keep_alive_timeout(std::max(1, options_.keep_alive_timeout_seconds));
  server_->set_keep_alive_max_count(
      static_cast<size_t>(std::max(1, options_.keep_alive_max_requests)));
  // cpp-httplib 0.11 listens with a backlog of 5: a burst of new connections (32 clients
  // connecting at once) overflows it and the kernel drops handshakes (resets, failed reads).
  // Its socket-options hook hands us the listening socket; listen() again raises the backlog.
  int listen_fd = -1;
  server_->set_socket_options([&listen_fd](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_fd = sock;
  });
  int bound = -1;
  if (options_.port == 0) {
    bound = server_->bind_to_any_port(options_.host);
  } else if (server_->bind_to_port(options_.host, options_.port)) {
    bound = options_.port;
  }
  if (bound <= 0) {
    return Status::IOError("cannot bind " + options_.host + ":" + std::to_string(options_.port));
  }
  if (listen_fd >= 0) ::listen(listen_fd, kListenBacklog);
  *port = bound;
  return Status::OK();
}

Status HttpServer::Run() {
  {
    std::lock_guard<std::mutex> lock(run_mu_);
    if (stopped_) return Status::OK();
    running_ = true;
  }
  const bool ok = server_->listen_after_bind();
  running_ = false;
  return ok ? Status::OK() : Status::IOError("HTTP server failed");
}

void HttpServer::Stop() {
  {
    std::lock_guard<std::mutex> lock(run_mu_);
    stopped_ = true;
  }
  // httplib's stop() is a no-op until its loop runs: wait out a Run() that passed its check
  // but has not started listening yet.
  while (running_ && !server_->is_running()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  server_->stop();
}

void HttpServer::Routes() {
  // The API key is checked before routing, so an unauthenticated body is never parsed.
  if (!options_.api_key.empty()) {
    server_->set_pre_routing_handler([this](const httplib::Request& req,
                                            httplib::Response& res) {
      if (IsOpenRoute(req) ||
          BearerTokenMatches(req.get_header_value("Authorization"), options_.api_key)) {
        return httplib::Server::HandlerResponse::Unhandled;
      }
      ApiError e;
      e.status = 401;
      e.code = "invalid_api_key";
      e.message = req.has_header("Authorization")
                      ? "Incorrect API key provided."
                      : "You didn't provide an API key (Authorization: Bearer KEY).";
      res.set_header("WWW-Authenticate", "Bearer");
      SendError(metrics_, res, e);
      return httplib::Server::HandlerResponse::Handled;
    });
  }

  server_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const bool ok = scheduler_->running();
    json j = {{"status", ok ? "ok" : "unavailable"},
              {"draft_version", scheduler_->draft_version()},
              {"active", scheduler_->active()},
              {"waiting", scheduler_->waiting()}};
    res.status = ok ? 200 : 503;
    res.set_content(Dump(j), kJson);
  });

  server_->Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json model = {{"id", options_.model_name},
                  {"object", "model"},
                  {"created", 0},
                  {"owned_by", "specloop"},
                  {"max_model_len", limits_.config->max_model_len},
                  {"draft_version", scheduler_->draft_version()},
                  {"generation_defaults", GenerationDefaultsJson(options_.generation_defaults)}};
    res.set_content(Dump({{"object", "list"}, {"data", json::array({model})}}), kJson);
  });

  // The built-in status page (serve/status_page.h), owned by its two handlers.
  StatusPageOptions so;
  so.model_name = options_.model_name;
  so.trainer_status_url = options_.trainer_status_url;
  auto status = std::make_shared<StatusPage>(metrics_, so);
  server_->Get("/", [status](const httplib::Request&, httplib::Response& res) {
    res.set_content(status->Html(), "text/html; charset=utf-8");
  });
  server_->Get("/status.json", [status](const httplib::Request&, httplib::Response& res) {
    res.set_content(status->Json(), kJson);
  });

  server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_->Render(logger_, sample_logger_),
                    "text/plain; version=0.0.4; charset=utf-8");
  });

  server_->Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    Complete(req, res, /*chat=*/false);
  });
  server_->Post("/v1/chat/completions",
                [this](const httplib::Request& req, httplib::Response& res) {
                  Complete(req, res, /*chat=*/true);
                });

  server_->set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;  // a handler's own error, already counted
    metrics_->ObserveHttpError(res.status);
    ApiError e;
    e.status = res.status;
    e.message = res.status == 404   ? "no route for " + req.method + " " + req.path
                : res.status == 413 ? "request body too large"
                                    : "request failed with status " + std::to_string(res.status);
    res.set_content(Dump(e.ToJson()), kJson);
  });

  server_->set_exception_handler(
      [this](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "internal error";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& ex) {
          what = ex.what();
        } catch (...) {
        }
        metrics_->ObserveHttpError(500);
        res.status = 500;
        res.set_content(Dump(ServerError(500, what).ToJson()), kJson);
      });
}

// One handler for both completion routes; they differ in parsing and in the JSON shapes:
//   text:  {"object": "text_completion", "choices": [{"text", "index", "logprobs",
//          "finish_reason"}]}, each chunk the same with its text;
//   chat:  {"object": "chat.completion", "choices": [{"index", "message": {"role":
//          "assistant", "content"}, "logprobs", "finish_reason"}]}; chunks are
//          "chat.completion.chunk" with a "delta": {"role": "assistant", "content": ""} first,
//          then {"content": text}, and {} beside the finish_reason.
// Both put usage, the speculative statistics, the request's sampling ({"temperature",
// "top_p", "top_k", "seed"}: what it gave, else the model's defaults) and, when the server
// collects them, vLLM's per-request "metrics" (spec_decode_metrics.h) in the response, or in
// the last chunk. With log-probs asked for, each choice (each chunk's, for its own tokens)
// carries them in the API's shape (logprobs_json.h); else "logprobs" is null.
void HttpServer::Complete(const httplib::Request& req, httplib::Response& res, bool chat) {
  auto send_error = [this](httplib::Response& res, const ApiError& e) {
    SendError(metrics_, res, e);
  };
  CompletionParams params;
  ApiError error;
  const uint64_t n = next_id_.fetch_add(1);
  std::mt19937_64 seed_gen(id_salt_ ^ (n * 0x9e3779b97f4a7c15ULL));
  const auto parse = chat ? ParseChatCompletionRequest : ParseCompletionRequest;
  if (!parse(req.body, req.get_header_value("X-Domain"), limits_, seed_gen(), &params, &error)) {
    return send_error(res, error);
  }
  char id[48];
  std::snprintf(id, sizeof(id), "%s-%08llx%06llx", chat ? "chatcmpl" : "cmpl",
                (unsigned long long)(id_salt_ >> 32), (unsigned long long)n);
  params.request_id = id;
  const bool stream = params.stream;
  const json sampling = SamplingJson(params.generate.sampling);
  auto channel = std::make_shared<RequestChannel>(std::move(params));
  switch (scheduler_->Submit(channel)) {
    case Scheduler::SubmitResult::kOk:
      break;
    case Scheduler::SubmitResult::kQueueFull:
      return send_error(res, ServerError(429, "too many requests waiting; retry later"));
    case Scheduler::SubmitResult::kStopped:
      return send_error(res, ServerError(503, "server shutting down"));
    case Scheduler::SubmitResult::kTooLarge: {
      const CompletionParams& p = channel->params();
      ApiError e = ServerError(
          400, "this request needs up to " +
                   std::to_string(p.prompt.size() + p.generate.max_tokens) +
                   " KV cache positions (prompt and max_tokens); the server's KV cache holds " +
                   std::to_string(scheduler_->kv_cache_tokens()) +
                   " (--kv-cache-mb): lower max_tokens or shorten the prompt");
      e.param = "max_tokens";
      e.code = "context_length_exceeded";
      return send_error(res, e);
    }
  }
  const int64_t created = UnixSeconds();
  json head = {{"id", id},
               {"object", !chat ? "text_completion" : stream ? "chat.completion.chunk"
                                                             : "chat.completion"},
               {"created", created},
               {"model", options_.model_name},
               {"system_fingerprint", Fingerprint()}};

  const CompletionParams& p = channel->params();
  // The log-probs' formatter (null when none are asked for), for the whole response.
  std::shared_ptr<LogprobsJson> logprobs =
      p.logprobs >= 0
          ? std::make_shared<LogprobsJson>(limits_.tokenizer, p.prompt.back(),
                                           chat ? LogprobsJson::Format::kChat
                                                : LogprobsJson::Format::kCompletions,
                                           p.tokens_as_ids)
          : nullptr;
  if (!stream) {
    std::string text;
    std::vector<TokenLogprob> entries;
    RequestEvent e;
    while (true) {
      if (!channel->Next(std::chrono::seconds(1), &e)) {
        if (!scheduler_->running()) {
          channel->Cancel();
          return send_error(res, ServerError(503, "server shutting down"));
        }
        continue;
      }
      if (e.type == RequestEvent::Type::kDelta) {
        text += e.text;
        entries.insert(entries.end(), e.logprobs.begin(), e.logprobs.end());
        continue;
      }
      break;
    }
    if (e.type == RequestEvent::Type::kError) {
      return send_error(res, ServerError(e.http_status, e.error));
    }
    json body = head;
    json choice = {{"index", 0},
                   {"logprobs", logprobs ? logprobs->Chunk(entries) : json(nullptr)},
                   {"finish_reason", e.finish_reason}};
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", text}};
    } else {
      choice["text"] = text;
    }
    body["choices"] = json::array({choice});
    body["usage"] = UsageJson(e);
    body["speculative"] = SpeculativeJson(e.speculative);
    if (e.spec_decode.level != SpecMetricsLevel::kNone) {
      body["metrics"] = SpecDecodeMetricsJson(e.spec_decode);
    }
    body["sampling"] = sampling;
    res.set_content(Dump(body), kJson);
    return;
  }

  // Streaming: one provider call runs the whole stream.
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, channel, head, chat, sampling, logprobs](size_t, httplib::DataSink& sink) {
        auto send = [&sink](const json& j) {
          const std::string s = "data: " + Dump(j) + "\n\n";
          return sink.write(s.data(), s.size());
        };
        // A chunk: `delta` for chat (null: {"content": text}), else the text; with log-probs
        // asked for, the entries of its tokens (`entries`, null: none, as the role's chunk and
        // the last one).
        auto chunk = [&head, chat, &logprobs](const std::string& text, const json& finish,
                                              const json& delta = nullptr,
                                              const std::vector<TokenLogprob>* entries = nullptr) {
          json c = head;
          json choice = {{"index", 0},
                         {"logprobs", logprobs && entries ? logprobs->Chunk(*entries)
                                                          : json(nullptr)},
                         {"finish_reason", finish}};
          if (chat) {
            choice["delta"] = delta.is_null() ? json{{"content", text}} : delta;
          } else {
            choice["text"] = text;
          }
          c["choices"] = json::array({choice});
          return c;
        };
        if (chat && !send(chunk("", nullptr, {{"role", "assistant"}, {"content", ""}}))) {
          channel->Cancel();
          return false;
        }
        RequestEvent e;
        while (true) {
          if (!channel->Next(std::chrono::milliseconds(200), &e)) {
            if (!sink.is_writable() || !scheduler_->running()) {
              channel->Cancel();
              return false;
            }
            continue;
          }
          if (e.type == RequestEvent::Type::kDelta) {
            if (!send(chunk(e.text, nullptr, nullptr, &e.logprobs))) {
              channel->Cancel();
              return false;
            }
            continue;
          }
          if (e.type == RequestEvent::Type::kError) {
            metrics_->ObserveHttpError(e.http_status);
            send(ServerError(e.http_status, e.error).ToJson());
          } else {
            json last = chunk("", e.finish_reason, json::object());
            last["usage"] = UsageJson(e);
            last["speculative"] = SpeculativeJson(e.speculative);
            if (e.spec_decode.level != SpecMetricsLevel::kNone) {
              last["metrics"] = SpecDecodeMetricsJson(e.spec_decode);
            }
            last["sampling"] = sampling;
            if (!send(last)) return false;
          }
          static const std::string kDone = "data: [DONE]\n\n";
          sink.write(kDone.data(), kDone.size());
          sink.done();
          return true;
        }
      },
      [channel](bool success) {
        if (!success) channel->Cancel();
      });
}

}  // namespace specloop
