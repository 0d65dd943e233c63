// Blends of the live draft's and a candidate's weights (trainer/weight_blend.h): the arithmetic
// live + lambda * (candidate - live), in place on tensors the optimizer holds, and the choice of
// the first lambda the gate accepts. Each check is also run on a broken implementation, which it
// must reject (so the check itself can fail).
#include "trainer/weight_blend.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

namespace specloop {
namespace trainer {
namespace {

std::vector<at::Tensor> RandomWeights(uint64_t seed) {
  at::manual_seed(static_cast<int64_t>(seed));
  return {at::randn({4, 3}), at::randn({5}), at::randn({2, 2, 2})};
}

std::vector<at::Tensor> Clones(const std::vector<at::Tensor>& w) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : w) out.push_back(t.clone());
  return out;
}

// Whether every element of `out` is live + lambda * (candidate - live), computed element by
// element in double (not by the tensor expression under test), within float rounding.
bool IsBlend(const std::vector<at::Tensor>& live, const std::vector<at::Tensor>& candidate,
             double lambda, const std::vector<at::Tensor>& out) {
  if (out.size() != live.size()) return false;
  for (size_t i = 0; i < live.size(); ++i) {
    const at::Tensor l = live[i].contiguous().to(at::kDouble).flatten();
    const at::Tensor c = candidate[i].contiguous().to(at::kDouble).flatten();
    const at::Tensor o = out[i].detach().contiguous().to(at::kDouble).flatten();
    if (o.numel() != l.numel()) return false;
    for (int64_t j = 0; j < l.numel(); ++j) {
      const double lj = l[j].item<double>(), cj = c[j].item<double>();
      if (std::abs(o[j].item<double>() - (lj + lambda * (cj - lj))) > 1e-5) return false;
    }
  }
  return true;
}

// A broken blend: lambda measured from the candidate's side.
void BrokenBlend(const std::vector<at::Tensor>& live, const std::vector<at::Tensor>& candidate,
                 double lambda, std::vector<at::Tensor>* out) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < live.size(); ++i) {
    (*out)[i].copy_(candidate[i] + (live[i] - candidate[i]) * lambda);
  }
}

TEST(WeightBlend, SetsEachTensorToTheInterpolation) {
  const std::vector<at::Tensor> live = RandomWeights(1), candidate = RandomWeights(2);
  for (double lambda : {0.0, 0.25, 0.5, 1.0}) {
    // As the optimizer holds them: leaves that require gradients, updated in place.
    std::vector<at::Tensor> out = Clones(candidate);
    std::vector<const void*> storage;
    for (at::Tensor& t : out) {
      t.requires_grad_(true);
      storage.push_back(t.data_ptr());
    }
    ASSERT_TRUE(BlendWeights(live, candidate, lambda, &out).ok()) << lambda;
    EXPECT_TRUE(IsBlend(live, candidate, lambda, out)) << lambda;
    for (size_t i = 0; i < out.size(); ++i) {
      EXPECT_EQ(out[i].data_ptr(), storage[i]) << "not in place";
      EXPECT_TRUE(out[i].requires_grad());
    }
  }
  // lambda 0 is the live draft exactly.
  std::vector<at::Tensor> out = Clones(candidate);
  ASSERT_TRUE(BlendWeights(live, candidate, 0.0, &out).ok());
  for (size_t i = 0; i < out.size(); ++i) EXPECT_TRUE(at::equal(out[i], live[i]));
}

TEST(WeightBlend, TheCheckRejectsABrokenBlend) {
  const std::vector<at::Tensor> live = RandomWeights(1), candidate = RandomWeights(2);
  std::vector<at::Tensor> out = Clones(candidate);
  BrokenBlend(live, candidate, 0.25, &out);
  EXPECT_FALSE(IsBlend(live, candidate, 0.25, out));
  BrokenBlend(live, candidate, 0.5, &out);  // symmetric at 0.5: indistinguishable, as it should be
  EXPECT_TRUE(IsBlend(live, candidate, 0.5, out));
}

