// Draft hot-swap end to end: a trainer-side DraftPublisher on loopback ZeroMQ, a serving stack
// (HttpServer + Scheduler + DraftSwapper) on a free loopback port. While clients stream, a new
// draft is published: every request completes, later responses report the new version; a
// corrupt checkpoint is refused, counted, and the installed draft keeps serving.
#include "serve/draft_swapper.h"

#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include "serve/http_server.h"
#include "tests/serve/test_util.h"

namespace specloop {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// ROOT/vNNNNNN from a model directory: its config.json and model.safetensors (cut to
// `keep_bytes` when > 0: a corrupt model that still hashes consistently) and a meta.json.
void MakeCheckpoint(const std::string& root, uint64_t version, const std::string& model_dir,
                    size_t keep_bytes = 0) {
  namespace fs = std::filesystem;
  const std::string dir = root + "/" + VersionDirName(version);
  fs::create_directories(dir);
  fs::copy_file(model_dir + "/config.json", dir + "/config.json");
  fs::copy_file(model_dir + "/model.safetensors", dir + "/model.safetensors");
  if (keep_bytes > 0) fs::resize_file(dir + "/model.safetensors", keep_bytes);
  std::string sha;
  ASSERT_TRUE(Sha256File(dir + "/model.safetensors", &sha).ok());
  std::ofstream(dir + "/meta.json") << json{{"version", version}, {"sha256", sha}}.dump();
}

// Polls `done` (a state handshake, bounded by `seconds`).
template <typename F>
bool WaitFor(F done, int seconds = 60) {
  const auto deadline = Clock::now() + std::chrono::seconds(seconds);
  while (!done()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

json Post(int port, json req) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(120, 0);
  auto res = c.Post("/v1/completions", req.dump(), "application/json");
  if (!res) return json{{"transport_error", true}};
  if (!req.value("stream", false)) return json::parse(res->body, nullptr, false);
  // Streaming: the last chunk (with finish_reason) plus whether [DONE] closed the stream.
  json last;
  bool done = false;
  const std::string& b = res->body;
  for (size_t pos = 0; pos < b.size();) {
    const size_t end = b.find("\n\n", pos);
    if (end == std::string::npos) break;
    const std::string data = b.substr(pos + 6, end - pos - 6);
    pos = end + 2;
    if (data == "[DONE]") {
      done = true;
      break;
    }
    json chunk = json::parse(data, nullptr, false);
    if (chunk.contains("choices") && !chunk["choices"][0]["finish_reason"].is_null()) last = chunk;
  }
  last["done_marker"] = done;
  last["status"] = res->status;
  return last;
}

// A publisher and a serving stack with a DraftSwapper, stopped by the destructor.
struct SwapStack {
  explicit SwapStack(int rollback_min_steps = 200) {
    std::filesystem::create_directories(root);
    std::filesystem::create_directories(staging);
    PublisherOptions po;
    po.pub_endpoint = "tcp://127.0.0.1:*";
    po.router_endpoint = "tcp://127.0.0.1:*";
    EXPECT_TRUE(DraftPublisher::Start(&ctx, po, root, &publisher).ok());
    std::unique_ptr<LlamaModel> draft;
    EXPECT_TRUE(LlamaModel::Load(serve_test::TargetDir(), {}, &target).ok());
    EXPECT_TRUE(LlamaModel::Load(serve_test::DraftDir(), {}, &draft).ok());
    EXPECT_TRUE(Tokenizer::Load(serve_test::TargetDir(), &tokenizer).ok());
    EXPECT_TRUE(ServingMetrics::Create(ServingMetricsOptions(), &metrics).ok());
    DraftSwapperOptions wo;
    wo.fetcher.pub_endpoint = publisher->pub_endpoint();
    wo.fetcher.router_endpoint = publisher->router_endpoint();
    wo.staging_dir = staging;
    wo.initial_draft_dir = serve_test::DraftDir();
    wo.rollback_min_steps = rollback_min_steps;
    EXPECT_TRUE(DraftSwapper::Start(&ctx, wo, *target, metrics.get(), &swapper).ok());
    SchedulerOptions so;
    so.k = 4;
    scheduler = std::make_unique<Scheduler>(target.get(), std::move(draft), tokenizer.get(),
                                            metrics.get(), nullptr, so);
    scheduler->set_swap_hook(swapper.get());
    EXPECT_TRUE(scheduler->Start().ok());
    HttpServerOptions ho;
    ho.port = 0;
    server = std::make_unique<HttpServer>(ho, scheduler.get(), metrics.get(), tokenizer.get(),
                                          &target->config(), nullptr, nullptr);
    EXPECT_TRUE(server->Bind(&port).ok());
    http = std::thread([this] { (void)server->Run(); });
  }
  ~SwapStack() {
    server->Stop();
    http.join();
    scheduler->Stop();
    swapper->Stop();
    publisher->Stop();
  }
  std::string Metrics() { return metrics->Render(nullptr, nullptr); }

  serve_test::TempDir tmp;
  const std::string root = tmp.path() + "/checkpoints", staging = tmp.path() + "/staging";
  zmq::context_t ctx;
  std::unique_ptr<DraftPublisher> publisher;
  std::unique_ptr<LlamaModel> target;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ServingMetrics> metrics;
  std::unique_ptr<DraftSwapper> swapper;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<HttpServer> server;
  std::thread http;
  int port = 0;
};

TEST(HotSwap, ServesThroughASwapAndRefusesACorruptCheckpoint) {
  SwapStack st;
  const std::string prose = serve_test::Shared() + "/models/draft-prose-1m";
  ASSERT_TRUE(WaitFor([&] { return st.publisher->subscriptions() >= 1; }, 10));

  // Clients stream while version 1 is published: long enough streams (~0.6 s here) that they
  // outlast the swap (~0.13 s from the announcement; at 96 tokens they had finished first).
  const int kClients = 4, kTokens = 480;
  std::vector<json> results(kClients);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      results[i] = Post(st.port, {{"prompt", "In the beginning God created"},
                                  {"max_tokens", kTokens}, {"temperature", 0.8}, {"seed", i},
                                  {"stream", true}, {"ignore_eos", true}});
    });
  }
  ASSERT_TRUE(WaitFor([&] { return st.scheduler->active() >= 2; }));
  MakeCheckpoint(st.root, 1, prose);
  ASSERT_TRUE(st.publisher->Publish(1).ok());
  ASSERT_TRUE(WaitFor([&] { return st.scheduler->draft_version() == 1; })) << "no swap";
  for (auto& t : clients) t.join();
  // Streams that began under version 0 finished under version 1: the swap happened mid-flight
  // (their draft caches were rebuilt) and none of them failed.
  int swapped_in_flight = 0;
  for (const json& r : results) swapped_in_flight += r["speculative"]["draft_version"] == 1;
  EXPECT_GE(swapped_in_flight, 1) << results[0].dump();
  for (const json& r : results) {
    EXPECT_EQ(r["status"], 200) << r.dump();
    EXPECT_TRUE(r["done_marker"].get<bool>()) << r.dump();
    EXPECT_EQ(r["choices"][0]["finish_reason"], "length") << r.dump();
    EXPECT_EQ(r["usage"]["completion_tokens"], kTokens) << r.dump();
  }
  json after = Post(st.port, {{"prompt", "And the earth was"}, {"max_tokens", 16}});
  EXPECT_EQ(after["speculative"]["draft_version"], 1) << after.dump();

  // Version 2 is corrupt (its weights cut short, consistently hashed): refused and counted.
  MakeCheckpoint(st.root, 2, prose, /*keep_bytes=*/100000);
  ASSERT_TRUE(st.publisher->Publish(2).ok());
  const std::string refused = "specloop_draft_swap_failures_total{reason=\"load\"} 1";
  ASSERT_TRUE(WaitFor([&] { return st.Metrics().find(refused) != std::string::npos; }))
      << st.Metrics();
  EXPECT_EQ(st.scheduler->draft_version(), 1u);
  // (ignore_eos: a sampled continuation may end before 16 tokens, which is no failure.)
  after = Post(st.port,
               {{"prompt", "And the earth was"}, {"max_tokens", 16}, {"ignore_eos", true}});
  EXPECT_EQ(after["choices"][0]["finish_reason"], "length") << after.dump();
  EXPECT_EQ(after["speculative"]["draft_version"], 1) << after.dump();
  EXPECT_NE(st.Metrics().find("specloop_draft_swaps_total 1"), std::string::npos);
}

