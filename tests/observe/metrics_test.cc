// Tests of common/metrics: exposition golden text, promtool acceptance (escaping, unicode,
// histograms), registration rules, the cardinality cap, and exact counts under concurrency.
#include "common/observe/metrics.h"
#include "common/observe/process_metrics.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

namespace specloop {
namespace metrics {
namespace {

// Runs `promtool check metrics` on `text` (through a temporary file on stdin). Returns false
// when promtool is missing; otherwise fills *rc and *output (stdout and stderr together).
bool RunPromtool(const std::string& text, int* rc, std::string* output) {
  if (std::system("command -v promtool >/dev/null 2>&1") != 0) return false;
  const char* tmpdir = std::getenv("TMPDIR");
  std::string path = std::string(tmpdir ? tmpdir : "/tmp") + "/specloop_metrics_XXXXXX";
  const int fd = mkstemp(path.data());
  EXPECT_GE(fd, 0);
  close(fd);
  std::ofstream(path, std::ios::binary) << text;
  FILE* p = popen(("promtool check metrics < '" + path + "' 2>&1").c_str(), "r");
  EXPECT_NE(p, nullptr);
  output->clear();
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) output->append(buf, n);
  const int status = pclose(p);
  *rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::remove(path.c_str());
  return true;
}

// Asserts that promtool accepts `text` with no lint problems.
void ExpectPromtoolClean(const std::string& text) {
  int rc = 0;
  std::string output;
  ASSERT_TRUE(RunPromtool(text, &rc, &output))
      << "promtool not found on PATH: install the Debian package 'prometheus' "
         "(scripts/install-deps.sh); this test does not skip without it";
  EXPECT_EQ(rc, 0) << "promtool output:\n" << output << "\ntext:\n" << text;
  EXPECT_EQ(output, "") << "text:\n" << text;
}

TEST(MetricsTest, GoldenExposition) {
  Registry r;
  Family<Counter>* requests;
  ASSERT_TRUE(r.AddCounter({"specloop_requests_total", "Requests served.\nBy domain \\ path.",
                            {"domain", "code"}},
                           &requests)
                  .ok());
  requests->Add({{"domain", "python"}, {"code", "200"}}).Increment(3);
  requests->Add({{"code", "500"}, {"domain", "a\"b\\c\nd"}}).Increment(0.5);
  Family<Gauge>* version;
  ASSERT_TRUE(r.AddGauge({"specloop_draft_version", "Draft version.", {}}, &version).ok());
  version->Add({}).Set(7);
  Family<Gauge>* empty;
  ASSERT_TRUE(r.AddGauge({"specloop_empty", "Never set.", {"domain"}}, &empty).ok());
  Family<Histogram>* tokens;
  ASSERT_TRUE(
      r.AddHistogram({"specloop_tokens_per_step", "Tokens per step.", {"domain"}}, {1, 2.5, 4},
                     &tokens)
          .ok());
  Histogram& h = tokens->WithLabelValues({"python"});
  h.Observe(1);  // le="1" is inclusive
  h.Observe(2);
  h.Observe(5);
  ASSERT_TRUE(r.AddCallbackGauge("specloop_buffer_lag_seconds", "Lag.", {{"reader", "trainer"}},
                                 [] { return 0.25; })
                  .ok());

  const std::string expected = R"txt(# HELP specloop_buffer_lag_seconds Lag.
# TYPE specloop_buffer_lag_seconds gauge
specloop_buffer_lag_seconds{reader="trainer"} 0.25
# HELP specloop_draft_version Draft version.
# TYPE specloop_draft_version gauge
specloop_draft_version 7
# HELP specloop_requests_total Requests served.\nBy domain \\ path.
# TYPE specloop_requests_total counter
specloop_requests_total{domain="a\"b\\c\nd",code="500"} 0.5
specloop_requests_total{domain="python",code="200"} 3
# HELP specloop_tokens_per_step Tokens per step.
# TYPE specloop_tokens_per_step histogram
specloop_tokens_per_step_bucket{domain="python",le="1"} 1
specloop_tokens_per_step_bucket{domain="python",le="2.5"} 2
specloop_tokens_per_step_bucket{domain="python",le="4"} 2
specloop_tokens_per_step_bucket{domain="python",le="+Inf"} 3
specloop_tokens_per_step_sum{domain="python"} 8
specloop_tokens_per_step_count{domain="python"} 3
)txt";
  EXPECT_EQ(r.Serialize(), expected);
  ExpectPromtoolClean(r.Serialize());
}

// A fleet's worker label: on every series of every type, first in the label set, and its name
// is reserved against families and callback gauges.
TEST(MetricsTest, ConstantLabelsGoOnEverySeries) {
  Registry r;
  ASSERT_TRUE(r.SetConstantLabels({{"worker", "2"}}).ok());
  Family<Counter>* requests;
  ASSERT_TRUE(r.AddCounter({"specloop_requests_total", "Requests.", {"domain"}}, &requests).ok());
  requests->Add({{"domain", "c"}}).Increment(2);
  Family<Gauge>* version;
  ASSERT_TRUE(r.AddGauge({"specloop_draft_version", "Draft version.", {}}, &version).ok());
  version->Add({}).Set(3);
  Family<Histogram>* steps;
  ASSERT_TRUE(r.AddHistogram({"specloop_step_seconds", "Step time.", {}}, {0.5}, &steps).ok());
  steps->Add({}).Observe(1);
  ASSERT_TRUE(r.AddCallbackGauge("specloop_lag", "Lag.", {{"reader", "t"}}, [] { return 1.0; })
                  .ok());
  const std::string expected = R"txt(# HELP specloop_draft_version Draft version.
# TYPE specloop_draft_version gauge
specloop_draft_version{worker="2"} 3
# HELP specloop_lag Lag.
# TYPE specloop_lag gauge
specloop_lag{worker="2",reader="t"} 1
# HELP specloop_requests_total Requests.
# TYPE specloop_requests_total counter
specloop_requests_total{worker="2",domain="c"} 2
# HELP specloop_step_seconds Step time.
# TYPE specloop_step_seconds histogram
specloop_step_seconds_bucket{worker="2",le="0.5"} 0
specloop_step_seconds_bucket{worker="2",le="+Inf"} 1
specloop_step_seconds_sum{worker="2"} 1
specloop_step_seconds_count{worker="2"} 1
)txt";
  EXPECT_EQ(r.Serialize(), expected);
  ExpectPromtoolClean(r.Serialize());

