#include "serve/sample_logger.h"

#include <chrono>
#include <limits>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/base/half.h"
#include "tests/serve/buffer_records.h"
#include "tests/serve/test_util.h"

namespace specloop {
namespace {

// The tests below on one replay logger each: SetUp opens it on a fresh temporary directory (a
// fatal failure if it does not open). A test's SampleLogger lives in a scope that ends before it
// closes logger_: the SampleLogger's destructor drains its queue into the logger.
class SampleLoggerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(ReplayLogger::Open(BufferOptions(), LoggerOptions(), dir_.path(), &logger_).ok());
  }

  // The options most tests share: 4 ids a row, every other option at its default.
  static SampleLoggerOptions TopK4() {
    SampleLoggerOptions o;
    o.top_k = 4;
    return o;
  }

  // The records in the buffer directory; call after logger_->Close().
  std::vector<Record> Records() const { return serve_test::ReadRecords(dir_.path()); }

  serve_test::TempDir dir_;  // outlives logger_ (members are destroyed in reverse order)
  std::unique_ptr<ReplayLogger> logger_;
};

TEST_F(SampleLoggerTest, WritesOneRecordPerRequestWithEveryStep) {
  {
    SampleLoggerOptions o = TopK4();
    o.worker_id = 7;
    o.target_id = "t-1";
    SampleLogger sl(logger_.get(), o);
    SamplingParams sp;
    sp.temperature = 0;
    auto trace = sl.Begin("prose", "cmpl-1", 3, sp, {1, 10, 11});
    // Step 1: k = 2 at start_pos 3, one accepted; rows [3, 8].
    at::Tensor rows = at::randn({3, 8});
    sl.AddStep(trace, 3, {20, 21}, 1, rows);
    // Step 2: k = 0 (plain) at start_pos 5.
    sl.AddStep(trace, 5, {}, 0, at::randn({1, 8}));
    sl.Finish(trace, {1, 10, 11, 20, 30, 31});
  }  // drains
  ASSERT_TRUE(logger_->Close().ok());
  EXPECT_EQ(logger_->stats().records_written.load(), 1u);

  const std::vector<Record> got = Records();
  ASSERT_EQ(got.size(), 1u);
  const Record& r = got[0];
  EXPECT_EQ(r.domain, "prose");
  EXPECT_EQ(r.request_id, "cmpl-1");
  EXPECT_EQ(r.worker_id, 7u);
  EXPECT_EQ(r.draft_version, 3u);
  EXPECT_EQ(r.target_id, "t-1");
  EXPECT_EQ(r.prompt_len, 3u);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{1, 10, 11, 20, 30, 31}));
  EXPECT_EQ(r.top_k, 4u);
  ASSERT_EQ(r.steps.size(), 2u);
  EXPECT_EQ(r.steps[0].start_pos, 3u);
  EXPECT_EQ(r.steps[0].draft_tokens, (std::vector<int32_t>{20, 21}));
  EXPECT_EQ(r.steps[0].num_accepted, 1u);
  EXPECT_EQ(r.steps[0].topk_ids.size(), 12u);
  EXPECT_EQ(r.steps[1].tail_mass.size(), 1u);
  EXPECT_EQ(ValidateRecord(r), "");
}

TEST_F(SampleLoggerTest, DropsStepsPastTheBacklogInsteadOfBlocking) {
  SampleLoggerOptions o;
  o.max_pending_steps = 4;
  o.top_k = 64;
  auto sl = std::make_unique<SampleLogger>(logger_.get(), o);
  auto trace = sl->Begin("c", "cmpl-2", 0, SamplingParams(), {1});
  at::Tensor rows = at::randn({9, 4096});
  for (int i = 0; i < 2000; ++i) sl->AddStep(trace, 1, {1, 2, 3, 4, 5, 6, 7, 8}, 8, rows);
  EXPECT_GT(sl->steps_dropped(), 0u);
  sl->Finish(trace, {1});
  sl.reset();
  ASSERT_TRUE(logger_->Close().ok());
}