TEST(HotSwap, RollsBackAVersionWhoseLiveAlphaIsClearlyWorse) {
  // Python traffic: draft-mix-1m (version 0) accepts ~0.75 per token there, draft-prose-1m
  // (published as version 1) ~0.1. Once each has served 40 steps, version 0 comes back.
  SwapStack st(/*rollback_min_steps=*/40);
  ASSERT_TRUE(WaitFor([&] { return st.publisher->subscriptions() >= 1; }, 10));
  const json python = {{"prompt", "def decode(input, errors='strict'):\n    return codecs."},
                       {"max_tokens", 64}, {"temperature", 0}, {"ignore_eos", true}};
  for (int i = 0; i < 3; ++i) Post(st.port, python);  // v0's live record
  MakeCheckpoint(st.root, 1, serve_test::Shared() + "/models/draft-prose-1m");
  ASSERT_TRUE(st.publisher->Publish(1).ok());
  ASSERT_TRUE(WaitFor([&] { return st.scheduler->draft_version() == 1; }));
  for (int i = 0; i < 20 && st.Metrics().find("specloop_draft_rollbacks_total 1") ==
                                std::string::npos; ++i) {
    Post(st.port, python);
  }
  ASSERT_TRUE(WaitFor([&] { return st.scheduler->draft_version() == 0; })) << st.Metrics();
  EXPECT_NE(st.Metrics().find("specloop_draft_rollbacks_total 1"), std::string::npos);
  // The rolled-back version is not installed again when announced again.
  ASSERT_TRUE(st.publisher->Publish(1).ok());
  json r = Post(st.port, python);
  EXPECT_EQ(r["speculative"]["draft_version"], 0) << r.dump();
}

