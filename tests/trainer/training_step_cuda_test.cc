// A training step of the draft on a GPU (`specloop train --device cuda`; skipped without one):
// the forward under autograd and each objective's loss give the CPU's loss and gradients to
// float rounding, and AdamW updates the weights there. "Float rounding" for the gradients is
// 1e-3 of each tensor's largest: on the CPU, the float32 loss alone moves them by up to
// 3.3e-4 of it against the same loss in float64 (reverse KL; 1.9e-4 TVD), and a GPU's sums
// in another order move them as much. An indexing or device mistake moves them by O(1).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>

#include "tests/common/test_models.h"
#include "trainer/adamw.h"
#include "trainer/distill_loss.h"

namespace specloop {
namespace trainer {
namespace {

struct Targets {
  at::Tensor ids, logprobs, tail;  // [N, K], [N, K], [N]
};

struct Step {
  double loss = 0;
  std::vector<at::Tensor> before, grads, after;  // per parameter, on the CPU
};

Step RunStep(const std::string& device, const ObjectiveSpec& spec,
             const std::vector<int64_t>& tokens, const Targets& t) {
  LoadOptions o;
  o.device = device;
  o.dtype = "float32";
  std::unique_ptr<LlamaModel> m;
  Status s = LlamaModel::Load(testing::SharedDir() + "/models/draft-mix-1m", o, &m);
  if (!s.ok()) throw std::runtime_error(s.ToString());
  std::vector<at::Tensor> params = m->Parameters();
  for (at::Tensor& p : params) p.requires_grad_(true);
  AdamW opt(params, AdamWOptions());
  KVCache cache = m->NewCache();
  const at::Device dev = m->device();
  ForwardInput in;
  in.cache = &cache;
  in.tokens = tokens;
  in.all_logits = true;
  at::Tensor logits = m->Forward({in});
  at::Tensor loss = DistillLoss(spec, logits, t.ids.to(dev), t.logprobs.to(dev), t.tail.to(dev),
                                at::Tensor());
  loss.backward();
  Step r;
  r.loss = loss.item<double>();
  for (const at::Tensor& p : params) {
    r.before.push_back(p.detach().to(at::kCPU).clone());
    r.grads.push_back(p.grad().defined() ? p.grad().to(at::kCPU) : at::zeros_like(r.before.back()));
  }
  opt.Step();
  for (const at::Tensor& p : params) r.after.push_back(p.detach().to(at::kCPU));
  return r;
}

TEST(TrainingStep, OnCudaGivesTheCpusLossAndGradients) {
  if (!testing::CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  const int64_t N = 48, K = 8, V = 4096;
  at::manual_seed(3);
  std::vector<int64_t> tokens(N);
  for (int64_t i = 0; i < N; ++i) tokens[i] = 1 + (i * 37) % (V - 1);
  // Per position, K distinct target ids and the log-probs of K buckets and a tail.
  Targets t;
  t.ids = std::get<1>(at::rand({N, V}).topk(K, /*dim=*/1)).contiguous();  // distinct per row
  const at::Tensor p = at::softmax(at::randn({N, K + 1}) * 2, 1);
  t.logprobs = p.narrow(1, 0, K).log().contiguous();
  t.tail = p.select(1, K).contiguous();
  for (const char* name : {"fkl", "rkl", "jsd", "tvd"}) {
    ObjectiveSpec spec;
    ASSERT_TRUE(ObjectiveSpec::Parse(name, &spec).ok());
    const Step cpu = RunStep("cpu", spec, tokens, t), gpu = RunStep("cuda", spec, tokens, t);
    EXPECT_NEAR(gpu.loss, cpu.loss, 1e-5 * std::max(1.0, std::fabs(cpu.loss))) << name;
    ASSERT_EQ(gpu.grads.size(), cpu.grads.size());
    double moved = 0;
    for (size_t i = 0; i < cpu.grads.size(); ++i) {
      const double scale = cpu.grads[i].abs().max().item<double>();
      const double diff = (gpu.grads[i] - cpu.grads[i]).abs().max().item<double>();
      EXPECT_LE(diff, 1e-3 * scale + 1e-7) << name << " parameter " << i;
      moved = std::max(moved, (gpu.after[i] - gpu.before[i]).abs().max().item<double>());
      EXPECT_TRUE(at::isfinite(gpu.after[i]).all().item<bool>()) << name << " parameter " << i;
    }
    EXPECT_GT(moved, 1e-4) << name << ": AdamW's first step moves a weight by ~lr";
  }
}

}  // namespace
}  // namespace trainer
}  // namespace specloop
