// The paged KV cache in the Scheduler (no HTTP: requests go straight into RequestChannels):
// prefix caching serves a shared prompt prefix from cached blocks with the same greedy output;
// a pool smaller than the load queues requests and preempts sequences, and every request still
// completes with the target's greedy output; a request that could never fit is refused.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <unistd.h>

#include "common/engine/generate.h"
#include "serve/scheduler.h"
#include "tests/common/test_models.h"
#include "tests/serve/test_util.h"

namespace specloop {
namespace {

class PagedKv : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(LlamaModel::Load(serve_test::TargetDir(), {}, &target_).ok());
    ASSERT_TRUE(Tokenizer::Load(serve_test::TargetDir(), &tokenizer_).ok());
    std::ifstream in(serve_test::Shared() + "/corpus/prose/train.txt");
    text_.resize(40000);
    in.read(&text_[0], static_cast<std::streamsize>(text_.size()));
    text_.resize(static_cast<size_t>(in.gcount()));
  }
  void TearDown() override {
    if (scheduler_) scheduler_->Stop();
  }

  Status Start(const SchedulerOptions& o) {
    if (scheduler_) scheduler_->Stop();
    std::unique_ptr<LlamaModel> draft;
    Status s = LlamaModel::Load(serve_test::DraftDir(), {}, &draft);
    if (s.ok()) s = ServingMetrics::Create(ServingMetricsOptions(), &metrics_);
    if (!s.ok()) return s;
    scheduler_ = std::make_unique<Scheduler>(target_.get(), std::move(draft), tokenizer_.get(),
                                             metrics_.get(), nullptr, o);
    return scheduler_->Start();
  }

  // The ids of text_[offset, ...), cut to `n`; with BOS when `bos`.
  std::vector<int> Ids(size_t offset, size_t n, bool bos = true) const {
    std::vector<int> ids = tokenizer_->Encode(text_.substr(offset, 8 * n));
    if (bos && target_->config().add_bos_token) {
      ids.insert(ids.begin(), target_->config().bos_token_id);
    }
    ids.resize(n);
    return ids;
  }

  std::shared_ptr<RequestChannel> Submit(std::vector<int> prompt, int max_tokens,
                                         Scheduler::SubmitResult want = {}) {
    CompletionParams p;
    p.request_id = "cmpl-test";
    p.domain = "prose";
    p.prompt = std::move(prompt);
    p.generate.max_tokens = max_tokens;
    p.generate.sampling.temperature = 0;
    p.generate.stop_at_eos = false;
    auto ch = std::make_shared<RequestChannel>(std::move(p));
    EXPECT_EQ(scheduler_->Submit(ch), want);
    return ch;
  }

  // The request's whole text; fails the test on an error event.
  std::string Drain(RequestChannel* ch, int want_tokens) {
    std::string out;
    RequestEvent e;
    do {
      if (!ch->Next(std::chrono::seconds(120), &e)) {
        ADD_FAILURE() << "no event within 120 s";
        return out;
      }
      EXPECT_NE(e.type, RequestEvent::Type::kError) << e.error;
      if (e.type == RequestEvent::Type::kError) return out;
      out += e.text;
    } while (e.type != RequestEvent::Type::kDone);
    EXPECT_EQ(e.completion_tokens, want_tokens);
    return out;
  }

  std::string PlainGreedy(const std::vector<int>& prompt, int max_tokens) const {
    GenerateOptions go;
    go.max_tokens = max_tokens;
    go.sampling.temperature = 0;
    go.stop_at_eos = false;
    return tokenizer_->Decode(GeneratePlain(*target_, prompt, go).tokens, prompt.back());
  }

  // A counter or gauge without labels, read from the exposition text.
  double Metric(const std::string& name) const {
    std::istringstream in(metrics_->Render(nullptr, nullptr));
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
    }
    ADD_FAILURE() << name << " not exported";
    return -1;
  }

  std::unique_ptr<LlamaModel> target_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ServingMetrics> metrics_;
  std::unique_ptr<Scheduler> scheduler_;
  std::string text_;
};

