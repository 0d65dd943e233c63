// FrontProxy (fleet/front_proxy.h) against stand-in workers on loopback: httplib servers, and
// raw sockets that drop a connection mid-request or cut a stream after its first event.
// What it must show: requests spread by load; a worker that refuses, drops the connection or
// answers 503 costs the client nothing (the request is answered by another); a stream is
// relayed as it comes and is never sent twice; a client that leaves cancels the worker's
// request; every failure is counted in the proxy's /metrics.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>

#include "common/base/free_port.h"
#include "fleet/front_proxy.h"

namespace specloop {
namespace {

// A stand-in worker: an httplib server on a free loopback port, stopped when destroyed.
class FakeWorker {
 public:
  explicit FakeWorker(const std::function<void(httplib::Server&)>& routes) {
    routes(server_);
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeWorker() {
    server_.stop();
    thread_.join();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

// A worker that answers every POST with its name, after `delay_ms`.
std::unique_ptr<FakeWorker> NamedWorker(const std::string& name, int delay_ms = 0) {
  return std::make_unique<FakeWorker>([name, delay_ms](httplib::Server& s) {
    s.Post("/v1/completions", [name, delay_ms](const httplib::Request& req,
                                               httplib::Response& res) {
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      res.set_content(name + ":" + req.body + ":" + req.get_header_value("Authorization"),
                      "application/json");
    });
    s.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("{}", "application/json");
    });
  });
}

// A raw listener that accepts connections, reads a request's first bytes and then writes
// `reply` (may be empty), calls `before_close` (may be empty) and closes: a worker killed
// mid-request, or mid-stream.
class DroppingWorker {
 public:
  explicit DroppingWorker(std::string reply, std::function<void()> before_close = nullptr)
      : reply_(std::move(reply)), before_close_(std::move(before_close)) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(fd_, 16), 0);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] {
      for (;;) {
        const int c = accept(fd_, nullptr, nullptr);
        if (c < 0) return;
        char buf[4096];
        if (read(c, buf, sizeof(buf)) > 0) accepted_.fetch_add(1);
        if (!reply_.empty() && write(c, reply_.data(), reply_.size()) < 0) {
        }
        if (before_close_) before_close_();
        close(c);
      }
    });
  }
  ~DroppingWorker() {
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    thread_.join();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  int accepted() const { return accepted_.load(); }

 private:
  std::string reply_;
  std::function<void()> before_close_;
  int fd_ = -1, port_ = 0;
  std::atomic<int> accepted_{0};
  std::thread thread_;
};

class Proxy {
 public:
  explicit Proxy(std::vector<std::string> upstreams) {
    FrontProxyOptions o;
    o.port = 0;
    o.upstreams = std::move(upstreams);
    o.down_seconds = 30;  // a refused worker stays last for the whole test
    proxy_ = std::make_unique<FrontProxy>(o);
    Status s = proxy_->Bind(&port_);
    EXPECT_TRUE(s.ok()) << s.ToString();
    thread_ = std::thread([this] { EXPECT_TRUE(proxy_->Run().ok()); });
  }
  ~Proxy() {
    proxy_->Stop();
    thread_.join();
  }
  int port() const { return port_; }
  httplib::Result Post(const std::string& body, const httplib::Headers& headers = {}) {
    httplib::Client cli("127.0.0.1", port_);
    cli.set_read_timeout(30);
    return cli.Post("/v1/completions", headers, body, "application/json");
  }
  // The value of one series of the proxy's /metrics (0 when absent).
  double Metric(const std::string& series) {
    httplib::Client cli("127.0.0.1", port_);
    auto r = cli.Get("/metrics");
    if (!r) return -1;
    const size_t at = r->body.find("\n" + series + " ");
    return at == std::string::npos ? 0 : std::stod(r->body.substr(at + series.size() + 2));
  }

 private:
  std::unique_ptr<FrontProxy> proxy_;
  int port_ = 0;
  std::thread thread_;
};

TEST(FrontProxy, SpreadsRequestsAndRelaysBodyHeadersAndStatus) {
  auto a = NamedWorker("a"), b = NamedWorker("b");
  Proxy proxy({a->address(), b->address()});
  std::map<std::string, int> by_worker;
  for (int i = 0; i < 10; ++i) {
    auto r = proxy.Post("{\"n\":" + std::to_string(i) + "}",
                        {{"Authorization", "Bearer k"}});
    ASSERT_TRUE(r) << httplib::to_string(r.error());
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body.substr(1), ":{\"n\":" + std::to_string(i) + "}:Bearer k");
    EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
    ++by_worker[r->body.substr(0, 1)];
    EXPECT_EQ(r->get_header_value("X-Specloop-Upstream"),
              r->body[0] == 'a' ? a->address() : b->address());
  }
  // One at a time: equal load, so the workers take turns.
  EXPECT_EQ(by_worker["a"], 5);
  EXPECT_EQ(by_worker["b"], 5);
  // A route the proxy does not know is the worker's to answer.
  httplib::Client cli("127.0.0.1", proxy.port());
  auto missing = cli.Get("/nope");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(proxy.Metric("specloop_proxy_responses_total{upstream=\"" + a->address() +
                         "\",code=\"200\"}"),
            5);
  auto health = cli.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_NE(health->body.find("\"upstreams_up\":2"), std::string::npos) << health->body;
  // The proxy's exposition passes Prometheus's own linter.
  auto metrics = cli.Get("/metrics");
  ASSERT_TRUE(metrics);
  FILE* lint = popen("promtool check metrics > /dev/null 2>&1", "w");
  ASSERT_NE(lint, nullptr);
  fwrite(metrics->body.data(), 1, metrics->body.size(), lint);
  EXPECT_EQ(pclose(lint), 0) << metrics->body;
}