// A prompt chunk's rows become one k = 0 step per position, in order, and count against the
// backlog as that many steps: a chunk larger than the room left is dropped whole and counted.
TEST_F(SampleLoggerTest, PromptRowsAreStepsOfTheirPositionsAndCountAgainstTheBacklog) {
  {
    SampleLoggerOptions o = TopK4();
    o.max_pending_steps = 8;
    SampleLogger sl(logger_.get(), o);
    auto trace = sl.Begin("c", "cmpl-3", 0, SamplingParams(), {1, 10, 11, 12, 13});
    at::Tensor rows = at::full({3, 8}, -5.0f);
    for (int i = 0; i < 3; ++i) rows[i][i + 1] = 5.0f;  // position i + 2's top token: i + 1
    sl.AddPromptRows(trace, 2, rows);
    sl.AddPromptRows(trace, 5, at::zeros({9, 8}));  // more than the backlog holds
    EXPECT_EQ(sl.steps_dropped(), 9u);
    sl.AddStep(trace, 5, {}, 0, at::randn({1, 8}));
    sl.Finish(trace, {1, 10, 11, 12, 13, 20});
  }
  ASSERT_TRUE(logger_->Close().ok());
  const std::vector<Record> got = Records();
  ASSERT_EQ(got.size(), 1u);
  const Record& r = got[0];
  EXPECT_EQ(ValidateRecord(r), "");
  ASSERT_EQ(r.steps.size(), 4u);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(r.steps[i].start_pos, i + 2);
    EXPECT_TRUE(r.steps[i].draft_tokens.empty());
    EXPECT_EQ(r.steps[i].topk_ids.size(), 4u);
    EXPECT_EQ(r.steps[i].topk_ids[0], static_cast<int32_t>(i + 1));
  }
  EXPECT_EQ(r.steps[3].start_pos, 5u);
}

// Steps the record builder refuses (rows not k + 1, prompt rows outside the prompt) are counted
// as dropped and the record keeps the rest; a record whose tokens are shorter than its prompt
// is refused whole and counted.
TEST_F(SampleLoggerTest, CountsWhatTheRecordBuilderRefuses) {
  {
    SampleLoggerOptions o = TopK4();
    SampleLogger sl(logger_.get(), o);
    auto trace = sl.Begin("c", "cmpl-4", 0, SamplingParams(), {1, 10, 11});
    sl.AddStep(trace, 3, {20, 21}, 1, at::randn({2, 8}));  // k = 2 needs 3 rows
    sl.AddPromptRows(trace, 0, at::zeros({2, 8}));         // position 0 is no prompt row
    sl.AddStep(trace, 3, {20}, 1, at::randn({2, 8}));
    sl.Finish(trace, {1, 10, 11, 20});
    auto short_trace = sl.Begin("c", "cmpl-5", 0, SamplingParams(), {1, 10, 11});
    sl.Finish(short_trace, {1, 10});
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while ((sl.steps_dropped() < 3 || sl.records_refused() < 1) &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(sl.steps_dropped(), 3u);
    EXPECT_EQ(sl.records_refused(), 1u);
  }
  ASSERT_TRUE(logger_->Close().ok());
  const std::vector<Record> got = Records();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].request_id, "cmpl-4");
  ASSERT_EQ(got[0].steps.size(), 1u);
  EXPECT_EQ(got[0].steps[0].draft_tokens, (std::vector<int32_t>{20}));
}