TEST(HotSwap, ComparesVersionsOnlyOnTheDomainsBothServed) {
  // Version 0 (draft-mix-1m) serves prose, where it accepts ~0.7 per token; version 1
  // (draft-prose-1m) then serves only python, where it accepts ~0.1. Judged overall, v1 looks
  // clearly worse (the rollback above would fire); on common domains there is nothing to
  // compare, so v1 stays: a draft that went live as traffic shifted is not blamed for it.
  SwapStack st(/*rollback_min_steps=*/40);
  ASSERT_TRUE(WaitFor([&] { return st.publisher->subscriptions() >= 1; }, 10));
  const json prose = {{"prompt", "Once upon a time, there was a little"}, {"max_tokens", 64},
                      {"temperature", 0}, {"ignore_eos", true}, {"domain", "prose"}};
  const json python = {{"prompt", "def decode(input, errors='strict'):\n    return codecs."},
                       {"max_tokens", 64}, {"temperature", 0}, {"ignore_eos", true},
                       {"domain", "python"}};
  for (int i = 0; i < 3; ++i) Post(st.port, prose);
  MakeCheckpoint(st.root, 1, serve_test::Shared() + "/models/draft-prose-1m");
  ASSERT_TRUE(st.publisher->Publish(1).ok());
  ASSERT_TRUE(WaitFor([&] { return st.scheduler->draft_version() == 1; }));
  for (int i = 0; i < 4; ++i) Post(st.port, python);
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // 3 rollback checks
  EXPECT_EQ(st.scheduler->draft_version(), 1u);
  EXPECT_NE(st.Metrics().find("specloop_draft_rollbacks_total 0"), std::string::npos)
      << st.Metrics();
}

}  // namespace
}  // namespace specloop