  Family<Gauge>* clash;
  EXPECT_TRUE(r.AddGauge({"specloop_x", "X.", {"worker"}}, &clash).IsInvalidArgument());
  EXPECT_TRUE(
      r.AddCallbackGauge("specloop_y", "Y.", {{"worker", "1"}}, [] { return 0.0; })
          .IsInvalidArgument());
  // Only before the first family, and only valid label names.
  EXPECT_FALSE(r.SetConstantLabels({{"worker", "3"}}).ok());
  Registry fresh;
  EXPECT_TRUE(fresh.SetConstantLabels({{"le", "1"}}).IsInvalidArgument());
  EXPECT_TRUE(fresh.SetConstantLabels({{"Worker", "1"}}).IsInvalidArgument());
}

TEST(MetricsTest, PromtoolAcceptsEscapingUnicodeAndHistograms) {
  Registry r;
  Family<Counter>* c;
  ASSERT_TRUE(r.AddCounter({"specloop_generated_tokens_total",
                            "Tokens \"generated\" \\ per domain\nsecond line, caf\xc3\xa9.",
                            {"domain"}},
                           &c)
                  .ok());
  const std::vector<std::string> values = {
      "quote\"inside", "back\\slash", "trailing\\", "new\nline", "\\n literal",
      "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e",  // Japanese
      "rocket \xf0\x9f\x9a\x80",               // 4-byte UTF-8
      "bad \xff\xfe utf8", "truncated \xe6\x97", "tab\there", "", "{}=,",
  };
  for (size_t i = 0; i < values.size(); ++i) c->Add({{"domain", values[i]}}).Increment(i + 1);
  Family<Histogram>* h;
  ASSERT_TRUE(r.AddHistogram({"specloop_request_duration_seconds", "Request duration.",
                              {"domain", "model"}},
                             ExponentialBuckets(0.001, 10, 5), &h)
                  .ok());
  for (const std::string& v : values) {
    Histogram& child = h->Add({{"domain", v}, {"model", "draft \"v2\""}});
    child.Observe(0.0005);
    child.Observe(0.5);
    child.Observe(1e9);
    child.Observe(-1);
  }
  Family<Gauge>* g;
  ASSERT_TRUE(r.AddGauge({"specloop_speculation_length", "K.", {"domain"}}, &g).ok());
  g->Add({{"domain", "nan"}}).Set(std::numeric_limits<double>::quiet_NaN());
  g->Add({{"domain", "inf"}}).Set(std::numeric_limits<double>::infinity());
  g->Add({{"domain", "-inf"}}).Set(-std::numeric_limits<double>::infinity());
  g->Add({{"domain", "tiny"}}).Set(1e-300);
  const std::string text = r.Serialize();
  // Invalid UTF-8 is replaced, so the exposition is valid UTF-8 whatever the request said.
  EXPECT_NE(text.find("bad \xef\xbf\xbd\xef\xbf\xbd utf8"), std::string::npos);
  EXPECT_EQ(text.find('\xff'), std::string::npos);
  EXPECT_NE(text.find("domain=\"new\\nline\""), std::string::npos);
  ExpectPromtoolClean(text);
}