TEST(FrontProxy, LeastLoadedWorkerTakesTheNextRequest) {
  // a is busy with a slow request; the next two go to b although a comes first in turn.
  auto a = NamedWorker("a", 1500), b = NamedWorker("b");
  Proxy proxy({a->address(), b->address()});
  std::thread slow([&] {
    auto r = proxy.Post("{}");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->body[0], 'a');
  });
  // Wait for the event: the slow request is in flight at one worker.
  const std::string gauge = "specloop_proxy_upstream_in_flight{upstream=\"" + a->address() + "\"}";
  for (int i = 0; i < 500 && proxy.Metric(gauge) < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_EQ(proxy.Metric(gauge), 1);
  for (int i = 0; i < 2; ++i) {
    auto r = proxy.Post("{}");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->body[0], 'b');
  }
  slow.join();
}

TEST(FrontProxy, RefusedDroppedAndUnavailableWorkersCostTheClientNothing) {
  const int closed_port = FreeLoopbackPort();  // nothing listens there
  DroppingWorker dropping("");                 // takes the request, closes without answer
  FakeWorker draining([](httplib::Server& s) {
    s.Post("/v1/completions", [](const httplib::Request&, httplib::Response& res) {
      res.status = 503;
      res.set_content("{\"error\":{\"message\":\"shutting down\"}}", "application/json");
    });
  });
  auto good = NamedWorker("g");
  const std::string refused = "127.0.0.1:" + std::to_string(closed_port);
  Proxy proxy({refused, dropping.address(), draining.address(), good->address()});
  for (int i = 0; i < 12; ++i) {
    auto r = proxy.Post("{}");
    ASSERT_TRUE(r) << httplib::to_string(r.error());
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(r->body[0], 'g');
  }
  EXPECT_GE(dropping.accepted(), 1);  // the request was sent to it, and lost
  auto errors = [&](const std::string& upstream, const char* kind) {
    return proxy.Metric("specloop_proxy_upstream_errors_total{upstream=\"" + upstream +
                        "\",kind=\"" + kind + "\"}");
  };
  EXPECT_EQ(errors(refused, "connect"), 1);  // then tried last: down_seconds is 30
  EXPECT_GE(errors(dropping.address(), "lost"), 1);
  EXPECT_GE(errors(draining.address(), "unavailable"), 1);
  EXPECT_GE(proxy.Metric("specloop_proxy_retries_total"), 3);
  EXPECT_EQ(proxy.Metric("specloop_proxy_upstream_up{upstream=\"" + refused + "\"}"), 0);
  EXPECT_EQ(proxy.Metric("specloop_proxy_failed_total{reason=\"no_upstream\"}"), 0);
}

TEST(FrontProxy, EveryWorkerDownIsA502AndA503IsRelayedWhenItIsTheLastWord) {
  const std::string refused = "127.0.0.1:" + std::to_string(FreeLoopbackPort());
  {
    Proxy proxy({refused});
    auto r = proxy.Post("{}");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 502);
    EXPECT_NE(r->body.find("\"error\""), std::string::npos) << r->body;
    EXPECT_EQ(proxy.Metric("specloop_proxy_failed_total{reason=\"no_upstream\"}"), 1);
    httplib::Client cli("127.0.0.1", proxy.port());
    auto health = cli.Get("/health");
    ASSERT_TRUE(health);
    EXPECT_EQ(health->status, 503);
  }
  FakeWorker draining([](httplib::Server& s) {
    s.Post("/v1/completions", [](const httplib::Request&, httplib::Response& res) {
      res.status = 503;
      res.set_content("{\"error\":{\"message\":\"shutting down\"}}", "application/json");
    });
  });
  Proxy proxy({refused, draining.address()});
  auto r = proxy.Post("{}");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_NE(r->body.find("shutting down"), std::string::npos);
  // A client's error is the worker's answer, not a reason to ask another worker.
  FakeWorker strict([](httplib::Server& s) {
    s.Post("/v1/completions", [](const httplib::Request&, httplib::Response& res) {
      res.status = 400;
      res.set_content("{\"error\":{\"message\":\"bad\"}}", "application/json");
    });
  });
  Proxy one({strict.address(), draining.address()});
  for (int i = 0; i < 4; ++i) {
    auto bad = one.Post("{}");
    ASSERT_TRUE(bad);
    if (bad->status == 400) {
      EXPECT_EQ(one.Metric("specloop_proxy_retries_total"), 0);  // answered by the first
      return;
    }
  }
  ADD_FAILURE() << "the 400 worker was never asked";
}

