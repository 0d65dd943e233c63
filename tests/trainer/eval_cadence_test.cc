// The online trainer's evaluation cadence (trainer/eval_cadence.h): short intervals while the
// draft gains, longer ones after refusals, back to short after a shift of the traffic, and
// evaluation held to its share of the time.
#include "trainer/eval_cadence.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace specloop {
namespace trainer {
namespace {

using Outcome = EvalCadence::Outcome;
const std::map<std::string, double> kProse = {{"prose", 10.0}};

// Steps of `seconds` each until AfterStep says to evaluate (at most `limit`); returns the
// number of steps, or -1.
int StepsUntilEvaluation(EvalCadence* c, double seconds,
                         const std::map<std::string, double>& traffic = kProse, int limit = 10000) {
  for (int i = 1; i <= limit; ++i) {
    if (c->AfterStep(seconds, traffic)) return i;
  }
  return -1;
}

TEST(EvalCadence, DoublesAfterRefusalsAndResetsAfterAPublish) {
  EvalCadence c;  // 25 .. 200 steps, at most 25% of the time
  EXPECT_EQ(StepsUntilEvaluation(&c, 1.0), 25);
  c.Evaluated(1.0, Outcome::kRefused);
  EXPECT_EQ(StepsUntilEvaluation(&c, 1.0), 50);
  c.Evaluated(1.0, Outcome::kRefused);
  EXPECT_EQ(StepsUntilEvaluation(&c, 1.0), 100);
  c.Evaluated(1.0, Outcome::kRefused);
  EXPECT_EQ(StepsUntilEvaluation(&c, 1.0), 200);
  c.Evaluated(1.0, Outcome::kRefused);
  EXPECT_EQ(StepsUntilEvaluation(&c, 1.0), 200);  // the most
  c.Evaluated(1.0, Outcome::kNoData);              // nothing to judge: no change
  EXPECT_EQ(StepsUntilEvaluation(&c, 1.0), 200);
  c.Evaluated(1.0, Outcome::kPublished);
  EXPECT_EQ(StepsUntilEvaluation(&c, 1.0), 25);
}

TEST(EvalCadence, ARefusalBelowBestKeepsTheInterval) {
  // The trainer replays the fallen domain more after such a refusal: the candidate is being
  // trained back, not stalled, so it is judged again as soon as before.
  EvalCadence c;
  EXPECT_EQ(StepsUntilEvaluation(&c, 1.0), 25);
  c.Evaluated(1.0, Outcome::kBelowBest);
  EXPECT_EQ(StepsUntilEvaluation(&c, 1.0), 25);
  c.Evaluated(1.0, Outcome::kRefused);
  EXPECT_EQ(StepsUntilEvaluation(&c, 1.0), 50);
  c.Evaluated(1.0, Outcome::kBelowBest);
  EXPECT_EQ(StepsUntilEvaluation(&c, 1.0), 50);
  c.Evaluated(1.0, Outcome::kRefused);  // a plain refusal still doubles it
  EXPECT_EQ(StepsUntilEvaluation(&c, 1.0), 100);
}

TEST(EvalCadence, AShiftOfTheTrafficBringsTheNextEvaluationForward) {
  EvalCadence c;
  for (int i = 0; i < 3; ++i) {
    ASSERT_GT(StepsUntilEvaluation(&c, 1.0), 0);
    c.Evaluated(1.0, Outcome::kRefused);
  }
  ASSERT_EQ(c.interval(), 200);
  // 10 steps of prose, then c takes 40% of the traffic: evaluation 25 steps after the last,
  // not 200.
  for (int i = 0; i < 10; ++i) ASSERT_FALSE(c.AfterStep(1.0, kProse));
  const std::map<std::string, double> shifted = {{"prose", 6.0}, {"c", 4.0}};
  EXPECT_EQ(StepsUntilEvaluation(&c, 1.0, shifted), 15);
  // A smaller move of the mix (20% to c) is no shift.
  EvalCadence d;
  for (int i = 0; i < 3; ++i) {
    ASSERT_GT(StepsUntilEvaluation(&d, 1.0), 0);
    d.Evaluated(1.0, Outcome::kRefused);
  }
  ASSERT_FALSE(d.AfterStep(1.0, kProse));
  EXPECT_EQ(StepsUntilEvaluation(&d, 1.0, {{"prose", 8.0}, {"c", 2.0}}), 199);
}

TEST(EvalCadence, EvaluationTakesAtMostItsShareOfTheTime) {
  EvalCadence c;  // max_share 0.25: 3 s of training per second of evaluation
  ASSERT_EQ(StepsUntilEvaluation(&c, 0.25), 25);
  c.Evaluated(20.0, Outcome::kPublished);  // 20 s: the next needs 60 s of training
  EXPECT_EQ(StepsUntilEvaluation(&c, 0.25), 240);
  c.Evaluated(0.25, Outcome::kPublished);  // cheap again: the step interval rules
  EXPECT_EQ(StepsUntilEvaluation(&c, 0.25), 25);
}

TEST(EvalCadence, AnIntervalBelowTheShortestIsTheShortest) {
  EvalCadenceOptions o;
  o.min_steps = 25;
  o.max_steps = 10;  // capped below the shortest: every 10 steps
  EvalCadence c(o);
  EXPECT_EQ(StepsUntilEvaluation(&c, 0.0), 25);
  c.Evaluated(0.0, Outcome::kRefused);
  EXPECT_EQ(StepsUntilEvaluation(&c, 0.0), 25);
}

}  // namespace
}  // namespace trainer
}  // namespace specloop