// Companion: promtool does reject what we must never produce, so the clean checks above can
// fail.
TEST(MetricsTest, PromtoolRejectsBrokenText) {
  int rc = 0;
  std::string output;
  ASSERT_TRUE(RunPromtool("# HELP a_total x\n# TYPE a_total counter\na_total{d=\"q\"q\"} 1\n",
                          &rc, &output))
      << "promtool not found on PATH: install the Debian package 'prometheus'";
  EXPECT_NE(rc, 0);
  ASSERT_TRUE(RunPromtool("# TYPE a counter\na 1\n", &rc, &output));  // no help, no _total
  EXPECT_NE(rc, 0);
  EXPECT_NE(output, "");
}

TEST(MetricsTest, FormatAndEscapeHelpers) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(8000000), "8000000");
  EXPECT_EQ(FormatValue(-3), "-3");
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(FormatValue(1e-7), "1e-07");
  EXPECT_EQ(FormatValue(1e300), "1e+300");
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatValue(std::nan("")), "NaN");
  EXPECT_EQ(std::stod(FormatValue(0.1 + 0.2)), 0.1 + 0.2);  // round-trips
  EXPECT_EQ(EscapeLabelValue("a\\b\"c\nd\te"), "a\\\\b\\\"c\\nd\te");
  EXPECT_EQ(EscapeHelp("a\\b\"c\nd"), "a\\\\b\"c\\nd");
  EXPECT_EQ(SanitizeUtf8("ok \xc3\xa9 \xf0\x9f\x9a\x80"), "ok \xc3\xa9 \xf0\x9f\x9a\x80");
  EXPECT_EQ(SanitizeUtf8("\xc0\xaf"), "\xef\xbf\xbd\xef\xbf\xbd");      // overlong
  EXPECT_EQ(SanitizeUtf8("\xed\xa0\x80"), "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");  // surrogate
  EXPECT_EQ(SanitizeUtf8("x\xe6\x97"), "x\xef\xbf\xbd\xef\xbf\xbd");    // truncated
}