TEST(WeightBlend, RefusesMismatchedDraftsAndLeavesTheOutputAlone) {
  const std::vector<at::Tensor> live = RandomWeights(1), candidate = RandomWeights(2);
  std::vector<at::Tensor> other = Clones(candidate);
  other[1] = at::randn({6});
  std::vector<at::Tensor> out = Clones(candidate);
  Status s = BlendWeights(live, other, 0.5, &out);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  std::vector<at::Tensor> fewer(candidate.begin(), candidate.end() - 1);
  EXPECT_TRUE(BlendWeights(live, fewer, 0.5, &out).IsInvalidArgument());
  std::vector<at::Tensor> doubles = Clones(candidate);
  doubles[0] = doubles[0].to(at::kDouble);
  EXPECT_TRUE(BlendWeights(live, doubles, 0.5, &out).IsInvalidArgument());
  EXPECT_TRUE(BlendWeights(live, candidate, std::nan(""), &out).IsInvalidArgument());
  for (size_t i = 0; i < out.size(); ++i) EXPECT_TRUE(at::equal(out[i], candidate[i]));
}

using Chooser = std::function<Status(const std::vector<double>&,
                                     const std::function<Status(double, bool*)>&, int*)>;

// Whether `choose` asks the lambdas in order, stops at the first accepted and returns its
// index; returns -1 having asked all when none is accepted; and stops at an error.
::testing::AssertionResult ChoosesTheFirstAccepted(const Chooser& choose) {
  const std::vector<double> lambdas = {0.5, 0.25, 0.1};
  struct Case {
    double accept_at_most;  // the gate accepts lambdas up to this
    int error_at;           // index whose evaluation fails (-1: none)
    int want_chosen;
    std::vector<double> want_asked;
    bool want_ok;
  };
  const std::vector<Case> cases = {
      {0.3, -1, 1, {0.5, 0.25}, true},
      {1.0, -1, 0, {0.5}, true},
      {0.05, -1, -1, {0.5, 0.25, 0.1}, true},
      {0.05, 1, -1, {0.5, 0.25}, false},
  };
  for (const Case& c : cases) {
    std::vector<double> asked;
    int chosen = 7;
    Status s = choose(
        lambdas,
        [&](double lambda, bool* accepted) {
          const int index = static_cast<int>(asked.size());
          asked.push_back(lambda);
          if (index == c.error_at) return Status::IOError("evaluation failed");
          *accepted = lambda <= c.accept_at_most;
          return Status::OK();
        },
        &chosen);
    if (s.ok() != c.want_ok || chosen != c.want_chosen || asked != c.want_asked) {
      return ::testing::AssertionFailure()
             << "accepting <= " << c.accept_at_most << ": chosen " << chosen << " (want "
             << c.want_chosen << "), asked " << asked.size() << " (want " << c.want_asked.size()
             << "), " << s.ToString();
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(WeightBlend, ChoosesTheFirstAcceptedBlend) {
  EXPECT_TRUE(ChoosesTheFirstAccepted(FirstAcceptedBlend));
}

TEST(WeightBlend, TheChoiceCheckRejectsABrokenChooser) {
  // Asks every lambda and keeps the last accepted: the smallest step, and every pass paid.
  const Chooser last = [](const std::vector<double>& lambdas,
                          const std::function<Status(double, bool*)>& accepts, int* chosen) {
    *chosen = -1;
    for (size_t i = 0; i < lambdas.size(); ++i) {
      bool accepted = false;
      SPECLOOP_RETURN_IF_ERROR(accepts(lambdas[i], &accepted));
      if (accepted) *chosen = static_cast<int>(i);
    }
    return Status::OK();
  };
  EXPECT_FALSE(ChoosesTheFirstAccepted(last));
}

}  // namespace
}  // namespace trainer
}  // namespace specloop