// Four requests, one after another, share a 200-token prompt prefix (12 full blocks). With
// prefix caching the later three adopt those blocks (hits counted), and every output equals the
// one without the cache, which is the target's greedy decoding.
TEST_F(PagedKv, ASharedPrefixIsServedFromCachedBlocksWithTheSameOutputs) {
  const std::vector<int> prefix = Ids(0, 200);
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < 4; ++i) {
    std::vector<int> p = prefix;
    for (int id : Ids(5000 + 700 * i, 20, false)) p.push_back(id);
    prompts.push_back(p);
  }
  std::vector<std::string> outputs[2];
  double hits[2], queries[2];
  for (int cached = 0; cached < 2; ++cached) {
    SchedulerOptions o;
    o.prefix_caching = cached == 1;
    ASSERT_TRUE(Start(o).ok());
    for (const auto& p : prompts) {
      auto ch = Submit(p, 24);
      outputs[cached].push_back(Drain(ch.get(), 24));
    }
    hits[cached] = Metric("specloop_prefix_cache_hits_total");
    queries[cached] = Metric("specloop_prefix_cache_queries_total");
  }
  EXPECT_EQ(hits[0], 0);
  const int full = 200 / KVBlockPool::kBlockTokens * KVBlockPool::kBlockTokens;  // 192
  EXPECT_GE(hits[1], 3 * full);
  EXPECT_GE(queries[1], 4 * 219);
  EXPECT_EQ(outputs[0], outputs[1]);
  EXPECT_EQ(outputs[1][3], PlainGreedy(prompts[3], 24));
}

// A pool of ~430 positions for eight requests of up to ~165 each: they queue for blocks, the
// running ones outgrow the pool and are preempted and recomputed, and every one completes with
// the target's greedy output; the pool's usage never passes 1.
class PagedKvSmallPool : public PagedKv, public ::testing::WithParamInterface<bool> {};

TEST_P(PagedKvSmallPool, RequestsQueueAndArePreemptedAndAllComplete) {
  SchedulerOptions o;
  o.kv_cache_mb = 3;
  o.prefix_caching = GetParam();
  ASSERT_TRUE(Start(o).ok());
  const int64_t capacity = scheduler_->kv_cache_tokens();
  EXPECT_GT(capacity, 300);
  EXPECT_LT(capacity, 500);
  constexpr int kRequests = 8, kTokens = 100;
  std::vector<std::vector<int>> prompts;
  std::vector<std::shared_ptr<RequestChannel>> channels;
  for (int i = 0; i < kRequests; ++i) {
    prompts.push_back(Ids(600 * i, 60));
    channels.push_back(Submit(prompts.back(), kTokens));
  }
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_EQ(Drain(channels[i].get(), kTokens), PlainGreedy(prompts[i], kTokens))
        << "request " << i;
  }
  EXPECT_GT(Metric("specloop_preemptions_total"), 0);
  EXPECT_EQ(Metric("specloop_kv_cache_capacity_tokens"), capacity);
  EXPECT_LE(Metric("specloop_kv_cache_usage_ratio"), 1.0);
}

INSTANTIATE_TEST_SUITE_P(PrefixCaching, PagedKvSmallPool, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "On" : "Off";
                         });

TEST_F(PagedKv, ARequestThatCouldNeverFitIsRefusedAndOthersAreServed) {
  SchedulerOptions o;
  o.kv_cache_mb = 0.05;  // under one block of each model
  EXPECT_FALSE(Start(o).ok());
  o.kv_cache_mb = 3;
  ASSERT_TRUE(Start(o).ok());
  const int64_t capacity = scheduler_->kv_cache_tokens();
  Submit(Ids(0, 300), static_cast<int>(capacity), Scheduler::SubmitResult::kTooLarge);
  auto ch = Submit(Ids(0, 300), 16);
  EXPECT_EQ(Drain(ch.get(), 16), PlainGreedy(Ids(0, 300), 16));
}

