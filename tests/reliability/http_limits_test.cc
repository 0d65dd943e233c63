// The HTTP API's security limits against a real `specloop serve`: default bind to loopback,
// the API key (401 without it, open probes), body size, prompt tokens, max_tokens, the queue
// limit (429) and slow clients (disconnected after the read timeout, others keep being served).
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>

#include <nlohmann/json.hpp>

#include "serve/api_key.h"
#include "tests/reliability/reliability_util.h"

namespace specloop {
namespace reliability {
namespace {

const char kKey[] = "sk-test-0123456789abcdef";

httplib::Headers Bearer(const std::string& key) { return {{"Authorization", "Bearer " + key}}; }

TEST(BearerToken, MatchesOnlyTheExactKey) {
  EXPECT_TRUE(BearerTokenMatches("Bearer abc", "abc"));
  EXPECT_TRUE(BearerTokenMatches("bearer abc", "abc"));
  for (const char* bad : {"", "Bearer", "Bearer ", "Bearer ab", "Bearer abcd", "Bearer abd",
                          "Basic abc", "Bearer  abc", "abc", "Bearer ABC"}) {
    EXPECT_FALSE(BearerTokenMatches(bad, "abc")) << bad;
  }
  EXPECT_FALSE(BearerTokenMatches("Bearer ", ""));  // an empty key never matches
}

TEST(HttpLimits, ApiKeyBodyPromptAndMaxTokensLimits) {
  ServeProcess serve({"--max-body-bytes", "4096", "--max-prompt-tokens", "24", "--max-tokens",
                      "40", "--k", "0"},
                     {"env", std::string("SPECLOOP_API_KEY=") + kKey});
  ASSERT_TRUE(serve.Start()) << serve.Output();
  const int port = serve.port();
  EXPECT_EQ(serve.host(), "127.0.0.1");  // the default bind address
  EXPECT_NE(serve.Output().find("api key on"), std::string::npos);
  EXPECT_EQ(serve.Output().find(kKey), std::string::npos);  // never printed

  // 401 without the key, with a wrong one, or another scheme; the body is an OpenAI error.
  std::string body;
  int unauthorized = 0;
  for (const httplib::Headers& h :
       {httplib::Headers{}, Bearer("sk-wrong"), Bearer(std::string(kKey) + "x"),
        httplib::Headers{{"Authorization", std::string("Basic ") + kKey}}}) {
    EXPECT_EQ(Post(port, "/v1/completions", CompletionBody(0), h, &body), 401);
    ++unauthorized;
    const auto j = nlohmann::json::parse(body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << body;
    EXPECT_EQ(j["error"]["code"], "invalid_api_key") << body;
  }
  EXPECT_EQ(Get(port, "/v1/models"), 401);
  ++unauthorized;
  EXPECT_EQ(Post(port, "/v1/nonexistent", "{}"), 401);  // unknown routes are not revealed
  ++unauthorized;
  // Probes, scrapes and the status page stay open.
  EXPECT_EQ(Get(port, "/health"), 200);
  EXPECT_EQ(Get(port, "/metrics"), 200);
  EXPECT_EQ(Get(port, "/status.json"), 200);
  // With the key.
  EXPECT_EQ(Get(port, "/v1/models", Bearer(kKey)), 200);
  EXPECT_EQ(Post(port, "/v1/completions", CompletionBody(0), Bearer(kKey), &body), 200) << body;

  // Body size: 413 beyond --max-body-bytes.
  const std::string big = "{\"prompt\":\"" + std::string(5000, 'a') + "\",\"max_tokens\":1}";
  EXPECT_EQ(Post(port, "/v1/completions", big, Bearer(kKey), &body), 413) << body;
  // Prompt tokens: 400 beyond --max-prompt-tokens, with its own code.
  std::string words;
  for (int i = 0; i < 40; ++i) words += "the dog ran home. ";
  EXPECT_EQ(Post(port, "/v1/completions", "{\"prompt\":\"" + words + "\",\"max_tokens\":1}",
                 Bearer(kKey), &body),
            400);
  EXPECT_EQ(nlohmann::json::parse(body)["error"]["code"], "prompt_too_long") << body;
  // max_tokens: 400 beyond --max-tokens, the limit itself is fine.
  EXPECT_EQ(Post(port, "/v1/completions", CompletionBody(1, 41), Bearer(kKey), &body), 400);
  EXPECT_EQ(nlohmann::json::parse(body)["error"]["param"], "max_tokens") << body;
  EXPECT_EQ(Post(port, "/v1/completions", CompletionBody(1, 40), Bearer(kKey), &body), 200)
      << body;

  // Every refusal is counted by status.
  std::string metrics;
  ASSERT_EQ(HttpGet(port, "/metrics", &metrics), 200);
  EXPECT_EQ(MetricValue(metrics, "specloop_http_errors_total{code=\"401\"}"), unauthorized);
  EXPECT_EQ(MetricValue(metrics, "specloop_http_errors_total{code=\"413\"}"), 1);
  EXPECT_EQ(MetricValue(metrics, "specloop_http_errors_total{code=\"400\"}"), 2);
  EXPECT_EQ(Get(port, "/health"), 200);
}

TEST(HttpLimits, FullQueueAnswers429AndTheServerKeepsServing) {
  ServeProcess serve({"--max-batch", "1", "--max-waiting", "1", "--k", "0"});
  ASSERT_TRUE(serve.Start()) << serve.Output();
  const int port = serve.port();
  // 8 concurrent long requests against room for 2 (1 running + 1 waiting).
  const std::string body =
      "{\"prompt\":\"Once upon a time\",\"max_tokens\":200,\"ignore_eos\":true}";
  std::vector<int> status(8, 0);
  std::vector<std::thread> clients;
  for (int i = 0; i < 8; ++i) {
    clients.emplace_back([&, i] { status[i] = Post(port, "/v1/completions", body); });
  }
  for (std::thread& t : clients) t.join();
  int ok = 0, busy = 0;
  for (int st : status) {
    EXPECT_TRUE(st == 200 || st == 429) << st;
    ok += st == 200;
    busy += st == 429;
  }
  EXPECT_GE(ok, 1);
  EXPECT_GE(busy, 1);
  EXPECT_EQ(ScrapeMetric(port, "specloop_http_errors_total{code=\"429\"}"), busy);
  // Once the queue drains, requests are served again.
  EXPECT_EQ(Post(port, "/v1/completions", CompletionBody(2)), 200);
}

// A TCP connection to 127.0.0.1:port that sends `text` and then nothing.
int StalledConnection(int port, const std::string& text) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      send(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    close(fd);
    return -1;
  }
  return fd;
}

// Seconds until the server closes `fd` (recv returns 0 or an error); -1 if it stays open
// longer than `limit`.
double SecondsUntilClosed(int fd, double limit) {
  timeval tv = {};
  tv.tv_sec = static_cast<time_t>(limit);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  const auto start = Clock::now();
  char buf[256];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    const double t = std::chrono::duration<double>(Clock::now() - start).count();
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return t;
    if (n < 0 && errno != EINTR) return -1;  // timed out
    if (t > limit) return -1;
  }
}

TEST(HttpLimits, StalledClientsAreDisconnectedAndDoNotBlockOthers) {
  ServeProcess serve(
      {"--read-timeout", "2", "--keep-alive-timeout", "2", "--http-threads", "8", "--k", "0"});
  ASSERT_TRUE(serve.Start()) << serve.Output();
  const int port = serve.port();
  // Four clients stall: two mid-headers, two mid-body (Content-Length promised, not sent).
  std::vector<int> stalled = {
      StalledConnection(port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"),
      StalledConnection(port, "GET /health HTTP/1.1\r\nHo"),
      StalledConnection(port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                              "application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\":"),
      StalledConnection(port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
                              "50\r\n\r\n")};
  for (int fd : stalled) ASSERT_GE(fd, 0);
  const auto start = Clock::now();
  // Meanwhile other clients are answered at once, not after the stalled ones time out.
  for (int i = 0; i < 3; ++i) {
    std::string body;
    EXPECT_EQ(Post(port, "/v1/completions", CompletionBody(i, 4), {}, &body, 10), 200) << body;
  }
  EXPECT_EQ(HttpGet(port, "/health"), 200);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 1.9);
  // And the stalled ones are dropped: a read times out (2 s), the request is abandoned, and
  // the connection then idles out as any keep-alive connection (2 s).
  for (size_t i = 0; i < stalled.size(); ++i) {
    const double t = SecondsUntilClosed(stalled[i], 10);
    EXPECT_GE(t, 0) << "stalled connection " << i << " was kept open";
    EXPECT_LT(t, 6) << "stalled connection " << i;
    close(stalled[i]);
  }
  EXPECT_EQ(HttpGet(port, "/health"), 200);
}

}  // namespace
}  // namespace reliability
}  // namespace specloop
