// Token trees in the Scheduler (--draft-mode tree; no HTTP: requests go straight into
// RequestChannels): a batch of greedy requests drafting trees gives the target's greedy
// output, reports its tree steps, and logs each tree step as its accepted path with the
// target's rows at the positions it committed (on RocksDB on disk, read back).
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "buffer/replay_logger.h"
#include "common/engine/generate.h"
#include "serve/sample_logger.h"
#include "serve/scheduler.h"
#include "tests/serve/buffer_records.h"
#include "tests/serve/test_util.h"

namespace specloop {
namespace {

class TreeDrafting : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(LlamaModel::Load(serve_test::TargetDir(), {}, &target_).ok());
    ASSERT_TRUE(Tokenizer::Load(serve_test::TargetDir(), &tokenizer_).ok());
    std::ifstream in(serve_test::Shared() + "/corpus/prose/train.txt");
    text_.resize(20000);
    in.read(&text_[0], static_cast<std::streamsize>(text_.size()));
    text_.resize(static_cast<size_t>(in.gcount()));
  }

  // The ids of text_[offset, ...), cut to `n`, with BOS.
  std::vector<int> Ids(size_t offset, size_t n) const {
    std::vector<int> ids = tokenizer_->Encode(text_.substr(offset, 8 * n));
    if (target_->config().add_bos_token) ids.insert(ids.begin(), target_->config().bos_token_id);
    ids.resize(n);
    return ids;
  }

  std::vector<int> PlainGreedy(const std::vector<int>& prompt, int max_tokens) const {
    GenerateOptions go;
    go.max_tokens = max_tokens;
    go.sampling.temperature = 0;
    go.stop_at_eos = false;
    return GeneratePlain(*target_, prompt, go).tokens;
  }

  std::unique_ptr<LlamaModel> target_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::string text_;
};

// Six concurrent greedy requests, every step a tree of depth 3 ({2, 2, 1}: 2 + 4 + 4 nodes).
TEST_F(TreeDrafting, FixedDepthTreesGiveTheGreedyOutputAndLogTheirAcceptedPath) {
  constexpr int kRequests = 6, kMaxTokens = 40;
  serve_test::TempDir dir;
  std::unique_ptr<ReplayLogger> replay;
  ASSERT_TRUE(ReplayLogger::Open(BufferOptions(), LoggerOptions(), dir.path(), &replay).ok());
  std::unique_ptr<ServingMetrics> metrics;
  ASSERT_TRUE(ServingMetrics::Create(ServingMetricsOptions(), &metrics).ok());
  std::vector<std::vector<int>> prompts, outputs(kRequests);
  std::vector<RequestEvent> done(kRequests);
  {
    SampleLoggerOptions lo;
    lo.top_k = 8;
    SampleLogger sample_logger(replay.get(), lo);
    std::unique_ptr<LlamaModel> draft;
    ASSERT_TRUE(LlamaModel::Load(serve_test::DraftDir(), {}, &draft).ok());
    SchedulerOptions o;
    o.k = 3;
    o.tree_branching = {2, 2, 1};
    Scheduler scheduler(target_.get(), std::move(draft), tokenizer_.get(), metrics.get(),
                        &sample_logger, o);
    ASSERT_TRUE(scheduler.Start().ok());
    std::vector<std::shared_ptr<RequestChannel>> channels;
    for (int i = 0; i < kRequests; ++i) {
      prompts.push_back(Ids(1500 * i, 24 + 8 * i));
      CompletionParams p;
      p.request_id = "cmpl-tree-" + std::to_string(i);
      p.domain = "prose";
      p.prompt = prompts.back();
      p.generate.max_tokens = kMaxTokens;
      p.generate.sampling.temperature = 0;
      p.generate.stop_at_eos = false;
      channels.push_back(std::make_shared<RequestChannel>(std::move(p)));
      ASSERT_EQ(scheduler.Submit(channels.back()), Scheduler::SubmitResult::kOk);
    }
    for (int i = 0; i < kRequests; ++i) {
      RequestEvent e;
      do {
        ASSERT_TRUE(channels[i]->Next(std::chrono::seconds(120), &e)) << "request " << i;
        ASSERT_NE(e.type, RequestEvent::Type::kError) << e.error;
      } while (e.type != RequestEvent::Type::kDone);
      done[i] = e;
    }
    scheduler.Stop();
  }  // the sample logger drains
  ASSERT_TRUE(replay->Close().ok());

  int64_t tree_steps = 0, tree_accepted = 0;
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_EQ(done[i].completion_tokens, kMaxTokens);
    const SpeculativeUsage& u = done[i].speculative;
    EXPECT_GT(u.tree.steps, 0) << "request " << i;
    EXPECT_EQ(u.tree.steps, u.steps) << "a fixed k drafts a tree every step";
    EXPECT_EQ(u.tree.drafted, 10 * u.tree.steps) << "a tree of {2, 2, 1} has 10 nodes";
    tree_steps += u.tree.steps;
    tree_accepted += u.tree.accepted;
  }
  EXPECT_GT(tree_accepted, tree_steps / 2) << "the draft's trees are mostly accepted in part";
  const std::string exposition = metrics->Render(nullptr, nullptr);
  EXPECT_NE(exposition.find("specloop_tree_steps_total{domain=\"prose\"} " +
                            std::to_string(tree_steps)),
            std::string::npos);

  // The records: the target's greedy outputs, and each step the accepted path of its tree,
  // whose rows are the target's at the committed positions: under greedy decoding each row's
  // top token is the token committed there.
  const std::vector<Record> records = serve_test::ReadRecords(dir.path());
  ASSERT_EQ(records.size(), static_cast<size_t>(kRequests));
  int64_t logged_steps = 0, checked_rows = 0;
  for (const Record& r : records) {
    const int i = std::stoi(r.request_id.substr(std::string("cmpl-tree-").size()));
    const std::vector<int> want = PlainGreedy(prompts[i], kMaxTokens);
    ASSERT_EQ(r.tokens.size(), prompts[i].size() + kMaxTokens);
    EXPECT_EQ(std::vector<int>(r.tokens.begin() + prompts[i].size(), r.tokens.end()), want)
        << "request " << i;
    for (const SpecStep& st : r.steps) {
      if (st.start_pos < r.prompt_len) continue;  // the prompt's rows (not the tree's)
      ++logged_steps;
      const size_t k = st.draft_tokens.size();
      EXPECT_EQ(st.num_accepted, k) << "a tree step is logged as its accepted path";
      ASSERT_EQ(st.topk_ids.size(), (k + 1) * r.top_k);
      // (A path may run past max_tokens, where the output was cut.)
      for (size_t j = 0; j <= k && st.start_pos + j < r.tokens.size(); ++j) {
        const size_t pos = st.start_pos + j;
        if (j < k) {
          EXPECT_EQ(st.draft_tokens[j], r.tokens[pos]);
        }
        EXPECT_EQ(st.topk_ids[j * r.top_k], r.tokens[pos]) << "row " << j << " at " << pos;
        ++checked_rows;
      }
    }
  }
  EXPECT_EQ(logged_steps, tree_steps);
  EXPECT_GT(checked_rows, tree_steps);
}

}  // namespace
}  // namespace specloop