// Start() prepares the shape-static forward for every padded shape a decode step can take (on
// CUDA it captures their graphs; here, forced on the CPU, it registers each shape): up to
// max_batch 4 sequences of up to 16 tokens over any context the pool holds. A request alone,
// then three at once, at k 3, with prompts short enough for the static path and longer, then
// meet no shape it did not prepare.
TEST_F(PagedKv, StartPreparesEveryDecodeShapeServingMeets) {
  target_->set_use_small_cpu_path(false);
  target_->set_static_shapes(true);
  SchedulerOptions o;
  o.max_batch = 4;
  o.k = 3;
  o.kv_cache_mb = 3;
  ASSERT_TRUE(Start(o).ok());
  const int64_t context =
      std::min<int64_t>(target_->config().max_model_len, scheduler_->kv_cache_tokens());
  int buckets = 1;  // cached positions padded to 16, 32, ..., at least context - 1
  for (int64_t p = KVBlockPool::kBlockTokens; p < context - 1; p *= 2) ++buckets;
  const LlamaModel::StaticStats prepared = target_->static_stats();
  EXPECT_EQ(prepared.shapes, 3 * 5 * buckets);  // sequences {1, 2, 4} x tokens {1, ..., 16}
  EXPECT_EQ(prepared.forwards, 0);

  auto alone = Submit(Ids(0, 14), 24);  // its prompt alone in a forward: 13 tokens, padded to 16
  Drain(alone.get(), 24);
  std::vector<std::shared_ptr<RequestChannel>> channels;
  for (const int n : {10, 60, 100}) channels.push_back(Submit(Ids(300 * n, n), 24));
  for (auto& ch : channels) Drain(ch.get(), 24);
  EXPECT_GE(target_->static_stats().forwards, 6);  // 24 tokens: at least 6 steps of k 3
  EXPECT_EQ(target_->static_stats().shapes, prepared.shapes)
      << "a step met a shape Start() did not prepare";
}

// The default KV budget (--kv-cache-mb 0) follows max_model_len and the machine's memory, not
// max_position_embeddings alone: Llama 3's 131072 positions get max_batch sequences' room
// only within a quarter of the memory, --max-model-len shrinks it, and a limit whose one
// sequence does not fit is refused at start naming the flag.
TEST(DefaultKvBudget, FollowsMaxModelLenWithinTheMachinesMemory) {
  const std::string zoo = serve_test::Shared() + "/models/zoo/";
  std::unique_ptr<Tokenizer> tokenizer;
  ASSERT_TRUE(Tokenizer::Load(zoo + "llama3-target", &tokenizer).ok());
  std::unique_ptr<ServingMetrics> metrics;
  ASSERT_TRUE(ServingMetrics::Create(ServingMetricsOptions(), &metrics).ok());
  auto budget = [&](int max_model_len, int64_t* tokens) {
    LoadOptions load;
    load.max_model_len = max_model_len;
    std::unique_ptr<LlamaModel> target, draft;
    Status s = LlamaModel::Load(zoo + "llama3-target", load, &target);
    if (s.ok()) s = LlamaModel::Load(zoo + "llama3-draft", {}, &draft);
    if (!s.ok()) return s;
    SchedulerOptions o;  // max_batch 16, --kv-cache-mb 0
    Scheduler scheduler(target.get(), std::move(draft), tokenizer.get(), metrics.get(), nullptr,
                        o);
    s = scheduler.Start();
    *tokens = scheduler.kv_cache_tokens();
    scheduler.Stop();
    return s;
  };
  int64_t full = 0, short_context = 0;
  ASSERT_TRUE(budget(0, &full).ok());
  const int64_t memory = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  const int64_t per_token = 6 * 2 * 4 * 32 * 4 + 2 * 2 * 2 * 32 * 4;  // target + draft, float32
  EXPECT_GE(full, 131072);                                     // one sequence at the limit
  EXPECT_LE(full * per_token, memory * kDefaultKvMemoryShare);  // within the share
  EXPECT_LT(full, 16 * 131072);  // not max_batch sequences at max_position_embeddings
  ASSERT_TRUE(budget(2048, &short_context).ok());
  EXPECT_GE(short_context, 16 * 2048);
  EXPECT_LE(short_context, 16 * (2048 + 32));  // the step's rows and one block of headroom

  // A context no share of this machine's memory holds one sequence of.
  ModelConfig c = testing::TinyConfig();
  c.max_position_embeddings = 1 << 30;
  std::unique_ptr<LlamaModel> huge = testing::RandomModel(c, 1);
  Scheduler scheduler(huge.get(), testing::RandomModel(c, 2), tokenizer.get(), metrics.get(),
                      nullptr, SchedulerOptions());
  const Status s = scheduler.Start();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.ToString().find("--max-model-len"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace specloop
