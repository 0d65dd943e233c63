// Loopback tests of the whole serving stack in-process: HttpServer + Scheduler + SampleLogger
// on the fixture models, a free port on 127.0.0.1, stopped by the fixture even on failure.
#include "serve/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <c10/core/InferenceMode.h>

#include "common/base/half.h"
#include "buffer/replay_logger.h"
#include "serve/sample_logger.h"
#include "tests/serve/buffer_records.h"
#include "tests/serve/test_util.h"

namespace specloop {
namespace {

using json = nlohmann::json;
using serve_test::TempDir;

// One serving stack on a free loopback port; stopped in the destructor.
class TestServer {
 public:
  explicit TestServer(const std::string& buffer_dir = "", int max_batch = 16, int k = -1,
                      std::shared_ptr<const ChatTemplate> chat_template = nullptr,
                      double kv_cache_mb = 0) {
    EXPECT_TRUE(LlamaModel::Load(serve_test::TargetDir(), {}, &target_).ok());
    std::unique_ptr<LlamaModel> draft;
    EXPECT_TRUE(LlamaModel::Load(serve_test::DraftDir(), {}, &draft).ok());
    EXPECT_TRUE(Tokenizer::Load(serve_test::TargetDir(), &tokenizer_).ok());
    EXPECT_TRUE(ServingMetrics::Create(ServingMetricsOptions(), &metrics_).ok());
    if (!buffer_dir.empty()) {
      EXPECT_TRUE(
          ReplayLogger::Open(BufferOptions(), LoggerOptions(), buffer_dir, &logger_).ok());
      SampleLoggerOptions so;
      so.target_id = "target-6m-test";
      sample_logger_ = std::make_unique<SampleLogger>(logger_.get(), so);
    }
    SchedulerOptions o;
    o.max_batch = max_batch;
    o.k = k;
    o.kv_cache_mb = kv_cache_mb;
    scheduler_ = std::make_unique<Scheduler>(target_.get(), std::move(draft), tokenizer_.get(),
                                             metrics_.get(), sample_logger_.get(), o);
    EXPECT_TRUE(scheduler_->Start().ok());
    HttpServerOptions ho;
    ho.port = 0;
    ho.model_name = "target-6m";
    ho.target_id = "target-6m-test";
    ho.chat_template = std::move(chat_template);
    server_ = std::make_unique<HttpServer>(ho, scheduler_.get(), metrics_.get(),
                                           tokenizer_.get(), &target_->config(), logger_.get(),
                                           sample_logger_.get());
    EXPECT_TRUE(server_->Bind(&port_).ok());
    thread_ = std::thread([this] { (void)server_->Run(); });
  }
  ~TestServer() { Shutdown(); }

  // Stops everything; the replay buffer (if any) is closed and complete afterwards.
  void Shutdown() {
    if (!server_) return;
    server_->Stop();
    thread_.join();
    scheduler_->Stop();
    sample_logger_.reset();
    if (logger_) {
      EXPECT_TRUE(logger_->Close().ok());
    }
    server_.reset();
  }

  std::unique_ptr<httplib::Client> Client() const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port_);
    c->set_read_timeout(120, 0);
    return c;
  }
  int port() const { return port_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }

 private:
  std::unique_ptr<LlamaModel> target_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ServingMetrics> metrics_;
  std::unique_ptr<ReplayLogger> logger_;
  std::unique_ptr<SampleLogger> sample_logger_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
  int port_ = 0;
};

// The first `n` prompts of a domain's prompt file.
std::vector<std::string> Prompts(const std::string& domain, size_t n) {
  std::ifstream in(serve_test::Shared() + "/prompts/" + domain + ".jsonl");
  std::vector<std::string> out;
  std::string line;
  while (out.size() < n && std::getline(in, line)) {
    out.push_back(json::parse(line)["prompt"].get<std::string>().substr(0, 200));
  }
  return out;
}

// The JSON chunks of a server-sent event stream: "data: {...}\n\n" ... "data: [DONE]\n\n";
// *done_marker is set when [DONE] ends it.
std::vector<json> SseChunks(const std::string& b, bool* done_marker) {
  std::vector<json> chunks;
  size_t pos = 0;
  while (pos < b.size()) {
    size_t end = b.find("\n\n", pos);
    if (end == std::string::npos) break;
    std::string event = b.substr(pos, end - pos);
    pos = end + 2;
    EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
    const std::string data = event.substr(6);
    if (data == "[DONE]") {
      *done_marker = true;
      EXPECT_EQ(pos, b.size()) << "events after [DONE]";
      break;
    }
    chunks.push_back(json::parse(data));
  }
  return chunks;
}

