// An in-process serving stack for the serve tests of one model directory: HttpServer +
// Scheduler on a free loopback port (a replay buffer where asked), with the request defaults of
// the model's generation_config.json as `specloop serve` resolves them; and small request
// helpers.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "buffer/replay_logger.h"
#include "common/tokenizer/generation_config.h"
#include "serve/http_server.h"
#include "serve/sample_logger.h"

namespace specloop {
namespace serve_test {

struct StackOptions {
  std::string target_dir;
  std::string draft_dir;  // empty: no draft (k must be 0)
  int k = 0;              // SchedulerOptions::k: -1 adaptive, 0 off, N fixed
  std::vector<int> tree_branching;
  GenerationConfigMode generation_config = GenerationConfigMode::kAuto;
  std::string model_name = "model";
  int max_batch = 0;  // 0: SchedulerOptions' default
  SpecMetricsLevel per_request_spec_metrics = SpecMetricsLevel::kNone;
  std::string buffer_dir;  // non-empty: every request logged into a replay buffer there
  size_t max_domains = ServingMetricsOptions().max_domains;
};

class ServingStack {
 public:
  // Loads the models; *status says why not (the stack is then unusable: ok() false).
  explicit ServingStack(const StackOptions& o) {
    status_ = LlamaModel::Load(o.target_dir, {}, &target_);
    std::unique_ptr<LlamaModel> draft;
    if (status_.ok() && !o.draft_dir.empty()) {
      status_ = LlamaModel::Load(o.draft_dir, {}, &draft).Annotate(o.draft_dir);
    }
    if (status_.ok()) status_ = Tokenizer::Load(o.target_dir, &tokenizer_);
    GenerationConfig gc;
    HttpServerOptions ho;
    if (status_.ok()) status_ = GenerationConfig::FromDir(o.target_dir, &gc);
    if (status_.ok()) {
      status_ = ResolveGenerationDefaults(gc, o.generation_config, target_->config().eos_token_ids,
                                          target_->config().vocab_size, &ho.generation_defaults);
    }
    if (status_.ok() && !o.buffer_dir.empty()) {
      status_ = ReplayLogger::Open(BufferOptions(), LoggerOptions(), o.buffer_dir, &logger_);
      if (status_.ok()) {
        sample_logger_ = std::make_unique<SampleLogger>(logger_.get(), SampleLoggerOptions());
      }
    }
    if (!status_.ok()) return;
    ServingMetricsOptions mo;
    mo.max_domains = o.max_domains;
    EXPECT_TRUE(ServingMetrics::Create(mo, &metrics_).ok());
    SchedulerOptions so;
    so.k = o.k;
    so.tree_branching = o.tree_branching;
    if (o.max_batch > 0) so.max_batch = o.max_batch;
    so.per_request_spec_metrics = o.per_request_spec_metrics;
    scheduler_ = std::make_unique<Scheduler>(target_.get(), std::move(draft), tokenizer_.get(),
                                             metrics_.get(), sample_logger_.get(), so);
    status_ = scheduler_->Start();
    if (!status_.ok()) return;
    ho.port = 0;
    ho.model_name = o.model_name;
    server_ = std::make_unique<HttpServer>(ho, scheduler_.get(), metrics_.get(), tokenizer_.get(),
                                           &target_->config(), logger_.get(),
                                           sample_logger_.get());
    status_ = server_->Bind(&port_);
    if (status_.ok()) thread_ = std::thread([this] { (void)server_->Run(); });
  }
  ~ServingStack() { Shutdown(); }
  // Stops the server and the scheduler; with a buffer, it then holds every finished request's
  // record. Idempotent.
  void Shutdown() {
    if (thread_.joinable()) {
      server_->Stop();
      thread_.join();
    }
    if (scheduler_) scheduler_->Stop();
    sample_logger_.reset();
    if (logger_) EXPECT_TRUE(logger_->Close().ok());
    logger_.reset();
  }
  ServingStack(const ServingStack&) = delete;
  ServingStack& operator=(const ServingStack&) = delete;

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  const LlamaModel& target() const { return *target_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }

  // POSTs `body` to `path`; the status and the body (the response, or for a stream the last
  // chunk) in *out; a stream's chunks in *chunks.
  int Post(const std::string& path, const nlohmann::json& body, nlohmann::json* out,
           std::vector<nlohmann::json>* chunks = nullptr) const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120, 0);
    auto res = c.Post(path.c_str(), body.dump(), "application/json");
    if (!res) return 0;
    if (!body.value("stream", false) || res->status != 200) {
      *out = nlohmann::json::parse(res->body, nullptr, false);
      return res->status;
    }
    const std::string& b = res->body;
    for (size_t pos = 0; pos < b.size();) {
      const size_t end = b.find("\n\n", pos);
      if (end == std::string::npos) break;
      const std::string data = b.substr(pos + 6, end - pos - 6);  // after "data: "
      pos = end + 2;
      if (data == "[DONE]") break;
      nlohmann::json chunk = nlohmann::json::parse(data);
      if (chunks) chunks->push_back(chunk);
      *out = chunk;
    }
    return res->status;
  }
  nlohmann::json Get(const std::string& path) const {
    httplib::Client c("127.0.0.1", port_);
    auto res = c.Get(path.c_str());
    return res ? nlohmann::json::parse(res->body, nullptr, false) : nlohmann::json();
  }

 private:
  Status status_;
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

}  // namespace serve_test
}  // namespace specloop
