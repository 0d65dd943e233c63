#include "fleet/front_proxy.h"

#include <strings.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

#include <httplib.h>

#include "common/base/clock.h"
#include "common/observe/metrics.h"

namespace specloop {

namespace {

constexpr int kListenBacklog = 1024;  // as HttpServer's: httplib's 5 drops connection bursts
constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// Headers of one connection, not of the message (RFC 9110 section 7.6.1), the ones httplib
// sets itself, and the pseudo-headers its server adds to a request (REMOTE_ADDR, ...).
bool RelayedHeader(const std::string& name) {
  static const char* const kDropped[] = {
      "connection",  "keep-alive",  "proxy-connection", "proxy-authenticate",
      "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade", "host",
      "content-length", "content-type", "remote_addr", "remote_port", "local_addr",
      "local_port"};
  for (const char* d : kDropped) {
    if (strcasecmp(name.c_str(), d) == 0) return false;
  }
  return true;
}

void SendProxyError(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_content("{\"error\":{\"message\":\"" + message +
                      "\",\"type\":\"server_error\",\"param\":null,\"code\":null}}",
                  "application/json");
}

}  // namespace

struct FrontProxy::Impl {
  struct Upstream {
    std::string host, name;  // name: "HOST:PORT", the metrics' label
    int port = 0;
    std::atomic<int> in_flight{0};
    std::atomic<int64_t> down_until_us{0};
    metrics::Gauge* in_flight_gauge = nullptr;
    metrics::Gauge* up_gauge = nullptr;
  };

  // One attempt of a request at one worker, run on its own thread so that the handler can
  // wait for the commit point (first event, or the whole response) and retry before it.
  struct Exchange {
    std::mutex mu;
    std::condition_variable cv;
    bool have_headers = false, finished = false, cancel = false;
    httplib::Error error = httplib::Error::Success;
    int status = 0;
    httplib::Headers headers;
    std::string content_type, body;  // body: received, not yet relayed
    std::thread thread;
    bool EventStream() const { return content_type.rfind("text/event-stream", 0) == 0; }
    ~Exchange() {
      if (thread.joinable()) thread.join();
    }
  };

  explicit Impl(FrontProxyOptions o) : options(std::move(o)) {}

  Status Init();
  size_t Pick(const std::vector<bool>& tried);
  std::shared_ptr<Exchange> Start(Upstream* up, const httplib::Request& req);
  void Relay(const httplib::Request& req, httplib::Response& res);
  void Health(httplib::Response& res);
  void CountError(Upstream* up, const char* kind) {
    upstream_errors->WithLabelValues({up->name, kind}).Increment();
  }