struct Completion {
  int status = 0;
  std::string text, finish_reason;
  json body;  // the response (non-streaming) or the last chunk (streaming)
  bool done_marker = false;
};

Completion Complete(httplib::Client& c, json req) {
  Completion out;
  auto res = c.Post("/v1/completions", req.dump(), "application/json");
  if (!res) return out;
  out.status = res->status;
  if (!req.value("stream", false) || res->status != 200) {
    out.body = json::parse(res->body, nullptr, false);
    if (res->status == 200) {
      out.text = out.body["choices"][0]["text"];
      out.finish_reason = out.body["choices"][0]["finish_reason"];
    }
    return out;
  }
  for (json& chunk : SseChunks(res->body, &out.done_marker)) {
    out.text += chunk["choices"][0]["text"].get<std::string>();
    if (!chunk["choices"][0]["finish_reason"].is_null()) {
      out.finish_reason = chunk["choices"][0]["finish_reason"];
      out.body = chunk;
    }
  }
  return out;
}

json Greedy(const std::string& prompt, int max_tokens, const std::string& domain) {
  return {{"model", "target-6m"}, {"prompt", prompt}, {"max_tokens", max_tokens},
          {"temperature", 0}, {"domain", domain}};
}

class HttpServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new TestServer(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static TestServer* server_;
};
TestServer* HttpServerTest::server_ = nullptr;

TEST_F(HttpServerTest, GreedyCompletionsEqualSpecloopGenerate) {
  auto c = server_->Client();
  for (const std::string domain : {"prose", "python", "c"}) {
    for (const std::string& prompt : Prompts(domain, 2)) {
      const Completion got = Complete(*c, Greedy(prompt, 48, domain));
      ASSERT_EQ(got.status, 200) << got.body.dump();
      std::string out;
      ASSERT_EQ(serve_test::RunCommand(std::string(SPECLOOP_BINARY) + " generate --model " +
                                           serve_test::TargetDir() + " --prompt " +
                                           serve_test::ShellQuote(prompt) +
                                           " --max-tokens 48 --temperature 0 --json",
                                       &out),
                0);
      const json want = json::parse(out);
      EXPECT_EQ(got.text, want["text"].get<std::string>()) << domain << ": " << prompt;
      EXPECT_EQ(got.body["usage"]["completion_tokens"].get<size_t>(), want["tokens"].size());
      EXPECT_EQ(got.body["usage"]["prompt_tokens"].get<size_t>(), want["prompt_tokens"].size());
      const json& spec = got.body["speculative"];
      EXPECT_GE(spec["drafted"].get<int>(), spec["accepted"].get<int>());
      EXPECT_EQ(spec["draft_version"], 0);
      EXPECT_TRUE(spec.contains("acceptance_rate"));
    }
  }
}

TEST_F(HttpServerTest, StreamingDeliversTheSameTextAsNonStreaming) {
  auto c = server_->Client();
  for (const std::string domain : {"legal", "docs"}) {
    for (const std::string& prompt : Prompts(domain, 2)) {
      json req = Greedy(prompt, 40, domain);
      const Completion plain = Complete(*c, req);
      req["stream"] = true;
      const Completion streamed = Complete(*c, req);
      ASSERT_EQ(plain.status, 200);
      ASSERT_EQ(streamed.status, 200);
      EXPECT_TRUE(streamed.done_marker);
      EXPECT_EQ(streamed.text, plain.text);
      EXPECT_EQ(streamed.finish_reason, plain.finish_reason);
      EXPECT_EQ(streamed.body["usage"], plain.body["usage"]);
    }
  }
}