// Sends a streamed request through the proxy; `on_event` sees the body as it grows and may
// return false to leave. Returns the transport's result.
httplib::Error Stream(int port, const std::function<bool(const std::string&)>& on_event,
                      std::string* body) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(30);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = "{\"stream\":true}";
  req.headers = {{"Content-Type", "application/json"}};
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    body->append(d, n);
    return on_event(*body);
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  cli.send(req, res, error);
  return error;
}

TEST(FrontProxy, StreamsAreRelayedAsTheyComeAndCutStreamsAreNotSentTwice) {
  // The worker sends its second event only once the client has seen the first: a proxy that
  // buffered the stream would deadlock here (and fail on the read timeout).
  std::mutex mu;
  std::condition_variable cv;
  bool client_saw_first = false;
  FakeWorker streaming([&](httplib::Server& s) {
    s.Post("/v1/completions", [&](const httplib::Request&, httplib::Response& res) {
      res.set_chunked_content_provider("text/event-stream", [&](size_t, httplib::DataSink& sink) {
        const std::string first = "data: 1\n\n";
        sink.write(first.data(), first.size());
        std::unique_lock<std::mutex> lock(mu);
        if (!cv.wait_for(lock, std::chrono::seconds(20), [&] { return client_saw_first; })) {
          return false;
        }
        const std::string rest = "data: 2\n\ndata: [DONE]\n\n";
        sink.write(rest.data(), rest.size());
        sink.done();
        return true;
      });
    });
  });
  {
    Proxy proxy({streaming.address()});
    std::string body;
    const httplib::Error e = Stream(proxy.port(), [&](const std::string& b) {
      if (b.find("data: 1\n\n") != std::string::npos) {
        std::lock_guard<std::mutex> lock(mu);
        client_saw_first = true;
        cv.notify_all();
      }
      return true;
    }, &body);
    EXPECT_EQ(e, httplib::Error::Success);
    EXPECT_EQ(body, "data: 1\n\ndata: 2\n\ndata: [DONE]\n\n");
  }
  // A worker that dies after the first event has reached the client: the client sees the
  // stream end early, and the request is not sent to the other worker.
  client_saw_first = false;
  const auto wait_for_client = [&] {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::seconds(20), [&] { return client_saw_first; });
  };
  DroppingWorker cut(
      "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
      "9\r\ndata: 1\n\n\r\n",
      wait_for_client);
  auto good = NamedWorker("g");
  Proxy proxy({cut.address(), good->address()});
  const auto note_first = [&](const std::string& b) {
    if (b == "data: 1\n\n") {
      std::lock_guard<std::mutex> lock(mu);
      client_saw_first = true;
      cv.notify_all();
    }
    return true;
  };
  int cut_streams = 0;
  for (int i = 0; i < 2; ++i) {  // the workers take turns: the first request meets `cut`
    std::string body;
    const httplib::Error e = Stream(proxy.port(), note_first, &body);
    if (body == "data: 1\n\n") {
      ++cut_streams;
      EXPECT_NE(e, httplib::Error::Success) << "a cut stream must not look complete";
    } else {
      EXPECT_EQ(body[0], 'g') << body;
    }
  }
  EXPECT_EQ(cut_streams, 1);
  EXPECT_EQ(proxy.Metric("specloop_proxy_failed_total{reason=\"cut\"}"), 1);
  EXPECT_EQ(proxy.Metric("specloop_proxy_retries_total"), 0);
}

TEST(FrontProxy, AClientThatLeavesCancelsTheWorkersStream) {
  std::atomic<bool> worker_saw_disconnect{false};
  FakeWorker endless([&](httplib::Server& s) {
    s.Post("/v1/completions", [&](const httplib::Request&, httplib::Response& res) {
      res.set_chunked_content_provider(
          "text/event-stream",
          [](size_t, httplib::DataSink& sink) {
            const std::string event = "data: x\n\n";
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
            return sink.write(event.data(), event.size());
          },
          [&](bool success) {
            if (!success) worker_saw_disconnect.store(true);
          });
    });
  });
  Proxy proxy({endless.address()});
  std::string body;
  Stream(proxy.port(), [](const std::string& b) { return b.size() < 64; }, &body);
  EXPECT_GE(body.size(), 64u);
  // Wait for the event: the worker's stream ends unsuccessfully once the proxy lets go.
  for (int i = 0; i < 1000 && !worker_saw_disconnect.load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(worker_saw_disconnect.load()) << "the worker kept streaming to nobody";
}

TEST(FrontProxy, BadUpstreamIsAConfigurationError) {
  for (const std::vector<std::string>& ups :
       {std::vector<std::string>{}, {"localhost"}, {"127.0.0.1:x"}, {":80"}, {"h:70000"}}) {
    FrontProxyOptions o;
    o.port = 0;
    o.upstreams = ups;
    FrontProxy proxy(o);
    int port = 0;
    EXPECT_TRUE(proxy.Bind(&port).IsInvalidArgument()) << (ups.empty() ? "none" : ups[0]);
  }
}

}  // namespace
}  // namespace specloop