  FrontProxyOptions options;
  httplib::Server server;
  metrics::Registry registry;
  std::vector<std::unique_ptr<Upstream>> upstreams;
  std::atomic<uint64_t> turn{0};
  metrics::Family<metrics::Counter>* responses = nullptr;
  metrics::Family<metrics::Counter>* upstream_errors = nullptr;
  metrics::Family<metrics::Counter>* failed = nullptr;
  metrics::Counter* retries = nullptr;
  std::mutex run_mu;
  bool stopped = false;  // GUARDED_BY(run_mu)
  std::atomic<bool> running{false};
};

Status FrontProxy::Impl::Init() {
  if (options.upstreams.empty()) return Status::InvalidArgument("no upstream worker given");
  metrics::Family<metrics::Counter>* retries_family = nullptr;
  metrics::Family<metrics::Gauge>* in_flight = nullptr;
  metrics::Family<metrics::Gauge>* up = nullptr;
  for (Status s : {
           registry.AddCounter({"specloop_proxy_responses_total",
                                "Responses relayed, by worker and status code.",
                                {"upstream", "code"}},
                               &responses),
           registry.AddCounter({"specloop_proxy_upstream_errors_total",
                                "Failed attempts at a worker: connect, lost (before the "
                                "response was committed), unavailable (503), cut (after).",
                                {"upstream", "kind"}},
                               &upstream_errors),
           registry.AddCounter({"specloop_proxy_failed_total",
                                "Requests that failed at the proxy: no_upstream (502), cut "
                                "(a stream cut after its first event).",
                                {"reason"}},
                               &failed),
           registry.AddCounter({"specloop_proxy_retries_total",
                                "Requests sent again to another worker.", {}},
                               &retries_family),
           registry.AddGauge({"specloop_proxy_upstream_in_flight",
                              "Requests in flight at each worker through this proxy.",
                              {"upstream"}},
                             &in_flight),
           registry.AddGauge({"specloop_proxy_upstream_up",
                              "0 while a worker that refused a connection is tried last.",
                              {"upstream"}},
                             &up)}) {
    if (!s.ok()) return s;
  }
  retries = &retries_family->WithLabelValues({});
  for (const std::string& u : options.upstreams) {
    const size_t colon = u.find_last_of(':');
    char* end = nullptr;
    const long port = colon == std::string::npos ? 0 : std::strtol(u.c_str() + colon + 1, &end, 10);
    if (colon == 0 || colon == std::string::npos || end == nullptr || *end != 0 || port <= 0 ||
        port > 65535) {
      return Status::InvalidArgument("upstream '" + u + "' is not HOST:PORT");
    }
    auto w = std::make_unique<Upstream>();
    w->host = u.substr(0, colon);
    w->port = static_cast<int>(port);
    w->name = u;
    w->in_flight_gauge = &in_flight->WithLabelValues({u});
    w->up_gauge = &up->WithLabelValues({u});
    w->up_gauge->Set(1);
    upstreams.push_back(std::move(w));
  }
  return Status::OK();
}

// The untried worker with the fewest requests in flight, workers marked down last; ties
// are broken in turn. REQUIRES: some worker untried.
size_t FrontProxy::Impl::Pick(const std::vector<bool>& tried) {
  const size_t n = upstreams.size();
  const size_t first = turn.fetch_add(1) % n;
  const int64_t now = SteadyMicros();
  size_t best = n;
  bool best_down = true;
  for (size_t k = 0; k < n; ++k) {
    const size_t i = (first + k) % n;
    if (tried[i]) continue;
    const Upstream& u = *upstreams[i];
    const bool down = u.down_until_us.load() > now;
    if (best == n || (best_down && !down) ||
        (down == best_down && u.in_flight.load() < upstreams[best]->in_flight.load())) {
      best = i;
      best_down = down;
    }
  }
  return best;
}

std::shared_ptr<FrontProxy::Impl::Exchange> FrontProxy::Impl::Start(Upstream* up,
                                                                      const httplib::Request& req) {
  auto ex = std::make_shared<Exchange>();
  httplib::Request r;
  r.method = req.method;
  r.path = req.target;  // path and query as the client sent them
  r.body = req.body;
  for (const auto& [name, value] : req.headers) {
    if (RelayedHeader(name)) r.headers.emplace(name, value);
  }
  if (req.has_header("Content-Type")) {
    r.headers.emplace("Content-Type", req.get_header_value("Content-Type"));
  }
  r.headers.emplace("X-Forwarded-For", req.remote_addr);
  Exchange* e = ex.get();
  r.response_handler = [e](const httplib::Response& res) {
    std::lock_guard<std::mutex> lock(e->mu);
    e->status = res.status;
    e->headers = res.headers;
    e->content_type = res.get_header_value("Content-Type");
    e->have_headers = true;
    e->cv.notify_all();
    return !e->cancel;
  };
  r.content_receiver = [e](const char* data, size_t n, uint64_t, uint64_t) {
    std::lock_guard<std::mutex> lock(e->mu);
    if (e->cancel) return false;
    e->body.append(data, n);
    e->cv.notify_all();
    return true;
  };
  up->in_flight.fetch_add(1);
  up->in_flight_gauge->Increment();
  ex->thread = std::thread([this, up, e, r = std::move(r)]() mutable {
    httplib::Client cli(up->host, up->port);
    const auto seconds = [](double s) { return std::chrono::microseconds(int64_t(s * 1e6)); };
    cli.set_connection_timeout(seconds(options.connect_timeout_seconds));
    cli.set_read_timeout(seconds(options.upstream_read_timeout_seconds));
    cli.set_write_timeout(seconds(options.connect_timeout_seconds + 10));
    cli.set_url_encode(false);
    cli.set_keep_alive(false);
    cli.set_tcp_nodelay(true);  // a request's headers and body go out without Nagle's wait
    httplib::Response res;
    httplib::Error error = httplib::Error::Success;
    const bool ok = cli.send(r, res, error);
    up->in_flight.fetch_sub(1);
    up->in_flight_gauge->Decrement();
    std::lock_guard<std::mutex> lock(e->mu);
    e->error = ok ? httplib::Error::Success
                  : (error == httplib::Error::Success ? httplib::Error::Unknown : error);
    e->finished = true;
    e->cv.notify_all();
  });
  return ex;
}

void FrontProxy::Impl::Relay(const httplib::Request& req, httplib::Response& res) {
  const size_t n = upstreams.size();
  std::vector<bool> tried(n, false);
  std::shared_ptr<Exchange> unavailable;  // the last 503, relayed if every worker fails
  Upstream* unavailable_from = nullptr;
  for (size_t attempt = 0; attempt < n; ++attempt) {
    const size_t i = Pick(tried);
    tried[i] = true;
    Upstream* up = upstreams[i].get();
    if (attempt > 0) retries->Increment();
    std::shared_ptr<Exchange> ex = Start(up, req);
    std::unique_lock<std::mutex> lock(ex->mu);
    ex->cv.wait(lock, [&] { return ex->finished || (ex->EventStream() && !ex->body.empty()); });
    if (ex->finished && ex->error != httplib::Error::Success) {  // nothing reached the client
      const bool refused = ex->error == httplib::Error::Connection ||
                           ex->error == httplib::Error::ConnectionTimeout;
      CountError(up, refused ? "connect" : "lost");
      if (refused) {
        up->down_until_us.store(SteadyMicros() + int64_t(options.down_seconds * 1e6));
        up->up_gauge->Set(0);
      }
      continue;
    }
    up->down_until_us.store(0);
    up->up_gauge->Set(1);
    if (ex->finished && ex->status == 503 && attempt + 1 < n) {  // shutting down: not accepted
      CountError(up, "unavailable");
      lock.unlock();
      unavailable = std::move(ex);
      unavailable_from = up;
      continue;
    }
    responses->WithLabelValues({up->name, std::to_string(ex->status)}).Increment();
    res.status = ex->status;
    for (const auto& [name, value] : ex->headers) {
      if (RelayedHeader(name)) res.headers.emplace(name, value);
    }
    res.set_header("X-Specloop-Upstream", up->name);
    if (ex->finished) {  // the whole response
      res.set_content(std::move(ex->body), ex->content_type);
      return;
    }
    // An event stream, committed at its first event: relayed as it comes.
    lock.unlock();
    res.set_chunked_content_provider(
        ex->content_type,
        [this, ex, up](size_t, httplib::DataSink& sink) {
          std::unique_lock<std::mutex> l(ex->mu);
          ex->cv.wait(l, [&] { return ex->finished || !ex->body.empty(); });
          if (!ex->body.empty()) {
            std::string chunk;
            chunk.swap(ex->body);
            l.unlock();
            return sink.write(chunk.data(), chunk.size());
          }
          if (ex->error != httplib::Error::Success) {
            CountError(up, "cut");
            failed->WithLabelValues({"cut"}).Increment();
            return false;  // closes the client's connection: its stream ends without [DONE]
          }
          sink.done();
          return true;
        },
        [ex](bool) {  // the client left or the stream ended: stop reading the worker
          std::lock_guard<std::mutex> l(ex->mu);
          ex->cancel = true;
        });
    return;
  }
  if (unavailable != nullptr) {
    responses->WithLabelValues({unavailable_from->name, "503"}).Increment();
    res.status = 503;
    res.set_content(std::move(unavailable->body), unavailable->content_type);
    return;
  }
  failed->WithLabelValues({"no_upstream"}).Increment();
  SendProxyError(res, 502, "no serving worker answered (" + std::to_string(n) + " tried)");
}

void FrontProxy::Impl::Health(httplib::Response& res) {
  int up = 0;
  for (const auto& u : upstreams) {
    httplib::Client cli(u->host, u->port);
    cli.set_connection_timeout(1);
    cli.set_read_timeout(2);
    auto r = cli.Get("/health");
    if (r && r->status == 200) ++up;
  }
  res.status = up > 0 ? 200 : 503;
  res.set_content("{\"status\":\"" + std::string(up > 0 ? "ok" : "unavailable") +
                      "\",\"upstreams_up\":" + std::to_string(up) +
                      ",\"upstreams\":" + std::to_string(upstreams.size()) + "}",
                  "application/json");
}

FrontProxy::FrontProxy(FrontProxyOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

FrontProxy::~FrontProxy() { Stop(); }

Status FrontProxy::Bind(int* port) {
  Impl& p = *impl_;
  Status s = p.Init();
  if (!s.ok()) return s;
  const int threads = std::max(4, p.options.threads);
  p.server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  p.server.set_payload_max_length(p.options.max_body_bytes);
  p.server.set_tcp_nodelay(true);  // each relayed event leaves at once
  p.server.set_keep_alive_max_count(100);  // as a worker's (HttpServerOptions)
  p.server.Get("/health", [&p](const httplib::Request&, httplib::Response& res) { p.Health(res); });
  p.server.Get("/metrics", [&p](const httplib::Request&, httplib::Response& res) {
    res.set_content(p.registry.Serialize(), kMetricsContentType);
  });
  const auto relay = [&p](const httplib::Request& req, httplib::Response& res) {
    p.Relay(req, res);
  };
  p.server.Get(".*", relay);
  p.server.Post(".*", relay);
  p.server.Put(".*", relay);
  p.server.Patch(".*", relay);
  p.server.Delete(".*", relay);
  p.server.Options(".*", relay);
  int listen_fd = -1;
  p.server.set_socket_options([&listen_fd](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_fd = sock;
  });
  int bound = -1;
  if (p.options.port == 0) {
    bound = p.server.bind_to_any_port(p.options.host);
  } else if (p.server.bind_to_port(p.options.host, p.options.port)) {
    bound = p.options.port;
  }
  if (bound <= 0) {
    return Status::IOError("cannot bind " + p.options.host + ":" + std::to_string(p.options.port));
  }
  if (listen_fd >= 0) ::listen(listen_fd, kListenBacklog);
  *port = bound;
  return Status::OK();
}

Status FrontProxy::Run() {
  Impl& p = *impl_;
  {
    std::lock_guard<std::mutex> lock(p.run_mu);
    if (p.stopped) return Status::OK();
    p.running = true;
  }
  const bool ok = p.server.listen_after_bind();
  p.running = false;
  return ok ? Status::OK() : Status::IOError("proxy's HTTP server failed");
}

void FrontProxy::Stop() {
  Impl& p = *impl_;
  {
    std::lock_guard<std::mutex> lock(p.run_mu);
    p.stopped = true;
  }
  // httplib's stop() is a no-op until its loop runs (see HttpServer::Stop).
  while (p.running && !p.server.is_running()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  p.server.stop();
}

}  // namespace specloop