TEST_F(HttpServerTest, StopSequencesCutTheText) {
  auto c = server_->Client();
  const std::string prompt = Prompts("prose", 1)[0];
  const Completion full = Complete(*c, Greedy(prompt, 48, "prose"));
  ASSERT_EQ(full.status, 200);
  ASSERT_GT(full.text.size(), 30u);
  const std::string stop = full.text.substr(20, 4);
  json req = Greedy(prompt, 48, "prose");
  req["stop"] = {stop, "never-appears"};
  for (bool stream : {false, true}) {
    req["stream"] = stream;
    const Completion cut = Complete(*c, req);
    ASSERT_EQ(cut.status, 200);
    EXPECT_EQ(cut.text, full.text.substr(0, full.text.find(stop))) << "stream " << stream;
    EXPECT_EQ(cut.finish_reason, "stop");
  }
}

TEST_F(HttpServerTest, SixteenConcurrentClientsGetCorrectCompleteAnswers) {
  std::vector<std::pair<std::string, std::string>> jobs;  // domain, prompt
  for (const std::string domain : {"prose", "python", "c", "legal", "docs"}) {
    for (const std::string& p : Prompts(domain, 4)) jobs.push_back({domain, p});
  }
  jobs.resize(16);
  // What each prompt gives alone.
  std::vector<Completion> alone(16), together(16);
  auto c = server_->Client();
  for (int i = 0; i < 16; ++i) alone[i] = Complete(*c, Greedy(jobs[i].second, 32, jobs[i].first));
  std::vector<std::thread> threads;
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&, i] {
      auto ci = server_->Client();
      json req = Greedy(jobs[i].second, 32, jobs[i].first);
      req["stream"] = i % 2 == 1;
      together[i] = Complete(*ci, req);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 16; ++i) {
    ASSERT_EQ(together[i].status, 200) << i;
    EXPECT_EQ(together[i].text, alone[i].text) << i;
    EXPECT_EQ(together[i].finish_reason, alone[i].finish_reason) << i;
    EXPECT_EQ(together[i].body["usage"]["completion_tokens"],
              alone[i].body["usage"]["completion_tokens"]);
  }
  // The requests were decoded in shared batches.
  auto m = c->Get("/metrics");
  ASSERT_TRUE(m);
  auto value = [&](const std::string& name) {
    const size_t p = m->body.find("\n" + name + " ");
    return p == std::string::npos ? -1.0 : std::stod(m->body.substr(p + name.size() + 2));
  };
  EXPECT_GT(value("specloop_batch_size_sum") / value("specloop_batch_size_count"), 1.5);
}

TEST_F(HttpServerTest, BadInputGets4xxAndTheServerKeepsServing) {
  auto c = server_->Client();
  const std::string long_prompt(8000, 'a');
  struct Case {
    std::string body;
    int status;
  } cases[] = {
      {"{\"prompt\": \"hi\", ", 400},                            // malformed JSON
      {"not json at all", 400},
      {R"({"prompt": 12})", 400},                                 // wrong types
      {R"({"prompt": "hi", "max_tokens": "many"})", 400},
      {R"({"prompt": "hi", "temperature": [1]})", 400},
      {R"({"prompt": "hi", "stream": 1})", 400},
      {R"({"prompt": "hi", "max_tokens": -5})", 400},            // negative max_tokens
      {"{\"prompt\": \"" + long_prompt + "\"}", 400},            // over the context limit
      {R"({"prompt": "hi", "model": "no-such-model"})", 404},    // unknown model
  };
  for (const Case& k : cases) {
    auto res = c->Post("/v1/completions", k.body, "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, k.status) << k.body.substr(0, 60);
    const json j = json::parse(res->body, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << res->body;
    EXPECT_FALSE(j["error"]["message"].get<std::string>().empty());
  }
  auto r404 = c->Get("/v1/nothing");
  ASSERT_TRUE(r404);
  EXPECT_EQ(r404->status, 404);
  auto big = c->Post("/v1/completions", std::string(2 << 20, ' '), "application/json");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 413);
  // Still serving.
  auto health = c->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  const Completion ok = Complete(*c, Greedy("And God said", 8, "prose"));
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(ok.body["usage"]["completion_tokens"], 8);
  auto models = c->Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "target-6m");
}