TEST(MetricsTest, RegistrationRules) {
  Registry r;
  Family<Counter>* c = nullptr;
  Family<Gauge>* g = nullptr;
  Family<Histogram>* h = nullptr;
  EXPECT_TRUE(r.AddCounter({"requests", "h", {}}, &c).IsInvalidArgument());  // no _total
  EXPECT_TRUE(r.AddGauge({"queue_total", "h", {}}, &g).IsInvalidArgument());
  EXPECT_TRUE(r.AddGauge({"queue_count", "h", {}}, &g).IsInvalidArgument());
  EXPECT_TRUE(r.AddGauge({"queueLength", "h", {}}, &g).IsInvalidArgument());
  EXPECT_TRUE(r.AddGauge({"a:b", "h", {}}, &g).IsInvalidArgument());
  EXPECT_TRUE(r.AddGauge({"__x", "h", {}}, &g).IsInvalidArgument());
  EXPECT_TRUE(r.AddGauge({"1x", "h", {}}, &g).IsInvalidArgument());
  EXPECT_TRUE(r.AddGauge({"x", "", {}}, &g).IsInvalidArgument());  // no help
  EXPECT_TRUE(r.AddGauge({"x", "h", {"le"}}, &g).IsInvalidArgument());
  EXPECT_TRUE(r.AddGauge({"x", "h", {"quantile"}}, &g).IsInvalidArgument());
  EXPECT_TRUE(r.AddGauge({"x", "h", {"a", "a"}}, &g).IsInvalidArgument());
  EXPECT_TRUE(r.AddGauge({"x", "h", {"Domain"}}, &g).IsInvalidArgument());
  EXPECT_TRUE(r.AddGauge({"x", "h", {"d"}, 0}, &g).IsInvalidArgument());
  EXPECT_TRUE(r.AddGauge({"x", "h", {"d"}, 4, ""}, &g).IsInvalidArgument());
  EXPECT_TRUE(r.AddHistogram({"x", "h", {}}, {}, &h).IsInvalidArgument());
  EXPECT_TRUE(r.AddHistogram({"x", "h", {}}, {1, 1}, &h).IsInvalidArgument());
  EXPECT_TRUE(r.AddHistogram({"x", "h", {}}, {2, 1}, &h).IsInvalidArgument());
  EXPECT_TRUE(r.AddHistogram({"x", "h", {}}, {std::nan("")}, &h).IsInvalidArgument());
  EXPECT_EQ(r.Serialize(), "");

  ASSERT_TRUE(r.AddCounter({"steps_total", "Steps.", {"domain"}}, &c).ok());
  Family<Counter>* again = nullptr;
  ASSERT_TRUE(r.AddCounter({"steps_total", "Steps.", {"domain"}}, &again).ok());
  EXPECT_EQ(again, c);  // identical spec: the same family
  EXPECT_TRUE(r.AddCounter({"steps_total", "Other help.", {"domain"}}, &again).IsInvalidArgument());
  EXPECT_TRUE(r.AddCounter({"steps_total", "Steps.", {"model"}}, &again).IsInvalidArgument());
  EXPECT_TRUE(r.AddCounter({"steps_total", "Steps.", {"domain"}, 8}, &again).IsInvalidArgument());

  const double inf = std::numeric_limits<double>::infinity();
  ASSERT_TRUE(r.AddHistogram({"lat_seconds", "L.", {}}, {1, 2, inf}, &h).ok());
  EXPECT_EQ(h->Add({}).bounds(), (std::vector<double>{1, 2}));  // trailing +Inf dropped
  Family<Histogram>* h2 = nullptr;
  EXPECT_TRUE(r.AddHistogram({"lat_seconds", "L.", {}}, {1, 2}, &h2).ok());
  EXPECT_EQ(h2, h);
  EXPECT_TRUE(r.AddHistogram({"lat_seconds", "L.", {}}, {1, 3}, &h2).IsInvalidArgument());
  EXPECT_TRUE(r.AddGauge({"lat_seconds", "L.", {}}, &g).IsInvalidArgument());  // type clash
  // A histogram's derived series collide with an existing family.
  ASSERT_TRUE(r.AddCounter({"tokens_sum_total", "T.", {}}, &c).ok());
  EXPECT_TRUE(r.AddHistogram({"tokens_sum", "T.", {}}, {1}, &h2).ok());  // tokens_sum_sum: fine
  ASSERT_TRUE(r.AddHistogram({"queue", "Q.", {}}, {1}, &h2).ok());
  EXPECT_TRUE(r.AddHistogram({"queue_seconds", "Q.", {}}, {1}, &h2).ok());
  EXPECT_TRUE(r.AddCallbackGauge("queue", "Q.", {}, [] { return 1.0; }).IsInvalidArgument());
  EXPECT_TRUE(r.AddCallbackGauge("cb", "C.", {}, nullptr).IsInvalidArgument());
  ExpectPromtoolClean(r.Serialize());
}

TEST(MetricsTest, HistogramNameCollision) {
  Registry r;
  Family<Histogram>* h = nullptr;
  Family<Histogram>* other = nullptr;
  ASSERT_TRUE(r.AddHistogram({"size", "S.", {}}, {1}, &h).ok());
  // "size_bucket" may not be a histogram name of its own while "size" exposes size_bucket.
  EXPECT_TRUE(r.AddHistogram({"size_bucket", "S.", {}}, {1}, &other).IsInvalidArgument());
  EXPECT_TRUE(r.AddHistogram({"size_count", "S.", {}}, {1}, &other).IsInvalidArgument());
  ASSERT_TRUE(r.AddHistogram({"x_bytes", "X.", {}}, {1}, &other).ok());
  EXPECT_TRUE(r.AddHistogram({"x", "X.", {}}, {1}, &other).ok());  // x_bucket etc. are free
  Registry r2;
  ASSERT_TRUE(r2.AddHistogram({"y_bucket", "Y.", {}}, {1}, &other).ok());
  EXPECT_TRUE(r2.AddHistogram({"y", "Y.", {}}, {1}, &other).IsInvalidArgument());
}

