// A record of synthetic traffic (trainer/synthetic_traffic.h) and the record serving's
// SampleLogger (serve/sample_logger.h) logs for the same decoding are the same record: the same
// prompt rows, the same top-K entries bit for bit, the same tails. The target is a "bigram"
// Llama (its logits after token t are a fixed table row, whatever came before), so the rows
// serving would hand the logger are known from the tokens alone.
#include <cmath>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include "buffer/replay_logger.h"
#include "serve/sample_logger.h"
#include "tests/serve/buffer_records.h"
#include "tests/common/test_models.h"
#include "tests/testing/temp_dir.h"
#include "trainer/synthetic_traffic.h"

namespace specloop {
namespace {

constexpr int kVocab = 24;

// The target's rows after each of `prev` (one forward on a fresh cache): [prev.size(), V].
at::Tensor RowsAfter(const LlamaModel& model, const std::vector<int>& prev) {
  c10::InferenceMode guard;
  KVCache cache = model.NewCache(static_cast<int64_t>(prev.size()) + 1);
  ForwardInput in;
  in.cache = &cache;
  in.tokens.assign(prev.begin(), prev.end());
  in.all_logits = true;
  return model.Forward({in}).to(at::kCPU, at::kFloat).contiguous();
}

TEST(RecordParity, SyntheticTrafficAndTheSampleLoggerBuildTheSameRecord) {
  at::manual_seed(3);
  // Rounded scores: ties inside each row, so the tie rule is exercised too.
  const at::Tensor target_table = (at::rand({kVocab, kVocab}, at::kDouble) * 8).round() / 2;
  const at::Tensor draft_table = target_table + at::randn({kVocab, kVocab}, at::kDouble) * 0.5;
  std::unique_ptr<LlamaModel> target = testing::BigramModel(target_table);
  std::unique_ptr<LlamaModel> draft = testing::BigramModel(draft_table);
  ASSERT_TRUE(target && draft);

  trainer::TrafficOptions o;
  o.k = 3;
  o.max_tokens = 24;
  o.top_k = 6;
  o.temperature = 1.0f;
  o.seed = 17;
  const std::vector<int> prompt = {0, 5, 9, 9, 2};
  Record synthetic;
  const Status s = trainer::DecodeToRecord(*target, *draft, prompt, "chat", "r-1", o, &synthetic);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(ValidateRecord(synthetic), "");

  // Serving's logger, handed what the scheduler hands it for the same request: the prefill's
  // rows at prompt positions 1 .. prompt_len - 1, then each step's k + 1 rows.
  testing::TempDir dir;
  std::unique_ptr<ReplayLogger> logger;
  ASSERT_TRUE(ReplayLogger::Open(BufferOptions(), LoggerOptions(), dir.path(), &logger).ok());
  size_t prompt_rows = 0, decoding_steps = 0, accepted = 0;
  {
    SampleLoggerOptions lo;
    lo.top_k = o.top_k;
    lo.target_id = "target";
    SampleLogger sl(logger.get(), lo);
    auto trace = sl.Begin("chat", "r-1", 0, synthetic.sampling, prompt);
    const std::vector<int> prefix(prompt.begin(), prompt.end() - 1);
    sl.AddPromptRows(trace, 1, RowsAfter(*target, prefix));
    const std::vector<int32_t>& tokens = synthetic.tokens;
    for (const SpecStep& st : synthetic.steps) {
      if (st.start_pos < synthetic.prompt_len) {
        ++prompt_rows;
        continue;
      }
      ++decoding_steps;
      accepted += st.num_accepted;
      ASSERT_LE(st.start_pos, tokens.size());
      std::vector<int> prev = {tokens[st.start_pos - 1]};
      prev.insert(prev.end(), st.draft_tokens.begin(), st.draft_tokens.end());
      const std::vector<int> drafts(st.draft_tokens.begin(), st.draft_tokens.end());
      sl.AddStep(trace, st.start_pos, drafts, static_cast<int>(st.num_accepted),
                 RowsAfter(*target, prev));
    }
    sl.Finish(trace, std::vector<int>(tokens.begin(), tokens.end()));
    EXPECT_EQ(sl.steps_dropped(), 0u);
  }
  ASSERT_TRUE(logger->Close().ok());
  EXPECT_EQ(prompt_rows, prompt.size() - 1);
  EXPECT_GT(decoding_steps, 3u);
  EXPECT_GT(accepted, 0u);  // the draft is close: a step's later rows follow accepted drafts
  std::cout << "synthetic record: " << prompt_rows << " prompt rows, " << decoding_steps
            << " decoding steps, " << accepted << " drafts accepted\n";

  const std::vector<Record> logged = serve_test::ReadRecords(dir.path());
  ASSERT_EQ(logged.size(), 1u);
  Record served = logged[0];
  EXPECT_NE(served.time_us, 0u);  // the ReplayLogger stamps it; synthetic traffic leaves 0
  served.time_us = synthetic.time_us;
  ASSERT_EQ(served.steps.size(), synthetic.steps.size());
  for (size_t i = 0; i < served.steps.size(); ++i) {
    EXPECT_EQ(served.steps[i], synthetic.steps[i]) << "step " << i;
  }
  EXPECT_EQ(served, synthetic);
}

}  // namespace
}  // namespace specloop