// With --kv-cache-mb, a request whose prompt and max_tokens could never fit the pool gets a
// 400 naming max_tokens; requests that fit are served.
TEST(HttpServerKvCache, ARequestLargerThanTheKvCacheGets400) {
  TestServer server("", 16, -1, nullptr, /*kv_cache_mb=*/2);
  auto c = server.Client();
  const Completion big = Complete(*c, Greedy("And God said", 1000, "prose"));
  EXPECT_EQ(big.status, 400);
  EXPECT_EQ(big.body["error"]["code"], "context_length_exceeded") << big.body.dump();
  EXPECT_EQ(big.body["error"]["param"], "max_tokens");
  const Completion ok = Complete(*c, Greedy("And God said", 8, "prose"));
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(ok.body["usage"]["completion_tokens"], 8);
}

TEST_F(HttpServerTest, MetricsPassPromtool) {
  // A fixed k, so the acceptance series exist (adaptive k may decode target-6m plainly).
  TestServer server("", 16, /*k=*/4);
  auto c = server.Client();
  Complete(*c, Greedy("In the beginning", 16, "prose"));
  auto m = c->Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  for (const char* want : {"specloop_acceptance_rate{domain=\"prose\",window=\"short\"}",
                           "specloop_acceptance_drift{domain=\"prose\"}",
                           "specloop_generated_tokens_total{domain=\"prose\"}",
                           "specloop_forward_duration_seconds_bucket{model=\"target\",le=",
                           "specloop_draft_version 0"}) {
    EXPECT_NE(m->body.find(want), std::string::npos) << want;
  }
  TempDir dir;
  std::ofstream(dir.path() + "/m.txt") << m->body;
  std::string out;
  EXPECT_EQ(serve_test::RunCommand("promtool check metrics < " + dir.path() + "/m.txt 2>&1", &out),
            0)
      << out;
}

// Keep-alive clients (the OpenAI SDKs) are not held up by Nagle's algorithm: the server sends
// each response in several writes (headers, then body), and without TCP_NODELAY every write
// after the first waited for the client's delayed ACK, >= 40 ms on Linux. A one-token
// completion takes a few ms; the median of requests 5-12 on one connection (the first few
// ride TCP's quick-ack at connection start) is taken. Before the fix: 44 ms; after: ~4 ms.
TEST_F(HttpServerTest, KeepAliveRequestsAreNotDelayedByNagle) {
  auto c = server_->Client();
  c->set_keep_alive(true);
  c->set_tcp_nodelay(true);  // the client's own writes are not what is measured
  const std::string body = Greedy("Once upon a time", 1, "prose").dump();
  std::vector<double> ms;
  for (int i = 0; i < 12; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = c->Post("/v1/completions", body, "application/json");
    ASSERT_TRUE(r && r->status == 200);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                     .count());
  }
  std::vector<double> later(ms.begin() + 4, ms.end());
  std::sort(later.begin(), later.end());
  EXPECT_LT(later[later.size() / 2], 30.0) << "median of requests 5-12 on one connection";
}

TEST_F(HttpServerTest, ClientDisconnectCancelsAStream) {
  auto c = server_->Client();
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.set_header("Content-Type", "application/json");
  req.body = json{{"prompt", "And it came to pass"}, {"max_tokens", 900}, {"ignore_eos", true},
                  {"stream", true}, {"domain", "cancel-test"}}
                 .dump();
  int chunks = 0;
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 2; };
  c->send(req);  // aborted by the receiver
  // The scheduler retires the request as cancelled long before 900 tokens.
  auto m = server_->Client();
  bool cancelled = false;
  for (int i = 0; i < 100 && !cancelled; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    auto res = m->Get("/metrics");
    cancelled = res && res->body.find("specloop_requests_total{domain=\"cancel-test\","
                                      "finish_reason=\"cancelled\"} 1") != std::string::npos;
  }
  EXPECT_TRUE(cancelled);
}

// ---- /v1/chat/completions ----------------------------------------------------------------

struct ChatReply {
  int status = 0;
  std::string content, finish_reason;
  json body;  // the response (non-streaming) or the last chunk (streaming)
  int chunks = 0;
  bool role_first = false, done_marker = false;
};