TEST(MetricsTest, LabelMismatchAborts) {
  Registry r;
  Family<Counter>* c;
  ASSERT_TRUE(r.AddCounter({"a_total", "A.", {"domain"}}, &c).ok());
  EXPECT_DEATH(c->Add({{"model", "x"}}), "missing label domain");
  EXPECT_DEATH(c->Add({}), "got 0 labels");
  EXPECT_DEATH(c->WithLabelValues({"x", "y"}), "got 2 values");
}

TEST(MetricsTest, CardinalityCapFoldsIntoOverflowChild) {
  Registry r;
  Family<Counter>* c;
  ASSERT_TRUE(r.AddCounter({"specloop_requests_total", "Requests.", {"domain", "model"}, 3},
                           &c).ok());
  bool folded = true;
  Counter& a = c->Add({{"domain", "a"}, {"model", "m"}}, &folded);
  EXPECT_FALSE(folded);
  c->Add({{"domain", "b"}, {"model", "m"}}).Increment();
  // The overflow label set itself, under the cap: it does not count against the cap.
  Counter& other = c->Add({{"domain", "other"}, {"model", "other"}}, &folded);
  EXPECT_FALSE(folded);
  c->Add({{"domain", "c"}, {"model", "m"}}, &folded).Increment();
  EXPECT_FALSE(folded);
  EXPECT_EQ(c->size(), 4u);
  // Past the cap: new label sets fold into the overflow child; existing ones do not.
  Counter& d = c->Add({{"domain", "d"}, {"model", "m"}}, &folded);
  EXPECT_TRUE(folded);
  EXPECT_EQ(&d, &other);
  Counter& e = c->WithLabelValues({"e", "m"}, &folded);
  EXPECT_TRUE(folded);
  EXPECT_EQ(&e, &other);
  EXPECT_EQ(&c->Add({{"domain", "a"}, {"model", "m"}}, &folded), &a);
  EXPECT_FALSE(folded);
  d.Increment(2);
  e.Increment(3);
  EXPECT_EQ(other.Value(), 5);
  EXPECT_EQ(c->size(), 4u);
  EXPECT_EQ(c->folded_count(), 2u);
  const std::string text = r.Serialize();
  EXPECT_NE(text.find("specloop_requests_total{domain=\"other\",model=\"other\"} 5\n"),
            std::string::npos) << text;
  EXPECT_EQ(text.find("domain=\"d\""), std::string::npos) << text;

  // A cap of 1 with a custom overflow value, on a gauge family.
  Family<Gauge>* g;
  ASSERT_TRUE(r.AddGauge({"specloop_k", "K.", {"domain"}, 1, "_overflow"}, &g).ok());
  g->Add({{"domain", "x"}}).Set(1);
  g->Add({{"domain", "y"}}).Set(2);
  g->Add({{"domain", "z"}}).Increment(1);
  EXPECT_EQ(g->Add({{"domain", "_overflow"}}).Value(), 3);
  EXPECT_EQ(g->size(), 2u);
  ExpectPromtoolClean(r.Serialize());
}

TEST(MetricsTest, CallbackGaugeReadAtScrapeAndRemoved) {
  Registry r;
  std::atomic<int> value{1};
  std::atomic<int> calls{0};
  ASSERT_TRUE(r.AddCallbackGauge("specloop_buffer_lag_records", "Lag.", {}, [&] {
                 ++calls;
                 return static_cast<double>(value.load());
               }).ok());
  EXPECT_NE(r.Serialize().find("specloop_buffer_lag_records 1\n"), std::string::npos);
  value = 42;
  EXPECT_NE(r.Serialize().find("specloop_buffer_lag_records 42\n"), std::string::npos);
  EXPECT_EQ(calls.load(), 2);
  EXPECT_TRUE(r.AddCallbackGauge("specloop_buffer_lag_records", "Lag.", {}, [] { return 0.0; })
                  .IsInvalidArgument());
  EXPECT_TRUE(r.RemoveCallbackGauge("specloop_buffer_lag_records").ok());
  EXPECT_EQ(r.Serialize(), "");
  EXPECT_EQ(calls.load(), 2);
  EXPECT_TRUE(r.RemoveCallbackGauge("specloop_buffer_lag_records").IsNotFound());
  Family<Gauge>* g;
  ASSERT_TRUE(r.AddGauge({"plain", "P.", {}}, &g).ok());
  EXPECT_TRUE(r.RemoveCallbackGauge("plain").IsNotFound());  // only callback gauges
}

