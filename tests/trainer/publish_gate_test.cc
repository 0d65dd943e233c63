// The publish gate on hand-made estimates.
#include "trainer/publish_gate.h"

#include <gtest/gtest.h>

namespace specloop {
namespace trainer {
namespace {

AlphaEstimate Make(std::map<std::string, double> alpha, int64_t positions = 100) {
  AlphaEstimate e;
  double sum = 0;
  for (const auto& [d, a] : alpha) {
    e.domains[d] = {a, a + 0.02, positions};
    sum += a * positions;
    e.overall.positions += positions;
  }
  e.overall.logged = sum / e.overall.positions;
  return e;
}

TEST(PublishGate, PublishesAClearGain) {
  GateDecision d = DecideGate({}, Make({{"c", 0.5}, {"python", 0.6}}),
                              Make({{"c", 0.55}, {"python", 0.62}}));
  EXPECT_TRUE(d.publish);
  EXPECT_EQ(d.reason, "ok");
}

TEST(PublishGate, RefusesTooSmallAGain) {
  GateDecision d = DecideGate({}, Make({{"c", 0.5}}), Make({{"c", 0.501}}));
  EXPECT_FALSE(d.publish);
  EXPECT_EQ(d.reason, "no_gain");
}

TEST(PublishGate, RefusesAWorseCandidate) {
  GateDecision d = DecideGate({}, Make({{"c", 0.5}}), Make({{"c", 0.3}}));
  EXPECT_FALSE(d.publish);
  EXPECT_EQ(d.reason, "domain_regression");
}

TEST(PublishGate, RefusesADomainRegressionDespiteAnOverallGain) {
  GateDecision d = DecideGate({}, Make({{"c", 0.5}, {"python", 0.5}}),
                              Make({{"c", 0.7}, {"python", 0.4}}));
  EXPECT_FALSE(d.publish);
  EXPECT_EQ(d.reason, "domain_regression");
  EXPECT_NE(d.detail.find("python"), std::string::npos);
}

TEST(PublishGate, ToleratesASmallFallForAGainElsewhere) {
  // The default tolerance (0.03): python falls 0.02 while c gains 0.2.
  const AlphaEstimate live = Make({{"c", 0.5}, {"python", 0.5}});
  const AlphaEstimate cand = Make({{"c", 0.7}, {"python", 0.48}});
  EXPECT_TRUE(DecideGate({}, live, cand).publish);
  GateOptions strict;
  strict.max_domain_regression = 0.01;
  strict.max_regression_per_gain = 0;  // (the gain, 0.09, would tolerate 0.09)
  EXPECT_EQ(DecideGate(strict, live, cand).reason, "domain_regression");
}

TEST(PublishGate, ALargeGainWidensTheTolerance) {
  // Traffic is all on c, which gains 0.2; python (no traffic) falls 0.15, beyond the 0.03
  // tolerance but within the gain.
  const AlphaEstimate live = Make({{"c", 0.2}, {"python", 0.5}});
  const std::map<std::string, double> traffic = {{"c", 1.0}};
  GateDecision d = DecideGate({}, live, Make({{"c", 0.4}, {"python", 0.35}}), traffic);
  EXPECT_TRUE(d.publish) << d.detail;
  // A fall beyond the gain is still refused, and the detail names the tolerance used.
  d = DecideGate({}, live, Make({{"c", 0.4}, {"python", 0.28}}), traffic);
  EXPECT_EQ(d.reason, "domain_regression");
  EXPECT_NE(d.detail.find("tolerance 0.2000"), std::string::npos) << d.detail;
  // A small gain leaves the fixed tolerance.
  d = DecideGate({}, live, Make({{"c", 0.22}, {"python", 0.46}}), traffic);
  EXPECT_EQ(d.reason, "domain_regression");
  EXPECT_NE(d.detail.find("tolerance 0.0300"), std::string::npos) << d.detail;
  // Half the gain: the first candidate's fall is too much.
  GateOptions half;
  half.max_regression_per_gain = 0.5;
  EXPECT_EQ(DecideGate(half, live, Make({{"c", 0.4}, {"python", 0.35}}), traffic).reason,
            "domain_regression");
  EXPECT_TRUE(DecideGate(half, live, Make({{"c", 0.4}, {"python", 0.42}}), traffic).publish);
}

TEST(PublishGate, SmallDomainsAreNotJudgedAlone) {
  AlphaEstimate live = Make({{"c", 0.5}, {"python", 0.5}});
  AlphaEstimate cand = Make({{"c", 0.7}, {"python", 0.4}});
  live.domains["python"].positions = cand.domains["python"].positions = 10;
  EXPECT_TRUE(DecideGate({}, live, cand).publish);
}

// Paired per-position values for `domain`: live at 0.5, the candidate at 0.5 + fall + the
// alternating +-spread (so its mean falls by exactly `fall`, with standard deviation ~spread).
void AddPairedValues(AlphaEstimate* live, AlphaEstimate* cand, const std::string& domain,
                     double fall, double spread, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    live->logged_values[domain].push_back(0.5);
    cand->logged_values[domain].push_back(0.5 - fall + (i % 2 == 0 ? spread : -spread));
  }
}

TEST(PublishGate, AFallWithinItsNoiseIsNotARegression) {
  // python falls 0.05 (beyond the 0.03 tolerance; the overall gain, 0.025, is less) but
  // per-position differences spread +-0.3 over 100 positions: standard error 0.03, so 2
  // standard errors (0.06) cover the fall.
  AlphaEstimate live = Make({{"c", 0.5}, {"python", 0.5}});
  AlphaEstimate cand = Make({{"c", 0.6}, {"python", 0.45}});
  AddPairedValues(&live, &cand, "python", 0.05, 0.3, 100);
  GateDecision d = DecideGate({}, live, cand);
  EXPECT_TRUE(d.publish) << d.detail;
  // The same fall, measured consistently on every position, is a regression.
  AlphaEstimate live2 = Make({{"c", 0.5}, {"python", 0.5}});
  AlphaEstimate cand2 = Make({{"c", 0.6}, {"python", 0.45}});
  AddPairedValues(&live2, &cand2, "python", 0.05, 0.01, 100);
  d = DecideGate({}, live2, cand2);
  EXPECT_FALSE(d.publish);
  EXPECT_EQ(d.reason, "domain_regression") << d.detail;
}

// `records` records of `positions` positions each for `domain`: live at 0.7 everywhere; the
// candidate at 0.5 on the first half of the records and 0.7 on the rest (a fall of 0.1 on
// average, all of it in some prompts).
void AddRecords(AlphaEstimate* live, AlphaEstimate* cand, const std::string& domain,
                int records, int positions) {
  for (int r = 0; r < records; ++r) {
    for (int i = 0; i < positions; ++i) {
      live->logged_values[domain].push_back(0.7);
      cand->logged_values[domain].push_back(r < records / 2 ? 0.5 : 0.7);
    }
    live->record_ends[domain].push_back(live->logged_values[domain].size());
    cand->record_ends[domain].push_back(cand->logged_values[domain].size());
  }
}

TEST(PublishGate, RecordsNotPositionsAreTheIndependentDraws) {
  // python falls 0.1 (tolerance 0.03). Four records of 50 positions: the records' mean
  // differences are -0.2, -0.2, 0, 0, standard error 0.058 (2 SE = 0.115): two prompts the
  // candidate does worse on are not yet a domain's fall. Per position (200 draws) it would
  // have been 0.0071 and a refusal.
  AlphaEstimate live = Make({{"c", 0.5}, {"python", 0.7}});
  AlphaEstimate cand = Make({{"c", 0.65}, {"python", 0.6}});
  AddRecords(&live, &cand, "python", 4, 50);
  GateDecision d = DecideGate({}, live, cand);
  EXPECT_TRUE(d.publish) << d.detail;
  // Without the record boundaries the same values are 200 draws: refused.
  live.record_ends.clear();
  cand.record_ends.clear();
  EXPECT_EQ(DecideGate({}, live, cand).reason, "domain_regression");
  // The same pattern over 40 records (2 SE = 0.032) is a fall.
  AlphaEstimate live40 = Make({{"c", 0.5}, {"python", 0.7}});
  AlphaEstimate cand40 = Make({{"c", 0.65}, {"python", 0.6}});
  AddRecords(&live40, &cand40, "python", 40, 50);
  d = DecideGate({}, live40, cand40);
  EXPECT_EQ(d.reason, "domain_regression") << d.detail;
  EXPECT_NE(d.detail.find("standard errors 0.03"), std::string::npos) << d.detail;
}

// The below-best rule at 0.02 (the default, set here as the tests rely on it).
GateOptions BelowBestOn() {
  GateOptions o;
  o.max_fall_below_best = 0.02;
  return o;
}

TEST(PublishGate, BelowBestRefusesWhateverTheGain) {
  const GateOptions on = BelowBestOn();
  // Traffic is all on c, which gains 0.2: python (idle) falls 0.025 below the live draft,
  // within the tolerance (0.03, widened to the gain): without a best, published.
  const AlphaEstimate live = Make({{"c", 0.2}, {"python", 0.5}});
  const AlphaEstimate cand = Make({{"c", 0.4}, {"python", 0.475}});
  const std::map<std::string, double> traffic = {{"c", 1.0}};
  EXPECT_TRUE(DecideGate({}, live, cand, traffic).publish);
  // The best served on python is the live draft: 0.025 below it is beyond 0.02.
  const AlphaEstimate best = Make({{"c", 0.2}, {"python", 0.5}});
  GateDecision d = DecideGate(on, live, cand, traffic, &best);
  EXPECT_FALSE(d.publish);
  EXPECT_EQ(d.reason, "below_best");
  EXPECT_EQ(d.below_best, std::vector<std::string>{"python"});
  EXPECT_NE(d.detail.find("domain python 0.4750, its best 0.5000 (allowance 0.0200"),
            std::string::npos)
      << d.detail;
  // Within the allowance: published, nothing listed.
  d = DecideGate(on, live, Make({{"c", 0.4}, {"python", 0.485}}), traffic, &best);
  EXPECT_TRUE(d.publish) << d.detail;
  EXPECT_TRUE(d.below_best.empty());
  // The allowance is an option, 0.02 by default (the same candidate refused); < 0: no such
  // rule (published).
  GateOptions loose = on;
  loose.max_fall_below_best = 0.03;
  EXPECT_TRUE(DecideGate(loose, live, cand, traffic, &best).publish);
  EXPECT_EQ(DecideGate({}, live, cand, traffic, &best).reason, "below_best");
  GateOptions off;
  off.max_fall_below_best = -1;
  EXPECT_TRUE(DecideGate(off, live, cand, traffic, &best).publish);
}

TEST(PublishGate, FallsBelowTheBestAddUpOverVersions) {
  const GateOptions on = BelowBestOn();
  // The live draft already lies 0.015 below python's best (published within the allowance); a
  // candidate 0.015 below the live draft passes against it but lies 0.03 below the best.
  const AlphaEstimate best = Make({{"c", 0.3}, {"docs", 0.6}, {"python", 0.5}});
  const AlphaEstimate live = Make({{"c", 0.3}, {"docs", 0.6}, {"python", 0.485}});
  const AlphaEstimate cand = Make({{"c", 0.5}, {"docs", 0.57}, {"python", 0.47}});
  EXPECT_TRUE(DecideGate({}, live, cand).publish);
  const GateDecision d = DecideGate(on, live, cand, {}, &best);
  EXPECT_EQ(d.reason, "below_best") << d.detail;
  // Every domain beyond the allowance, in name order.
  EXPECT_EQ(d.below_best, (std::vector<std::string>{"docs", "python"}));
  // A domain with too few positions to judge alone is not listed.
  AlphaEstimate small = cand;
  small.domains["python"].positions = 10;
  EXPECT_EQ(DecideGate(on, live, small, {}, &best).below_best,
            std::vector<std::string>{"docs"});
  // A large fall against the live draft keeps its own reason.
  EXPECT_EQ(DecideGate(on, live, Make({{"c", 0.5}, {"docs", 0.3}, {"python", 0.5}}), {}, &best)
                .reason,
            "domain_regression");
}

TEST(PublishGate, AFallBelowTheBestWithinItsNoiseIsNotRefused) {
  const GateOptions on = BelowBestOn();
  // python 0.1 below its best on average, all of it in half of the records (AddRecords, the
  // best draft in the live draft's place there); the live draft is as low as the candidate,
  // so only the best can refuse it. Four records of 50 positions: 2 standard errors (0.115)
  // cover the fall; forty records (0.032) do not.
  for (const int records : {4, 40}) {
    AlphaEstimate best = Make({{"c", 0.5}, {"python", 0.7}});
    AlphaEstimate cand = Make({{"c", 0.52}, {"python", 0.6}});
    AddRecords(&best, &cand, "python", records, 50);
    const AlphaEstimate live = Make({{"c", 0.5}, {"python", 0.6}});
    EXPECT_TRUE(DecideGate({}, live, cand).publish);
    const GateDecision d = DecideGate(on, live, cand, {}, &best);
    if (records == 4) {
      EXPECT_TRUE(d.publish) << d.detail;
    } else {
      EXPECT_EQ(d.reason, "below_best") << d.detail;
      EXPECT_NE(d.detail.find("standard errors 0.03"), std::string::npos) << d.detail;
    }
  }
}

TEST(PublishGate, TrafficWeighsTheOverallGain) {
  // Traffic has moved to "new", which the held-out set covers with few positions: the
  // candidate gains 0.1 there and loses 0.01 (within tolerance) on "old".
  AlphaEstimate live, cand;
  live.domains["old"] = {0.5, 0.52, 1000};
  live.domains["new"] = {0.1, 0.12, 60};
  cand.domains["old"] = {0.49, 0.51, 1000};
  cand.domains["new"] = {0.2, 0.22, 60};
  live.overall = {(0.5 * 1000 + 0.1 * 60) / 1060, 0, 1060};
  cand.overall = {(0.49 * 1000 + 0.2 * 60) / 1060, 0, 1060};
  // Per position the gain is -0.004: no gain.
  EXPECT_EQ(DecideGate({}, live, cand).reason, "no_gain");
  // With three quarters of recent traffic on "new" it is +0.0725.
  GateDecision d = DecideGate({}, live, cand, {{"old", 1.0}, {"new", 3.0}});
  EXPECT_TRUE(d.publish) << d.detail;
  EXPECT_NE(d.detail.find("traffic-weighted"), std::string::npos) << d.detail;
  // Traffic only on "old": the candidate's loss there is all that counts.
  EXPECT_EQ(DecideGate({}, live, cand, {{"old", 5.0}, {"new", 0.0}}).reason, "no_gain");
  // Traffic on domains the estimates lack: per position again.
  EXPECT_EQ(DecideGate({}, live, cand, {{"legal", 1.0}}).reason, "no_gain");
}

TEST(PublishGate, NoDataNoDecision) {
  GateDecision d = DecideGate({}, Make({{"c", 0.5}}, 20), Make({{"c", 0.9}}, 20));
  EXPECT_FALSE(d.publish);
  EXPECT_EQ(d.reason, "no_data");
}

TEST(FirstDraftGate, ExpectedSpeedupIsTokensPerStepOverItsCost) {
  // No acceptance: one token per step, at the cost of the drafts and their verification.
  EXPECT_NEAR(ExpectedSpeedup(0.0, 4, 0.25, 0.05), 1.0 / 2.2, 1e-12);
  // Every draft accepted, free drafts: k + 1 tokens per step.
  EXPECT_NEAR(ExpectedSpeedup(1.0, 4, 0.0, 0.0), 5.0, 1e-12);
  // alpha 0.5, k 2: 1 + 0.5 + 0.25 tokens for 1 + 2 * 0.3 steps.
  EXPECT_NEAR(ExpectedSpeedup(0.5, 2, 0.2, 0.1), 1.75 / 1.6, 1e-12);
  // Increasing in alpha, decreasing in cost.
  EXPECT_LT(ExpectedSpeedup(0.4, 3, 0.26, 0.07), ExpectedSpeedup(0.5, 3, 0.26, 0.07));
  EXPECT_GT(ExpectedSpeedup(0.5, 3, 0.1, 0.07), ExpectedSpeedup(0.5, 3, 0.26, 0.07));
}

TEST(FirstDraftGate, JudgesAgainstPlainDecoding) {
  // Defaults (a head's draft cost 0.26, verify 0.06, need 1.05x): alpha 0.3 promises at best
  // 1.3 / 1.32 = 0.98x (k = 1): slower than plain decoding, whatever a live draft would score.
  GateDecision d = DecideFirstDraft({}, Make({{"c", 0.3}, {"python", 0.3}}));
  EXPECT_FALSE(d.publish) << d.detail;
  EXPECT_EQ(d.reason, "slower_than_plain");
  // alpha 0.7: 1 + 0.7 + 0.49 = 2.19 tokens for 1.64 steps at k = 2 (1.34x).
  d = DecideFirstDraft({}, Make({{"c", 0.7}, {"python", 0.7}}));
  EXPECT_TRUE(d.publish) << d.detail;
  EXPECT_EQ(d.reason, "ok");
  EXPECT_NE(d.detail.find("k = "), std::string::npos) << d.detail;
  // Too few positions: no decision.
  d = DecideFirstDraft({}, Make({{"c", 0.9}}, 40));
  EXPECT_FALSE(d.publish);
  EXPECT_EQ(d.reason, "no_data");
  // Cheaper drafts pay at a lower alpha: a draft model's cost (0.01) at 0.3 promises
  // 1.3 / 1.07 = 1.21x.
  GateOptions cheap;
  cheap.draft_cost = kModelDraftCost;
  EXPECT_TRUE(DecideFirstDraft(cheap, Make({{"c", 0.3}, {"python", 0.3}})).publish);
  // The traffic weighs the domains: python's 0.8 counts where the traffic is.
  const AlphaEstimate mixed = Make({{"c", 0.2}, {"python", 0.8}});
  EXPECT_TRUE(DecideFirstDraft({}, mixed, {{"python", 1.0}}).publish);
  EXPECT_FALSE(DecideFirstDraft({}, mixed, {{"c", 1.0}}).publish);
}

}  // namespace
}  // namespace trainer
}  // namespace specloop