ChatReply Chat(httplib::Client& c, const json& req) {
  ChatReply out;
  auto res = c.Post("/v1/chat/completions", req.dump(), "application/json");
  if (!res) return out;
  out.status = res->status;
  if (!req.value("stream", false) || res->status != 200) {
    out.body = json::parse(res->body, nullptr, false);
    if (res->status == 200) {
      EXPECT_EQ(out.body["object"], "chat.completion");
      EXPECT_EQ(out.body["choices"][0]["message"]["role"], "assistant");
      out.content = out.body["choices"][0]["message"]["content"];
      out.finish_reason = out.body["choices"][0]["finish_reason"];
    }
    return out;
  }
  for (const json& chunk : SseChunks(res->body, &out.done_marker)) {
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    const json& delta = chunk["choices"][0]["delta"];
    if (out.chunks++ == 0) {
      out.role_first = delta.value("role", "") == "assistant";
    } else {
      EXPECT_FALSE(delta.contains("role"));
    }
    if (delta.contains("content")) out.content += delta["content"].get<std::string>();
    if (!chunk["choices"][0]["finish_reason"].is_null()) {
      out.finish_reason = chunk["choices"][0]["finish_reason"];
      out.body = chunk;
    }
  }
  return out;
}

json ChatMessages() {
  return json::array({{{"role", "system"}, {"content", "You write about the Bible."}},
                      {{"role", "user"}, {"content", "In the beginning"}}});
}

json GreedyChat(int max_tokens) {
  return {{"model", "target-6m"}, {"messages", ChatMessages()}, {"max_tokens", max_tokens},
          {"temperature", 0}, {"domain", "prose"}};
}

double MetricValue(httplib::Client& c, const std::string& series) {
  auto m = c.Get("/metrics");
  if (!m) return -1;
  const size_t p = m->body.find("\n" + series + " ");
  return p == std::string::npos ? 0.0 : std::stod(m->body.substr(p + series.size() + 2));
}