TEST(MetricsTest, CounterIgnoresNegativeAndNaN) {
  Counter c;
  c.Increment(2);
  c.Increment(-1);
  c.Increment(std::nan(""));
  EXPECT_EQ(c.Value(), 2);
  Gauge g;
  g.Increment(2);
  g.Decrement(5);
  EXPECT_EQ(g.Value(), -3);
  Histogram h({1});
  h.Observe(std::nan(""));
  EXPECT_EQ(h.Collect().count, 0u);
}

// 8 threads x 1e6 increments on shared children while other threads create and look up
// children and serialize: nothing is lost, and histogram counts and sums are exact.
TEST(MetricsTest, ConcurrentUpdatesLoseNothing) {
  Registry r;
  Family<Counter>* c;
  Family<Gauge>* g;
  Family<Histogram>* h;
  ASSERT_TRUE(r.AddCounter({"steps_total", "S.", {"domain"}, 1000}, &c).ok());
  ASSERT_TRUE(r.AddGauge({"in_flight", "G.", {}}, &g).ok());
  ASSERT_TRUE(r.AddHistogram({"accepted_tokens", "H.", {"domain"}}, {1, 2, 3}, &h).ok());
  Counter& shared = c->Add({{"domain", "shared"}});
  Gauge& gauge = g->Add({});
  Histogram& hist = h->Add({{"domain", "shared"}});

  constexpr int kThreads = 8;
  constexpr int kIters = 1000000;
  constexpr int kHistIters = 200000;
  std::atomic<bool> done{false};
  std::thread scraper([&] {
    while (!done.load()) {
      const std::string text = r.Serialize();
      ASSERT_NE(text.find("steps_total{domain=\"shared\"}"), std::string::npos);
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kIters; ++i) {
        shared.Increment();
        if (i % 1000 == 0) {
          // Concurrent creation and lookup: domains d0..d99, each hit 10 times per thread.
          c->Add({{"domain", "d" + std::to_string((i / 1000 + t) % 100)}}).Increment();
        }
      }
      for (int i = 0; i < kHistIters; ++i) {
        hist.Observe(0.5 * (i % 8));  // 0, 0.5, ..., 3.5: exact in binary
        gauge.Increment(t % 2 ? 1.0 : -1.0);
      }
    });
  }
  for (auto& th : threads) th.join();
  done = true;
  scraper.join();

  EXPECT_EQ(shared.Value(), double{kThreads} * kIters);
  EXPECT_EQ(c->size(), 101u);
  for (int d = 0; d < 100; ++d) {
    EXPECT_EQ(c->Add({{"domain", "d" + std::to_string(d)}}).Value(), kThreads * 10) << d;
  }
  EXPECT_EQ(gauge.Value(), 0);
  const Histogram::Snapshot s = hist.Collect();
  const uint64_t n = uint64_t{kThreads} * kHistIters;
  EXPECT_EQ(s.count, n);
  // Per thread, values cycle through 0..3.5 in steps of 0.5: mean 1.75.
  EXPECT_EQ(s.sum, 1.75 * n);
  // le=1: 0, 0.5, 1 (3 of 8); le=2: 5 of 8; le=3: 7 of 8; +Inf: all.
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{n * 3 / 8, n * 5 / 8, n * 7 / 8, n}));
}

// Resident memory is read from /proc: it grows by what this process touches, and the gauge
// reports it at scrape time.
TEST(ProcessMetrics, ResidentMemoryFollowsTouchedPages) {
  const uint64_t before = ResidentBytes();
  ASSERT_GT(before, 0u);
  std::vector<char> block(64 << 20);
  for (size_t i = 0; i < block.size(); i += 4096) block[i] = static_cast<char>(i);
  const uint64_t after = ResidentBytes();
  EXPECT_GE(after, before + (48 << 20));
  EXPECT_NEAR(static_cast<double>(ResidentBytes(getpid())), static_cast<double>(after), 4 << 20);
  EXPECT_EQ(ResidentBytes(999999999), 0u);  // no such process

  Registry r;
  ASSERT_TRUE(AddProcessMetrics(&r).ok());
  const std::string text = r.Serialize();
  const std::string name = "\nprocess_resident_memory_bytes ";
  const size_t at = text.find(name);
  ASSERT_NE(at, std::string::npos) << text;
  EXPECT_GE(std::stod(text.substr(at + name.size())), static_cast<double>(after) * 0.9);
  EXPECT_TRUE(AddProcessMetrics(&r).IsInvalidArgument());  // once per registry
  EXPECT_EQ(block[4096], static_cast<char>(4096));  // keeps the block alive until here
}

}  // namespace
}  // namespace metrics
}  // namespace specloop
