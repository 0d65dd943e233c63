// Tests of common/acceptance_drift: window closed forms, step changes detected within a bound,
// no false alarm on stationary streams (and a mis-tuned detector that does false-alarm), no
// reading or event moved by a change of k alone, the bounded domain map.
#include "common/observe/acceptance_drift.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "common/base/rng.h"

namespace specloop {
namespace {

// Detection off: the windows alone.
DriftOptions NoDetection(double short_half_life, double long_half_life) {
  DriftOptions o;
  o.short_half_life = short_half_life;
  o.long_half_life = long_half_life;
  o.threshold = 1e300;
  return o;
}

// The windows over one-token steps (tested tokens x_i), straight from the definition.
double ClosedForm(const std::vector<double>& xs, double half_life) {
  const double r = std::pow(2.0, -1.0 / half_life);
  double num = 0.0, den = 0.0;
  const size_t n = xs.size();
  for (size_t i = 0; i < n; ++i) {
    const double w = std::pow(r, static_cast<double>(n - 1 - i));
    num += w * xs[i];
    den += w;
  }
  return num / den;
}

// One speculative step of `k` drafted tokens, each accepted with probability `p` until the
// first rejection: returns the accepted count.
int Step(Rng* rng, double p, int k) {
  int a = 0;
  while (a < k && rng->Uniform() < p) ++a;
  return a;
}

// A one-token step: accepted (1) with probability p.
int Bernoulli(Rng* rng, double p) { return rng->Uniform() < p ? 1 : 0; }

TEST(AcceptanceDriftTest, WindowsMatchClosedForm) {
  AcceptanceDrift d(NoDetection(4, 64));
  EXPECT_EQ(d.short_alpha(), 0.0);
  EXPECT_EQ(d.long_alpha(), 0.0);
  std::vector<double> xs;
  Rng rng(7);
  for (int i = 0; i < 300; ++i) {
    const int x = Bernoulli(&rng, i < 100 ? 0.8 : (i < 200 ? 0.3 : 0.6));
    xs.push_back(x);
    d.Observe(1, x);
    ASSERT_NEAR(d.short_alpha(), ClosedForm(xs, 4), 1e-12) << i;
    ASSERT_NEAR(d.long_alpha(), ClosedForm(xs, 64), 1e-12) << i;
    ASSERT_NEAR(d.drift(), ClosedForm(xs, 4) - ClosedForm(xs, 64), 1e-12) << i;
    ASSERT_NEAR(d.mean_acceptance_length(), 1.0 + ClosedForm(xs, 64), 1e-12) << i;
  }
  EXPECT_EQ(d.observations(), 300u);
  EXPECT_EQ(d.up_events() + d.down_events(), 0u);

  // By hand: the first step is the estimate (no prior); after one half-life of failures on
  // top of a settled run of successes, the estimate is halfway.
  AcceptanceDrift e(NoDetection(10, 10));
  e.Observe(4, 2);  // 2 successes, 1 failure
  EXPECT_DOUBLE_EQ(e.short_alpha(), 2.0 / 3);
  EXPECT_DOUBLE_EQ(e.mean_acceptance_length(), 3.0);
  for (int i = 0; i < 1000; ++i) e.Observe(1, 1);
  for (int i = 0; i < 10; ++i) e.Observe(1, 0);
  EXPECT_NEAR(e.short_alpha(), 0.5, 1e-12);
}

TEST(AcceptanceDriftTest, CountsTestedTokens) {
  // A step of k tokens with a accepted tests a tokens and, when a < k, one more; tokens after
  // the first rejection count neither way. With half-lives far longer than the data the
  // windows are sum(accepted) / sum(tested).
  AcceptanceDrift c(NoDetection(1e12, 1e12));
  c.Observe(4, 3);  // 3 of 4 tested
  c.Observe(2, 0);  // 0 of 1
  c.Observe(2, 2);  // 2 of 2
  EXPECT_NEAR(c.long_alpha(), 5.0 / 7, 1e-9);
  EXPECT_NEAR(c.mean_acceptance_length(), 1.0 + 5.0 / 3, 1e-9);
  EXPECT_EQ(c.tested_tokens(), 7.0);
  // alpha*: expected acceptances over positions, on its own window.
  EXPECT_LT(c.optimal_alpha(), 0.0);
  c.ObserveOptimal(2.5, 4);
  c.ObserveOptimal(0.5, 1);
  EXPECT_NEAR(c.optimal_alpha(), 3.0 / 5, 1e-9);
}

TEST(AcceptanceDriftTest, InvalidObservationsIgnored) {
  AcceptanceDrift d;
  EXPECT_EQ(d.Observe(0, 0), DriftDirection::kNone);
  EXPECT_EQ(d.Observe(-1, 0), DriftDirection::kNone);
  EXPECT_EQ(d.Observe(2, 3), DriftDirection::kNone);
  EXPECT_EQ(d.Observe(2, -1), DriftDirection::kNone);
  d.ObserveOptimal(1.0, 0);
  d.ObserveOptimal(NAN, 2);
  EXPECT_EQ(d.observations(), 0u);
  EXPECT_EQ(d.long_alpha(), 0.0);
  EXPECT_LT(d.optimal_alpha(), 0.0);
}

TEST(AcceptanceDriftTest, OptionsValidate) {
  EXPECT_EQ(DriftOptions().Validate(), "");
  DriftOptions o;
  o.threshold = 0;
  EXPECT_NE(o.Validate(), "");
  o = DriftOptions();
  o.short_half_life = 2000;  // longer than the long window
  EXPECT_NE(o.Validate(), "");
  o = DriftOptions();
  o.slack = -1;
  EXPECT_NE(o.Validate(), "");
  o = DriftOptions();
  o.long_half_life = NAN;
  EXPECT_NE(o.Validate(), "");
  EXPECT_DEATH(AcceptanceDrift{o}, "long_half_life");
}

// Feeds `n` Bernoulli(p) observations; returns the 1-based index of the first event (0 if
// none) and stores its direction.
int FeedBernoulli(AcceptanceDrift* d, Rng* rng, double p, int n, DriftDirection* dir) {
  for (int i = 1; i <= n; ++i) {
    const DriftDirection e = d->Observe(1, Bernoulli(rng, p));
    if (e != DriftDirection::kNone) {
      *dir = e;
      return i;
    }
  }
  return 0;
}

// Defaults: slack 0.15, threshold 10. A shift of 0.5 drifts the CUSUM by ~0.35 per
// observation, so ~30 observations; 100 is a generous bound (simulated delays over 20 seeds
// ranged 19..42).
TEST(AcceptanceDriftTest, StepDownRaisesDownEventOnce) {
  AcceptanceDrift d;
  Rng rng(1234);
  DriftDirection dir = DriftDirection::kNone;
  ASSERT_EQ(FeedBernoulli(&d, &rng, 0.8, 2000, &dir), 0);
  EXPECT_NEAR(d.long_alpha(), 0.8, 0.05);
  const int at = FeedBernoulli(&d, &rng, 0.3, 2000, &dir);
  ASSERT_GT(at, 0) << "no event after 0.8 -> 0.3";
  EXPECT_LE(at, 100);
  EXPECT_EQ(dir, DriftDirection::kDown);
  EXPECT_EQ(d.last_event().direction, DriftDirection::kDown);
  EXPECT_EQ(d.last_event().observation, 2000u + at);
  EXPECT_NEAR(d.last_event().before, 0.8, 0.05);
  EXPECT_NEAR(d.last_event().after, 0.3, 0.2);
  // Re-baselined: both windows at the new level, no drift, sums reset.
  EXPECT_EQ(d.drift(), 0.0);
  EXPECT_EQ(d.cusum_down(), 0.0);
  // The new level is stationary: no further event (one step change, one event).
  ASSERT_EQ(FeedBernoulli(&d, &rng, 0.3, 3000, &dir), 0);
  EXPECT_EQ(d.down_events(), 1u);
  EXPECT_EQ(d.up_events(), 0u);
  EXPECT_NEAR(d.long_alpha(), 0.3, 0.05);
}

TEST(AcceptanceDriftTest, StepUpRaisesUpEvent) {
  AcceptanceDrift d;
  Rng rng(99);
  DriftDirection dir = DriftDirection::kNone;
  ASSERT_EQ(FeedBernoulli(&d, &rng, 0.3, 2000, &dir), 0);
  const int at = FeedBernoulli(&d, &rng, 0.8, 2000, &dir);
  ASSERT_GT(at, 0) << "no event after 0.3 -> 0.8";
  EXPECT_LE(at, 100);
  EXPECT_EQ(dir, DriftDirection::kUp);
  EXPECT_NEAR(d.last_event().after, 0.8, 0.2);
  ASSERT_EQ(FeedBernoulli(&d, &rng, 0.8, 3000, &dir), 0);
  EXPECT_EQ(d.up_events(), 1u);
  EXPECT_EQ(d.down_events(), 0u);
}

// Steps of k = 4 drafted tokens, as the serving code produces them.
TEST(AcceptanceDriftTest, StepChangeOnSpeculativeSteps) {
  AcceptanceDrift d;
  Rng rng(5);
  for (int i = 0; i < 1000; ++i) {
    ASSERT_EQ(d.Observe(4, Step(&rng, 0.85, 4)), DriftDirection::kNone) << i;
  }
  int at = 0;
  for (int i = 1; i <= 1000 && at == 0; ++i) {
    if (d.Observe(4, Step(&rng, 0.4, 4)) == DriftDirection::kDown) at = i;
  }
  EXPECT_GT(at, 0);
  EXPECT_LE(at, 100);
  EXPECT_EQ(d.up_events(), 0u);
}

// Stationary streams, 10k steps, fixed seeds: no event. Reasoning (see the header): a tested
// token's variance is <= 1/4, and Siegmund's approximation puts the in-control run length of
// each one-sided CUSUM at ~1.8e6 tested tokens in the worst case (alpha 0.5), so P(event in
// 10k) ~ 1% there and far less at alpha 0.8.
TEST(AcceptanceDriftTest, NoEventOnStationaryStreams) {
  for (double p : {0.5, 0.8, 0.95}) {
    AcceptanceDrift d;
    Rng rng(42);
    DriftDirection dir = DriftDirection::kNone;
    EXPECT_EQ(FeedBernoulli(&d, &rng, p, 10000, &dir), 0) << "Bernoulli p=" << p;
    EXPECT_NEAR(d.long_alpha(), p, 0.06);
    EXPECT_NEAR(d.drift(), 0.0, 0.25);
  }
  for (double p : {0.5, 0.8}) {
    AcceptanceDrift d;
    Rng rng(43);
    for (int i = 0; i < 10000; ++i) d.Observe(4, Step(&rng, p, 4));
    EXPECT_EQ(d.up_events() + d.down_events(), 0u) << "steps p=" << p;
  }
}

// Companion: a mis-tuned detector (no slack, tiny threshold) false-alarms on the very stream
// the test above calls stationary, so that test does discriminate.
TEST(AcceptanceDriftTest, MisTunedDetectorFalseAlarms) {
  DriftOptions broken;
  broken.slack = 0;
  broken.threshold = 0.5;
  AcceptanceDrift d(broken);
  Rng rng(42);
  DriftDirection dir = DriftDirection::kNone;
  EXPECT_GT(FeedBernoulli(&d, &rng, 0.8, 10000, &dir), 0);
  for (int i = 0; i < 10000; ++i) d.Observe(1, Bernoulli(&rng, 0.8));
  EXPECT_GT(d.up_events() + d.down_events(), 100u);
}

TEST(AcceptanceDriftTest, NoDetectionDuringWarmup) {
  DriftOptions o;
  o.warmup_tokens = 200;
  AcceptanceDrift d(o);
  for (int i = 0; i < 100; ++i) d.Observe(1, 1);
  // Steps 101..200 start with under 200 tested tokens seen: no detection.
  for (int i = 0; i < 100; ++i) ASSERT_EQ(d.Observe(1, 0), DriftDirection::kNone) << i;
  EXPECT_EQ(d.cusum_down(), 0.0);
  // The warm-up is over: the changed stream (reference ~0.5, now 0) triggers quickly.
  bool fired = false;
  for (int i = 0; i < 100 && !fired; ++i) fired = d.Observe(1, 0) == DriftDirection::kDown;
  EXPECT_TRUE(fired);
}

// Only k changes (1, then 4, then 2, then 8) at a per-token acceptance of 0.8: the windows read
// 0.8 throughout and no event fires. Companion: the same steps read as accepted / drafted,
// the old gauge, fall from 0.8 to ~0.59 at k = 4, which a detector fed that ratio reports.
TEST(AcceptanceDriftTest, AChangeOfKAloneMovesNothing) {
  AcceptanceDrift d;
  Rng rng(2027);
  int64_t drafted = 0, accepted = 0;
  for (int k : {1, 4, 2, 8}) {
    drafted = accepted = 0;
    for (int i = 0; i < 5000; ++i) {
      const int a = Step(&rng, 0.8, k);
      ASSERT_EQ(d.Observe(k, a), DriftDirection::kNone) << "k=" << k << " step " << i;
      drafted += k;
      accepted += a;
    }
    EXPECT_NEAR(d.long_alpha(), 0.8, 0.02) << "k=" << k;
    EXPECT_NEAR(d.short_alpha(), 0.8, 0.1) << "k=" << k;
    if (k == 4) {
      EXPECT_NEAR(static_cast<double>(accepted) / drafted, 0.59, 0.02);
    }
  }
  EXPECT_EQ(d.up_events() + d.down_events(), 0u);

  // The old reading as a detector's input: a 1-token step per drafted token, accepted with
  // the step's accepted / drafted. At k = 1 it is the per-token stream; at k = 4 it falls.
  AcceptanceDrift old;
  Rng rng2(2027);
  int at = 0;
  for (int k : {1, 4}) {
    for (int i = 0; i < 5000 && at == 0; ++i) {
      const int a = Step(&rng2, 0.8, k);
      for (int j = 0; j < k && at == 0; ++j) {
        if (old.Observe(1, rng2.Uniform() < double(a) / k ? 1 : 0) != DriftDirection::kNone) {
          at = k;
        }
      }
    }
  }
  EXPECT_EQ(at, 4) << "the accepted / drafted stream raised no event when k changed";
}

TEST(DomainDriftTest, BoundedDomainsFoldIntoOverflow) {
  DomainDrift dd(DriftOptions(), 2, "other");
  std::string resolved;
  dd.Observe("python", 4, 2, 0, 0, &resolved);
  EXPECT_EQ(resolved, "python");
  dd.Observe("other", 4, 2, 0, 0, &resolved);  // the overflow domain does not count
  dd.Observe("rust", 4, 1, 0, 0, &resolved);
  EXPECT_EQ(resolved, "rust");
  dd.Observe("go", 4, 4, 0, 0, &resolved);
  EXPECT_EQ(resolved, "other");
  dd.Observe("haskell", 4, 4, 0.75, 1, &resolved);  // alpha* is folded the same way
  EXPECT_EQ(resolved, "other");
  EXPECT_EQ(dd.size(), 3u);
  const std::vector<DomainDrift::Reading> r = dd.Snapshot();
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].domain, "other");
  EXPECT_EQ(r[0].observations, 3u);
  EXPECT_DOUBLE_EQ(r[0].optimal_alpha, 0.75);
  EXPECT_EQ(r[1].domain, "python");
  EXPECT_LT(r[1].optimal_alpha, 0.0);
  EXPECT_EQ(r[2].domain, "rust");
  EXPECT_DOUBLE_EQ(r[2].long_alpha, 0.5);  // 1 success, 1 failure
  EXPECT_DOUBLE_EQ(r[2].mean_acceptance_length, 2.0);
}

TEST(DomainDriftTest, ConcurrentObserveCountsEverything) {
  DomainDrift dd;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&dd, t] {
      Rng rng(t);
      for (int i = 0; i < 20000; ++i) {
        dd.Observe("d" + std::to_string(i % 4), 1, Bernoulli(&rng, 0.7));
      }
    });
  }
  for (auto& th : threads) th.join();
  uint64_t total = 0;
  for (const auto& r : dd.Snapshot()) {
    total += r.observations;
    EXPECT_NEAR(r.long_alpha, 0.7, 0.1) << r.domain;
  }
  EXPECT_EQ(total, 80000u);
  EXPECT_STREQ(DriftDirectionName(DriftDirection::kDown), "down");
  EXPECT_STREQ(DriftDirectionName(DriftDirection::kUp), "up");
}

}  // namespace
}  // namespace specloop
