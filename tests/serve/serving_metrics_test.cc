#include "serve/serving_metrics.h"

#include <fstream>

#include <gtest/gtest.h>

#include "buffer/replay_logger.h"
#include "tests/buffer/test_util.h"
#include "tests/serve/test_util.h"

namespace specloop {
namespace {

TEST(ServingMetrics, FoldsDomainsPastTheCapIntoOther) {
  ServingMetricsOptions o;
  o.max_domains = 3;
  std::unique_ptr<ServingMetrics> m;
  ASSERT_TRUE(ServingMetrics::Create(o, &m).ok());
  EXPECT_EQ(m->DomainLabel("a"), "a");
  EXPECT_EQ(m->DomainLabel("b"), "b");
  EXPECT_EQ(m->DomainLabel("c"), "c");
  EXPECT_EQ(m->DomainLabel("d"), "other");
  EXPECT_EQ(m->DomainLabel("a"), "a");
  for (int i = 0; i < 50; ++i) {
    auto* d = m->ForDomain(m->DomainLabel("dom" + std::to_string(i)));
    m->ObserveStep(d, 4, 4, 2, 3);
  }
  const std::string text = m->Render(nullptr, nullptr);
  EXPECT_NE(text.find("specloop_spec_steps_total{domain=\"other\"} 50"), std::string::npos);
  EXPECT_EQ(text.find("dom7"), std::string::npos);
}

TEST(ServingMetrics, SpeedOverPlainIsPlainStepSecondsOverStepSecondsPerToken) {
  std::unique_ptr<ServingMetrics> m;
  ASSERT_TRUE(ServingMetrics::Create(ServingMetricsOptions(), &m).ok());
  auto* python = m->ForDomain(m->DomainLabel("python"));
  auto* legal = m->ForDomain(m->DomainLabel("legal"));
  // python: steps of 10 ms emitting 3 tokens where a plain step takes 8 ms: 2.4x plain.
  for (int i = 0; i < 5; ++i) m->ObserveDecodeTime(python, 0.010, 3, 0.008);
  // legal: one token per 10 ms step at a plain step of 8 ms (0.8x), then a step before any
  // plain estimate, which counts in neither total.
  m->ObserveDecodeTime(legal, 0.010, 1, 0.008);
  m->ObserveDecodeTime(legal, 0.010, 5, 0.0);
  m->ObserveStep(python, 4, 4, 2, 3);
  m->ObserveStep(python, 4, 4, 4, 5);
  m->ObserveBlockStep(python, ServingMetrics::Block::kSuffix, 6, 6, 7);  // not the draft's: out of its acceptance length
  const std::map<std::string, ServingMetrics::DomainTotals> t = m->Totals();
  ASSERT_EQ(t.size(), 2u);
  EXPECT_NEAR(t.at("python").plain_seconds / t.at("python").decode_seconds, 2.4, 1e-9);
  EXPECT_NEAR(t.at("legal").plain_seconds / t.at("legal").decode_seconds, 0.8, 1e-9);
  EXPECT_EQ(t.at("python").drafts, 2);
  EXPECT_EQ(t.at("python").accepted, 6);  // mean acceptance length 1 + 6 / 2
  EXPECT_EQ(t.at("python").generated, 15);
  const std::string text = m->Render(nullptr, nullptr);
  EXPECT_NE(text.find("specloop_decode_seconds_total{domain=\"legal\"} 0.01"), std::string::npos)
      << text;
  EXPECT_NE(text.find("specloop_plain_equivalent_seconds_total{domain=\"legal\"} 0.008"),
            std::string::npos);
}

TEST(ServingMetrics, ExposesAlphaWindowsDriftAndPassesPromtool) {
  std::unique_ptr<ServingMetrics> m;
  ASSERT_TRUE(ServingMetrics::Create(ServingMetricsOptions(), &m).ok());
  auto* prose = m->ForDomain(m->DomainLabel("prose"));
  auto* code = m->ForDomain(m->DomainLabel("python"));
  // prose: alpha 0.9 then a drop to 0.2 (a drift event); python steady at 0.5.
  for (int i = 0; i < 400; ++i) m->ObserveStep(prose, 4, 4, i % 10 == 0 ? 3 : 4, 4);
  for (int i = 0; i < 200; ++i) m->ObserveStep(prose, 4, 4, i % 5 == 0 ? 4 : 0, 1);
  for (int i = 0; i < 300; ++i) {  // alpha*: 2 of 2 tested positions, or 0.5 of 1
    m->ObserveStep(code, 2, 2, i % 2 ? 2 : 0, 2, i % 2 ? 2 : 0.5, i % 2 ? 2 : 1);
  }
  for (int i = 0; i < 50; ++i) m->ObserveStep(code, 0, 0, 0, 1);  // plain steps: no draft
  m->ObserveRequest(prose, "stop", 0.2, 0.01, 10);
  m->ObserveTargetForward(0.001, 4);
  m->ObserveHttpError(400);
  m->SetDraftVersion(0);
  m->SetDraftKind("eagle3");
  const std::string text = m->Render(nullptr, nullptr);
  for (const char* want : {"specloop_acceptance_rate{domain=\"prose\",window=\"short\"}",
                           "specloop_acceptance_rate{domain=\"prose\",window=\"long\"}",
                           "specloop_acceptance_drift{domain=\"python\"}",
                           "specloop_acceptance_drift_events_total{domain=\"prose\",direction=\"down\"}",
                           "specloop_tokens_per_step_bucket{domain=\"python\",le=\"2\"}",
                           "specloop_requests_total{domain=\"prose\",finish_reason=\"stop\"} 1",
                           "specloop_draft_version 0",
                           "specloop_draft_info{kind=\"eagle3\"} 1",
                           "specloop_draft_info{kind=\"model\"} 0",
                           // python: 150 steps of 2 of 2 accepted, 150 of 0 of 2; 50 plain.
                           "specloop_spec_steps_total{domain=\"python\"} 350",
                           "specloop_drafts_total{domain=\"python\"} 300",
                           "specloop_accepted_tokens_by_position_total{domain=\"python\",position=\"1\"} 150"}) {
    EXPECT_NE(text.find(want), std::string::npos) << want;
  }
  // Per tested token: 300 accepted of 300 + 150 tested; alpha* 0.5 on the rejected ones;
  // mean acceptance length 1 + 1 per drafting step (the long window, half-life 500 steps,
  // weighs the two kinds of steps alike as they alternate).
  auto gauge = [&](const std::string& series) {
    const size_t at = text.find(series + " ");
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + series.size() + 1));
  };
  EXPECT_NEAR(gauge("specloop_acceptance_rate{domain=\"python\",window=\"long\"}"), 2.0 / 3,
              0.01);
  EXPECT_NEAR(gauge("specloop_optimal_acceptance_rate{domain=\"python\"}"), 2.5 / 3, 0.01);
  EXPECT_NEAR(gauge("specloop_mean_acceptance_length{domain=\"python\"}"), 2.0, 0.01);
  EXPECT_LT(gauge("specloop_optimal_acceptance_rate{domain=\"prose\"}"), 0);  // never observed
  auto readings = m->drift().Snapshot();
  ASSERT_EQ(readings.size(), 2u);
  EXPECT_EQ(readings[0].domain, "prose");
  EXPECT_GE(readings[0].down_events, 1u);  // prose fell
  EXPECT_EQ(readings[1].up_events + readings[1].down_events, 0u);  // python steady
  serve_test::TempDir dir;
  const std::string path = dir.path() + "/metrics.txt";
  std::ofstream(path) << text;
  std::string out;
  EXPECT_EQ(serve_test::RunCommand("promtool check metrics < " + path + " 2>&1", &out), 0) << out;
}