// A step whose top-K was taken on the model's device (AddStepTopK, from
// spec::TopKLogProbsToHost) makes the record AddStep makes from the same rows: the same ids in
// the same order, fp16 log-probs one unit in the last place or 1e-5 apart at most (a float32
// log-sum-exp against FillTopK's double one), the same tail masses within 1e-6; one whose K is not the
// logger's, or whose tensors disagree in shape, is dropped and counted, the record kept.
TEST_F(SampleLoggerTest, ATopKStepTakenOnTheDeviceLogsWhatItsRowsWould) {
  at::manual_seed(5);
  const at::Tensor rows = at::randn({3, 40}) * 3;
  {
    SampleLogger sl(logger_.get(), TopK4());
    spec::TopKTensors t;
    ASSERT_TRUE(spec::TopKLogProbsToHost(at::cat({at::randn({2, 40}), rows}), {2, 3, 4}, 4, &t)
                    .ok());
    ASSERT_TRUE(t.ids.device().is_cpu());
    auto from_rows = sl.Begin("c", "rows", 0, SamplingParams(), {1, 10, 11});
    sl.AddStep(from_rows, 3, {20, 21}, 1, rows);
    sl.Finish(from_rows, {1, 10, 11, 20, 30});
    auto from_top_k = sl.Begin("c", "top-k", 0, SamplingParams(), {1, 10, 11});
    sl.AddStepTopK(from_top_k, 3, {20, 21}, 1, t);
    spec::TopKTensors wide;  // K 8 in a record of K 4
    ASSERT_TRUE(spec::TopKLogProbsToHost(rows, {0, 1, 2}, 8, &wide).ok());
    sl.AddStepTopK(from_top_k, 5, {20, 21}, 1, wide);
    spec::TopKTensors torn = t;  // two tail masses for three rows
    torn.tail_mass = t.tail_mass.narrow(0, 0, 2);
    sl.AddStepTopK(from_top_k, 5, {20, 21}, 1, torn);
    sl.Finish(from_top_k, {1, 10, 11, 20, 30});
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (sl.steps_dropped() < 2 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(sl.steps_dropped(), 2u);
  }
  ASSERT_TRUE(logger_->Close().ok());
  const std::vector<Record> got = Records();
  ASSERT_EQ(got.size(), 2u);
  const Record& a = got[0].request_id == "rows" ? got[0] : got[1];
  const Record& b = got[0].request_id == "rows" ? got[1] : got[0];
  ASSERT_EQ(a.steps.size(), 1u);
  ASSERT_EQ(b.steps.size(), 1u);
  const SpecStep &h = a.steps[0], &d = b.steps[0];
  EXPECT_EQ(d.start_pos, 3u);
  EXPECT_EQ(d.draft_tokens, h.draft_tokens);
  EXPECT_EQ(d.num_accepted, 1u);
  EXPECT_EQ(d.topk_ids, h.topk_ids);
  ASSERT_EQ(d.topk_logprobs.size(), 12u);
  for (size_t i = 0; i < 12; ++i) {
    const float dv = HalfToFloat(d.topk_logprobs[i]), hv = HalfToFloat(h.topk_logprobs[i]);
    EXPECT_TRUE(std::abs(static_cast<int>(d.topk_logprobs[i]) - h.topk_logprobs[i]) <= 1 ||
                std::abs(dv - hv) <= 1e-5f)
        << i << ": " << dv << " / " << hv;
  }
  ASSERT_EQ(d.tail_mass.size(), 3u);
  for (size_t j = 0; j < 3; ++j) EXPECT_NEAR(d.tail_mass[j], h.tail_mass[j], 1e-6) << j;
  EXPECT_EQ(ValidateRecord(b), "");
}

// A queued step holds a copy of its own rows, not a view of the batch it came from: the batch's
// storage is the caller's alone once AddStep returns, and the queue counts only the step's rows.
TEST_F(SampleLoggerTest, QueuedStepsHoldOnlyTheirOwnRows) {
  {
    SampleLoggerOptions o = TopK4();
    SampleLogger sl(logger_.get(), o);
    auto trace = sl.Begin("c", "cmpl-6", 0, SamplingParams(), {1, 10, 11});
    const at::Tensor batch = at::randn({16 * 3, 4096});  // 16 sequences' 3 rows each
    sl.AddStep(trace, 3, {20, 21}, 1, batch.narrow(0, 3, 3));
    EXPECT_EQ(batch.storage().use_count(), 1u);
    EXPECT_EQ(sl.peak_pending_bytes(), size_t{3 * 4096 * 4});
    sl.Finish(trace, {1, 10, 11, 20, 30});
  }
  ASSERT_TRUE(logger_->Close().ok());
  const std::vector<Record> got = Records();
  ASSERT_EQ(got.size(), 1u);
  ASSERT_EQ(got[0].steps.size(), 1u);
  EXPECT_EQ(got[0].steps[0].topk_ids.size(), 12u);
}

// The byte cap's traffic: a prompt of 10 tokens whose 9 prompt rows come as one chunk, then
// `steps` plain (k = 0) steps of one row, at vocab 4096 (16 KiB a row), as fast as the caller
// can push them; max_pending_steps is out of the way.
struct ByteCapRun {
  uint64_t dropped = 0;
  size_t peak_bytes = 0;
  size_t bytes_after_drain = 0;
  std::vector<Record> records;
};
constexpr int kByteCapSteps = 3000;
constexpr size_t kRowBytes = 4096 * sizeof(float);
constexpr size_t kByteCap = 4 * kRowBytes;  // less than the prompt chunk's 9 rows

ByteCapRun RunByteCapTraffic(size_t max_pending_bytes) {
  ByteCapRun run;
  serve_test::TempDir dir;
  std::unique_ptr<ReplayLogger> logger;
  EXPECT_TRUE(ReplayLogger::Open(BufferOptions(), LoggerOptions(), dir.path(), &logger).ok());
  {
    SampleLoggerOptions o;
    o.top_k = 8;
    o.max_pending_steps = 1u << 30;
    o.max_pending_bytes = max_pending_bytes;
    SampleLogger sl(logger.get(), o);
    std::vector<int> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    auto trace = sl.Begin("c", "cmpl-7", 0, SamplingParams(), tokens);
    const at::Tensor rows = at::randn({kByteCapSteps, 4096});
    sl.AddPromptRows(trace, 1, at::randn({9, 4096}));
    for (int i = 0; i < kByteCapSteps; ++i) {
      sl.AddStep(trace, static_cast<uint32_t>(tokens.size()), {}, 0, rows.narrow(0, i, 1));
      tokens.push_back(100 + i % 50);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (sl.pending_bytes() > 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    run.bytes_after_drain = sl.pending_bytes();
    sl.Finish(trace, tokens);
    run.dropped = sl.steps_dropped();
    run.peak_bytes = sl.peak_pending_bytes();
  }
  EXPECT_TRUE(logger->Close().ok());
  run.records = serve_test::ReadRecords(dir.path());
  return run;
}

// Past max_pending_bytes a step is dropped and counted (the 9-row prompt chunk always: it is
// larger than the cap alone), the queue never holds more than the cap, and every step that was
// queued is in the record, in order.
TEST(SampleLogger, ByteCapDropsAndCountsStepsPastItAndKeepsWhatIsQueued) {
  const ByteCapRun run = RunByteCapTraffic(kByteCap);
  EXPECT_GE(run.dropped, 9u);
  EXPECT_LE(run.peak_bytes, kByteCap);
  EXPECT_EQ(run.bytes_after_drain, 0u);
  ASSERT_EQ(run.records.size(), 1u);
  const Record& r = run.records[0];
  EXPECT_EQ(ValidateRecord(r), "");
  EXPECT_EQ(r.steps.size() + run.dropped, static_cast<size_t>(9 + kByteCapSteps));
  for (size_t i = 0; i < r.steps.size(); ++i) {
    EXPECT_GE(r.steps[i].start_pos, 10u);  // the prompt chunk was dropped whole
    if (i > 0) {
      EXPECT_GT(r.steps[i].start_pos, r.steps[i - 1].start_pos);
    }
  }
}

// The companion: the same traffic with no byte cap drops nothing and its queue goes past
// kByteCap (the prompt chunk alone does), so the test above fails if the cap is ignored.
TEST(SampleLogger, ByteCapCompanionWithoutTheCapTheQueueGoesPastIt) {
  const ByteCapRun run = RunByteCapTraffic(std::numeric_limits<size_t>::max());
  EXPECT_EQ(run.dropped, 0u);
  EXPECT_GT(run.peak_bytes, kByteCap);
  ASSERT_EQ(run.records.size(), 1u);
  EXPECT_EQ(run.records[0].steps.size(), static_cast<size_t>(9 + kByteCapSteps));
  EXPECT_EQ(run.records[0].steps[0].start_pos, 1u);
}

}  // namespace
}  // namespace specloop