// The fixture model has no chat template: the default one renders "ROLE: content" lines and
// "assistant:", so a chat request decodes exactly as the completion of that text.
TEST_F(HttpServerTest, ChatCompletionsDecodeTheRenderedPrompt) {
  auto c = server_->Client();
  const ChatReply chat = Chat(*c, GreedyChat(32));
  ASSERT_EQ(chat.status, 200) << chat.body.dump();
  EXPECT_EQ(chat.body["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(chat.body["model"], "target-6m");
  const Completion plain = Complete(
      *c, Greedy("system: You write about the Bible.\nuser: In the beginning\nassistant:", 32,
                 "prose"));
  ASSERT_EQ(plain.status, 200);
  EXPECT_FALSE(chat.content.empty());
  EXPECT_EQ(chat.content, plain.text);
  EXPECT_EQ(chat.finish_reason, plain.finish_reason);
  EXPECT_EQ(chat.body["usage"], plain.body["usage"]);
  const json& spec = chat.body["speculative"];
  EXPECT_GE(spec["drafted"].get<int>(), spec["accepted"].get<int>());
  EXPECT_TRUE(spec.contains("acceptance_rate"));
  EXPECT_EQ(spec["draft_version"], 0);
  // Text parts join like a string; max_completion_tokens wins over max_tokens.
  json req = GreedyChat(32);
  req["messages"][1]["content"] = json::array({{{"type", "text"}, {"text", "In the"}},
                                               {{"type", "text"}, {"text", "beginning"}}});
  req["max_completion_tokens"] = 5;
  const ChatReply parts = Chat(*c, req);
  ASSERT_EQ(parts.status, 200) << parts.body.dump();
  EXPECT_EQ(parts.body["usage"]["completion_tokens"], 5);
  EXPECT_EQ(parts.finish_reason, "length");
  const Completion joined = Complete(
      *c, Greedy("system: You write about the Bible.\nuser: In the\nbeginning\nassistant:", 5,
                 "prose"));
  EXPECT_EQ(parts.content, joined.text);
  EXPECT_EQ(parts.body["usage"], joined.body["usage"]);
}

TEST_F(HttpServerTest, ChatStreamingSendsTheRoleThenTheSameText) {
  auto c = server_->Client();
  json req = GreedyChat(40);
  const ChatReply plain = Chat(*c, req);
  req["stream"] = true;
  const ChatReply streamed = Chat(*c, req);
  ASSERT_EQ(plain.status, 200);
  ASSERT_EQ(streamed.status, 200);
  EXPECT_TRUE(streamed.role_first);
  EXPECT_TRUE(streamed.done_marker);
  EXPECT_GT(streamed.chunks, 3);
  EXPECT_EQ(streamed.content, plain.content);
  EXPECT_EQ(streamed.finish_reason, plain.finish_reason);
  EXPECT_EQ(streamed.body["usage"], plain.body["usage"]);
  EXPECT_EQ(streamed.body["choices"][0]["delta"], json::object());
  EXPECT_TRUE(streamed.body["speculative"].contains("accepted"));
}

TEST_F(HttpServerTest, ChatStopSequencesCutTheText) {
  auto c = server_->Client();
  const ChatReply full = Chat(*c, GreedyChat(48));
  ASSERT_EQ(full.status, 200);
  ASSERT_GT(full.content.size(), 24u) << full.content;
  const std::string stop = full.content.substr(16, 4);
  json req = GreedyChat(48);
  req["stop"] = stop;
  for (bool stream : {false, true}) {
    req["stream"] = stream;
    const ChatReply cut = Chat(*c, req);
    ASSERT_EQ(cut.status, 200);
    EXPECT_EQ(cut.content, full.content.substr(0, full.content.find(stop))) << "stream " << stream;
    EXPECT_EQ(cut.finish_reason, "stop");
  }
}

TEST_F(HttpServerTest, BadChatRequestsGet400AndAreCounted) {
  auto c = server_->Client();
  const std::string series = "specloop_http_errors_total{code=\"400\"}";
  const double before = MetricValue(*c, series);
  const json user = {{"role", "user"}, {"content", "hi"}};
  const std::vector<std::pair<json, std::string>> cases = {
      {json::object(), "messages is required"},
      {{{"messages", json::array()}}, "must not be empty"},
      {{{"messages", "hi"}}, "must be an array"},
      {{{"messages", {"hi"}}}, "must be an object"},
      {{{"messages", {{{"content", "hi"}}}}}, "role must be a string"},
      {{{"messages", {{{"role", "wizard"}, {"content", "hi"}}}}}, "'wizard' is not supported"},
      {{{"messages", {{{"role", "tool"}, {"content", "42"}}}}}, "no tool calling"},
      {{{"messages", {{{"role", "user"}, {"content", 7}}}}}, "content must be"},
      {{{"messages", {{{"role", "user"}}}}}, "content is required"},
      {{{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}}},
       "text part"},
      {{{"messages", {{{"role", "user"}, {"content", {{{"type", 5}, {"text", "hi"}}}}}}}},
       "text part"},
      {{{"messages", {{{"role", "assistant"}, {"content", "x"}, {"tool_calls", {{{"id", "1"}}}}}}}},
       "tool calling is not supported"},
      {{{"messages", {user}}, {"tools", {{{"type", "function"}}}}}, "tools are not supported"},
      {{{"messages", {user}}, {"response_format", {{"type", "json_object"}}}}, "response_format"},
      {{{"messages", {user}}, {"response_format", {{"type", 1}}}}, "response_format"},
      {{{"messages", {user}}, {"max_completion_tokens", -1}}, "max_completion_tokens"},
      {{{"messages", {user}}, {"temperature", "hot"}}, "temperature"},
      {{{"messages", {user}}, {"logprobs", true}, {"top_logprobs", 21}}, "top_logprobs"},
      {{{"messages", {user}}, {"chat_template_kwargs", {{"messages", 1}}}}, "may not set"},
  };
  for (const auto& [body, want] : cases) {
    auto res = c->Post("/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400) << body.dump();
    const json j = json::parse(res->body, nullptr, false);
    ASSERT_TRUE(j.contains("error")) << res->body;
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    EXPECT_NE(j["error"]["message"].get<std::string>().find(want), std::string::npos)
        << body.dump() << " -> " << j["error"]["message"];
  }
  auto bad_json = c->Post("/v1/chat/completions", "{\"messages\": [", "application/json");
  ASSERT_TRUE(bad_json);
  EXPECT_EQ(bad_json->status, 400);
  auto unknown = c->Post("/v1/chat/completions",
                         json{{"model", "gpt-9"}, {"messages", {user}}}.dump(),
                         "application/json");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
  EXPECT_EQ(MetricValue(*c, series), before + static_cast<double>(cases.size()) + 1);
  // Still serving.
  EXPECT_EQ(Chat(*c, GreedyChat(4)).status, 200);
}

// A model's own template: Mistral's raises on roles that do not alternate (a 400 with the
// template's message), and writes BOS itself, which the prompt then holds once.
TEST(HttpServerChatTemplate, TemplateErrorsAre400AndBosIsNotDoubled) {
  const std::string mistral =
      "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
      "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
      "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}"
      "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' "
      "%}{{ message['content'] + eos_token + ' ' }}{% endif %}{% endfor %}";
  std::unique_ptr<ChatTemplate> t;
  ASSERT_TRUE(ChatTemplate::Compile(mistral, {{"bos_token", "<s>"}, {"eos_token", "</s>"}}, &t)
                  .ok());
  TestServer server("", 16, -1, std::move(t));
  auto c = server.Client();
  json req = {{"messages", {{{"role", "user"}, {"content", "a"}}, {{"role", "user"}, {"content", "b"}}}},
              {"max_tokens", 4}};
  auto res = c->Post("/v1/chat/completions", req.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  const json err = json::parse(res->body);
  EXPECT_EQ(err["error"]["code"], "chat_template_error");
  EXPECT_NE(err["error"]["message"].get<std::string>().find("Conversation roles must alternate"),
            std::string::npos)
      << res->body;
  req["messages"] = {{{"role", "user"}, {"content", "In the beginning"}}};
  req["temperature"] = 0;
  const ChatReply ok = Chat(*c, req);
  ASSERT_EQ(ok.status, 200) << ok.body.dump();
  // BOS once, then the rest of the rendered text: "<s>" not also read as text.
  const size_t rest = server.tokenizer().Encode("[INST] In the beginning [/INST]").size();
  EXPECT_EQ(ok.body["usage"]["prompt_tokens"], static_cast<int>(rest + 1));
  const Completion plain =
      Complete(*c, Greedy("[INST] In the beginning [/INST]", 4, "default"));
  EXPECT_EQ(ok.content, plain.text);
}

// Logging: every finished request (max_tokens, EOS, stop string, streaming) becomes one record
// whose steps follow the Record convention: for greedy requests the target's top-1 at each
// verified position is the token the sequence holds there. Before them, the prompt positions
// the prefill computed (all of a new prompt; past the cached prefix when the prompt comes
// again) carry the target's distribution there, each as a step with no draft (k = 0).
TEST(HttpServerLogging, EveryFinishedRequestBecomesARecord) {
  TempDir buffer;
  int requests = 0;
  {
    TestServer server(buffer.path());
    auto c = server.Client();
    for (const std::string domain : {"prose", "python"}) {
      for (const std::string& p : Prompts(domain, 2)) {
        json req = Greedy(p, 24, domain);
        ASSERT_EQ(Complete(*c, req).status, 200);
        req["stream"] = true;
        req["stop"] = {"e"};  // stops early on almost any text
        const Completion s = Complete(*c, req);
        ASSERT_EQ(s.status, 200);
        requests += 2;
      }
    }
    ASSERT_EQ(Complete(*c, {{"prompt", "x"}, {"model", "bad"}}).status, 404);  // not logged
    server.Shutdown();
  }
  const std::vector<Record> records = serve_test::ReadRecords(buffer.path());
  ASSERT_EQ(static_cast<int>(records.size()), requests);
  std::unique_ptr<LlamaModel> target;
  ASSERT_TRUE(LlamaModel::Load(serve_test::TargetDir(), {}, &target).ok());
  int checked = 0, prompt_rows = 0, again = 0;
  for (size_t n = 0; n < records.size(); ++n) {
    const Record& r = records[n];
    EXPECT_EQ(r.target_id, "target-6m-test");
    EXPECT_EQ(r.top_k, 64u);
    ASSERT_FALSE(r.steps.empty());
    EXPECT_EQ(ValidateRecord(r), "");
    // The prompt's rows: consecutive positions up to the prompt's last, first, each the
    // target's log-softmax at that position (fp16 log-probs).
    size_t step = 0;  // r.steps[0, step): the prompt's rows
    at::Tensor logprobs;
    {
      c10::InferenceMode guard;
      KVCache cache = target->NewCache(r.prompt_len);
      logprobs = at::log_softmax(
          target->Forward({ForwardInput{&cache,
                                        {r.tokens.begin(), r.tokens.begin() + (r.prompt_len - 1)},
                                        true, {}, {}}}),
          1);
    }
    for (; step < r.steps.size() && r.steps[step].start_pos < r.prompt_len; ++step) {
      const SpecStep& s = r.steps[step];
      EXPECT_TRUE(s.draft_tokens.empty());
      if (step > 0) {
        EXPECT_EQ(s.start_pos, r.steps[step - 1].start_pos + 1);
      }
      const at::Tensor row = logprobs[s.start_pos - 1];
      EXPECT_EQ(s.topk_ids[0], row.argmax().item<int64_t>()) << s.start_pos;
      for (size_t e = 0; e < 8; ++e) {
        EXPECT_NEAR(HalfToFloat(s.topk_logprobs[e]), row[s.topk_ids[e]].item<float>(), 2e-2);
      }
      ++prompt_rows;
    }
    ASSERT_GT(step, 0u) << "no prompt rows in " << r.request_id;
    EXPECT_EQ(r.steps[step - 1].start_pos, r.prompt_len - 1);
    if (n == 0) {
      EXPECT_EQ(r.steps[0].start_pos, 1u);  // a new prompt: all of it
    }
    if (n > 0 && std::equal(r.tokens.begin(), r.tokens.begin() + r.prompt_len,
                            records[n - 1].tokens.begin(),
                            records[n - 1].tokens.begin() + records[n - 1].prompt_len)) {
      // The same prompt again: only past the prefix the cache kept (16-token blocks).
      EXPECT_GT(r.steps[0].start_pos, 16u);
      ++again;
    }
    for (; step < r.steps.size(); ++step) {
      const SpecStep& s = r.steps[step];
      EXPECT_GE(s.start_pos, r.prompt_len);
      const size_t k = s.draft_tokens.size();
      // (A step cut by max_tokens or EOS accepted drafts that the final tokens do not hold.)
      for (size_t i = 0; i < s.num_accepted && s.start_pos + i < r.tokens.size(); ++i) {
        EXPECT_EQ(r.tokens[s.start_pos + i], s.draft_tokens[i]);
      }
      for (size_t j = 0; j <= s.num_accepted && j <= k; ++j) {
        if (s.start_pos + j >= r.tokens.size()) break;
        EXPECT_EQ(s.topk_ids[j * r.top_k], r.tokens[s.start_pos + j])  // greedy = top-1
            << r.request_id << " start " << s.start_pos << " j " << j << " k " << k
            << " accepted " << s.num_accepted << " len " << r.tokens.size();
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 50);
  EXPECT_EQ(again, requests / 2);
  EXPECT_GT(prompt_rows, 200);
}

// cpp-httplib listens with a backlog of 5; Bind() raises it, so a burst of connections that
// the accept loop has not taken yet (here: it has not started) waits in the kernel instead of
// having its handshakes dropped (clients would see resets or stalls). And Stop() before Run()
// makes Run() return at once rather than serve forever.
TEST(HttpServerSocket, BurstOfConnectionsWaitsInTheBacklog) {
  std::unique_ptr<ServingMetrics> metrics;  // the status page samples it; no request comes
  ASSERT_TRUE(ServingMetrics::Create(ServingMetricsOptions(), &metrics).ok());
  HttpServerOptions ho;
  ho.port = 0;
  HttpServer server(ho, nullptr, metrics.get(), nullptr, nullptr, nullptr, nullptr);
  int port = 0;
  ASSERT_TRUE(server.Bind(&port).ok());
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  constexpr int kConnections = 64;
  std::vector<pollfd> fds;
  for (int i = 0; i < kConnections; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    ASSERT_GE(fd, 0);
    (void)connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));  // EINPROGRESS
    fds.push_back({fd, POLLOUT, 0});
  }
  // Loopback handshakes complete at once when the queue has room; a dropped SYN is retried
  // only after a second.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_GE(poll(fds.data(), fds.size(), 0), 0);
  int established = 0;
  for (const pollfd& p : fds) {
    int err = -1;
    socklen_t len = sizeof(err);
    if ((p.revents & POLLOUT) && getsockopt(p.fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 &&
        err == 0) {
      ++established;
    }
  }
  EXPECT_EQ(established, kConnections);
  for (const pollfd& p : fds) close(p.fd);
  server.Stop();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(server.Run().ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
}

}  // namespace
}  // namespace specloop