// With a logger, a scrape reports the buffer's size and RocksDB memory and the process's RSS.
TEST(ServingMetrics, CudaGraphSeriesAppearOnlyOnceSetAndFollowTheModelServingNow) {
  std::unique_ptr<ServingMetrics> m;
  ASSERT_TRUE(ServingMetrics::Create(ServingMetricsOptions(), &m).ok());
  // A CPU server never sets them: the families' help lines only, no series.
  std::string text = m->Render(nullptr, nullptr);
  EXPECT_EQ(text.find("specloop_cuda_graphs{"), std::string::npos) << text;
  m->SetCudaGraphs("target", 12, 0);
  m->SetCudaGraphs("draft", 7, 1);
  m->SetCudaGraphs("draft", 2, 0);  // a new draft: its own counts
  text = m->Render(nullptr, nullptr);
  EXPECT_NE(text.find("specloop_cuda_graphs{model=\"target\"} 12"), std::string::npos) << text;
  EXPECT_NE(text.find("specloop_cuda_graphs{model=\"draft\"} 2"), std::string::npos) << text;
  EXPECT_NE(text.find("specloop_cuda_graph_capture_failures{model=\"draft\"} 0"),
            std::string::npos)
      << text;
}

TEST(ServingMetrics, ExposesBufferSizeMemoryAndResidentMemory) {
  std::unique_ptr<ServingMetrics> m;
  ASSERT_TRUE(ServingMetrics::Create(ServingMetricsOptions(), &m).ok());
  testing::TempDir dir;
  std::unique_ptr<ReplayLogger> logger;
  ASSERT_TRUE(ReplayLogger::Open(BufferOptions(), LoggerOptions(), dir.path(), &logger).ok());
  Rng rng(3);
  for (int i = 0; i < 50; ++i) {
    Record r = testing::RandomRecord(&rng);
    ASSERT_TRUE(logger->Log(&r));
  }
  ASSERT_TRUE(logger->Flush().ok());
  const std::string text = m->Render(logger.get(), nullptr);
  auto value = [&](const std::string& series) {
    const size_t at = text.find("\n" + series + " ");
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + series.size() + 2));
  };
  EXPECT_EQ(value("specloop_buffer_records_written_total"), 50);
  EXPECT_GT(value("specloop_buffer_bytes"), 0);
  EXPECT_GE(value("specloop_buffer_memory_bytes{kind=\"memtables\"}"), 0);
  EXPECT_GE(value("specloop_buffer_memory_bytes{kind=\"table_readers\"}"), 0);
  EXPECT_GE(value("specloop_buffer_memory_bytes{kind=\"block_cache\"}"), 0);
  EXPECT_GT(value("process_resident_memory_bytes"), 1 << 20);
  ASSERT_TRUE(logger->Close().ok());
  const std::string path = dir.path() + "/metrics.txt";
  std::ofstream(path) << text;
  std::string out;
  EXPECT_EQ(serve_test::RunCommand("promtool check metrics < " + path + " 2>&1", &out), 0) << out;
}

}  // namespace
}  // namespace specloop
