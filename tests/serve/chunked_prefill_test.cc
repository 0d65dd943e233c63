// Chunked prefill in the Scheduler (no HTTP: requests go straight into RequestChannels): a long
// prompt arriving while other sequences stream is prefilled in chunks that ride in their
// steps, so they keep streaming through its prefill, and its greedy output is the target's own
// greedy decoding of the whole prompt.
#include "serve/scheduler.h"

#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/engine/generate.h"
#include "tests/serve/test_util.h"

namespace specloop {
namespace {

using Clock = std::chrono::steady_clock;

class ChunkedPrefill : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(LlamaModel::Load(serve_test::TargetDir(), {}, &target_).ok());
    std::unique_ptr<LlamaModel> draft;
    ASSERT_TRUE(LlamaModel::Load(serve_test::DraftDir(), {}, &draft).ok());
    ASSERT_TRUE(Tokenizer::Load(serve_test::TargetDir(), &tokenizer_).ok());
    ASSERT_TRUE(ServingMetrics::Create(ServingMetricsOptions(), &metrics_).ok());
    scheduler_ = std::make_unique<Scheduler>(target_.get(), std::move(draft), tokenizer_.get(),
                                             metrics_.get(), nullptr, SchedulerOptions());
    ASSERT_TRUE(scheduler_->Start().ok());
  }
  void TearDown() override {
    if (scheduler_) scheduler_->Stop();
  }

  // `text`'s ids with BOS, cut to `n` tokens.
  std::vector<int> Ids(const std::string& text, size_t n) const {
    std::vector<int> ids = tokenizer_->Encode(text);
    if (target_->config().add_bos_token) ids.insert(ids.begin(), target_->config().bos_token_id);
    if (ids.size() > n) ids.resize(n);
    return ids;
  }

  std::shared_ptr<RequestChannel> Submit(std::vector<int> prompt, int max_tokens) {
    CompletionParams p;
    p.request_id = "cmpl-test";
    p.domain = "prose";
    p.prompt = std::move(prompt);
    p.generate.max_tokens = max_tokens;
    p.generate.sampling.temperature = 0;
    p.generate.stop_at_eos = false;
    auto ch = std::make_shared<RequestChannel>(std::move(p));
    EXPECT_EQ(scheduler_->Submit(ch), Scheduler::SubmitResult::kOk);
    return ch;
  }

  std::unique_ptr<LlamaModel> target_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ServingMetrics> metrics_;
  std::unique_ptr<Scheduler> scheduler_;
};

// The first `chars` bytes of the prose corpus's training text.
std::string CorpusText(size_t chars) {
  std::ifstream in(serve_test::Shared() + "/corpus/prose/train.txt");
  std::string text(chars, '\0');
  in.read(&text[0], static_cast<std::streamsize>(chars));
  text.resize(static_cast<size_t>(in.gcount()));
  return text;
}

TEST_F(ChunkedPrefill, OthersKeepStreamingThroughALongPromptsPrefill) {
  const std::string text = CorpusText(20000);
  // Four streams, each seen decoding before the long prompt arrives.
  std::vector<std::shared_ptr<RequestChannel>> streams;
  for (int i = 0; i < 4; ++i) streams.push_back(Submit(Ids(text.substr(i * 400), 40), 600));
  RequestEvent e;
  for (auto& ch : streams) {
    ASSERT_TRUE(ch->Next(std::chrono::seconds(60), &e));
    ASSERT_EQ(e.type, RequestEvent::Type::kDelta) << e.error;
  }
  const std::vector<int> long_prompt = Ids(text.substr(3000), 800);
  ASSERT_EQ(long_prompt.size(), 800u);
  for (auto& ch : streams) {
    while (ch->Next(std::chrono::milliseconds(0), &e)) {
      ASSERT_EQ(e.type, RequestEvent::Type::kDelta);
    }
  }
  auto long_ch = Submit(long_prompt, 24);

  // Until the long request's first text, the streams' text events: its prefill (~800 tokens,
  // dozens of chunks) rides in their steps (~230 events here). Without chunking it ran whole
  // at admission, and they got meanwhile only what the steps around it posted (4-7 events when
  // this test ran against that scheduler).
  int during = 0;
  bool first = false;
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  while (!first && Clock::now() < deadline) {
    for (auto& ch : streams) {
      while (ch->Next(std::chrono::milliseconds(0), &e)) {
        ASSERT_EQ(e.type, RequestEvent::Type::kDelta) << e.error;
        ++during;
      }
    }
    first = long_ch->Next(std::chrono::milliseconds(1), &e);
  }
  ASSERT_TRUE(first) << "no first token from the long request";
  ASSERT_NE(e.type, RequestEvent::Type::kError) << e.error;
  std::printf("stream events during the long prompt's prefill: %d\n", during);
  EXPECT_GE(during, 40);

  // Its greedy output is the target's greedy decoding of the whole prompt, prefilled at once.
  std::string out = e.text;
  while (e.type != RequestEvent::Type::kDone) {
    ASSERT_TRUE(long_ch->Next(std::chrono::seconds(60), &e));
    ASSERT_NE(e.type, RequestEvent::Type::kError) << e.error;
    out += e.text;
  }
  EXPECT_EQ(e.completion_tokens, 24);
  GenerateOptions go;
  go.max_tokens = 24;
  go.sampling.temperature = 0;
  go.stop_at_eos = false;
  const GenerateResult plain = GeneratePlain(*target_, long_prompt, go);
  EXPECT_EQ(out, tokenizer_->Decode(plain.tokens, long_prompt.back()));
  for (auto& ch : streams) ch->Cancel();
}

}  // namespace
}  // namespace specloop
