// The ATen forward (the GPU's and the training forward; common/model/batched_attention.h) run
// on the CPU against the CPU kernels' forward (llama_forward_cpu.cc) on target-6m: log-probs
// within 1e-4 at batch 1, 4 and 16, over steps that mix prefill, chunked prefill, verification
// blocks, token trees and single-token decoding in one batch, with rollbacks in between (so
// later steps read what earlier ones wrote into the shared block pool). And under autograd, a
// padded batch's gradients are the sum of its sequences' alone, and the new keys' and values'
// gradients match finite differences.
#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>

#include "common/model/llama_model.h"
#include "tests/common/test_models.h"

namespace specloop {
namespace {

constexpr double kLogProbTol = 1e-4;

std::vector<int64_t> RandomTokens(int64_t n, int vocab, uint64_t seed) {
  at::manual_seed(seed);
  at::Tensor t = at::randint(vocab, {n}, at::kLong);
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + n);
}

// What sequence s does at step `step` of a run (the same for both paths).
struct Step {
  std::vector<int64_t> tokens;
  std::vector<int> parents;   // a tree, or empty
  int64_t keep = -1;          // afterwards: Truncate to past + keep (chains), or -1
  std::vector<int> path;      // afterwards: KeepPath (trees)
};

// Step kinds by (sequence, step): prefill of varied length at step 0, then verification
// blocks, trees, decode tokens and prefill chunks in rotation, so each batch mixes them.
Step MakeStep(int s, int step, int vocab) {
  const uint64_t seed = 1000 + 97 * s + step;
  Step st;
  if (step == 0) {
    st.tokens = RandomTokens(3 + (11 * s) % 37, vocab, seed);  // prefill: 3 to 39 tokens
    return st;
  }
  switch ((s + step) % 4) {
    case 0:  // a verification block of k + 1 = 5, the last two rejected
      st.tokens = RandomTokens(5, vocab, seed);
      st.keep = 3;
      break;
    case 1:  // a tree: two branches from the root, one of them forking
      st.tokens = RandomTokens(7, vocab, seed);
      st.parents = {-1, 0, 0, 1, 2, 3, 3};
      st.path = {0, 1, 3, 6};
      break;
    case 2:  // a decode step
      st.tokens = RandomTokens(1, vocab, seed);
      break;
    default:  // a chunk of a long prompt
      st.tokens = RandomTokens(17, vocab, seed);
      break;
  }
  return st;
}

// Log-probs of every new token of every step of a run of `seqs` sequences in one shared pool
// (the server's layout), `steps` steps, through one of the two forwards.
std::vector<at::Tensor> RunSteps(LlamaModel& m, bool cpu_kernels, int seqs, int steps) {
  m.set_use_small_cpu_path(cpu_kernels);
  auto pool = m.NewBlockPool(/*max_blocks=*/0, /*prefix_caching=*/false);
  std::vector<KVCache> caches;
  for (int s = 0; s < seqs; ++s) caches.push_back(m.NewCache(pool));
  std::vector<at::Tensor> out;
  for (int step = 0; step < steps; ++step) {
    std::vector<Step> plan;
    std::vector<ForwardInput> batch;
    for (int s = 0; s < seqs; ++s) {
      plan.push_back(MakeStep(s, step, m.config().vocab_size));
      ForwardInput in;
      in.cache = &caches[s];
      in.tokens = plan.back().tokens;
      in.parents = plan.back().parents;
      in.all_logits = true;
      batch.push_back(std::move(in));
    }
    std::vector<int64_t> past;
    for (const KVCache& c : caches) past.push_back(c.length());
    out.push_back(at::log_softmax(m.Forward(batch), -1));
    for (int s = 0; s < seqs; ++s) {
      if (plan[s].keep >= 0) caches[s].Truncate(past[s] + plan[s].keep);
      if (!plan[s].path.empty()) caches[s].KeepPath(past[s], plan[s].path);
    }
  }
  return out;
}

class BatchedAtenForward : public ::testing::TestWithParam<int> {  // param: batch size
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(LlamaModel::Load(testing::SharedDir() + "/models/target-6m", LoadOptions(),
                                 &model_)
                    .ok());
  }
  static void TearDownTestSuite() { model_.reset(); }
  static std::unique_ptr<LlamaModel> model_;
  c10::InferenceMode guard_;
};
std::unique_ptr<LlamaModel> BatchedAtenForward::model_;

TEST_P(BatchedAtenForward, AgreesWithTheCpuKernels) {
  const int seqs = GetParam(), steps = 6;
  const std::vector<at::Tensor> kernels = RunSteps(*model_, true, seqs, steps);
  const std::vector<at::Tensor> aten = RunSteps(*model_, false, seqs, steps);
  ASSERT_EQ(kernels.size(), aten.size());
  double worst = 0;
  for (int step = 0; step < steps; ++step) {
    ASSERT_EQ(kernels[step].sizes(), aten[step].sizes()) << "step " << step;
    const double diff = (kernels[step] - aten[step]).abs().max().item<double>();
    EXPECT_LT(diff, kLogProbTol) << "step " << step;
    worst = std::max(worst, diff);
  }
  // Not a vacuous comparison: the steps' distributions differ from one another.
  EXPECT_GT((kernels[1][0] - kernels[2][0]).abs().max().item<double>(), 0.1);
  RecordProperty("max_logprob_diff", std::to_string(worst));
}

INSTANTIATE_TEST_SUITE_P(Batch, BatchedAtenForward, ::testing::Values(1, 4, 16));

// The shape-static forward (llama_model.h: what CUDA graphs replay), run on the CPU against the
// CPU kernels: decode-shaped steps (verification blocks, trees, single tokens) of 1, 4 and 16
// sequences in one bounded pool, padded to powers of two in sequences, tokens and cached
// positions, with the layers' hidden states asked too, and rollbacks between steps. Log-probs
// and hidden states within 1e-4; every decode-shaped step ran the static forward.
class StaticShapeForward : public BatchedAtenForward {};

struct StaticRun {
  std::vector<at::Tensor> logprobs, hidden;
  int64_t static_forwards = 0;
};

// Runs on the model's path as set (set_static_shapes, LoadOptions::cuda_graphs), the caches in
// `pool` (null: a new bounded pool).
StaticRun RunDecodeSteps(const LlamaModel& m, int seqs, int steps,
                         std::shared_ptr<KVBlockPool> pool = nullptr) {
  const int64_t before = m.static_stats().forwards;
  if (!pool) pool = m.NewBlockPool(/*max_blocks=*/512, /*prefix_caching=*/false);
  std::vector<KVCache> caches;
  for (int s = 0; s < seqs; ++s) caches.push_back(m.NewCache(pool));
  StaticRun run;
  for (int step = 0; step < steps; ++step) {
    std::vector<Step> plan;
    std::vector<ForwardInput> batch;
    for (int s = 0; s < seqs; ++s) {
      // Step 0 prefills 3 to 39 tokens (over 16: the eager forward); then kinds 0 to 2 only.
      plan.push_back(MakeStep(s, step, m.config().vocab_size));
      if (step > 0 && (s + step) % 4 == 3) {
        plan.back() = MakeStep(s, step + 1, m.config().vocab_size);
      }
      ForwardInput in;
      in.cache = &caches[s];
      in.tokens = plan.back().tokens;
      in.parents = plan.back().parents;
      in.all_logits = (s + step) % 3 != 0;  // else the last token's logits alone
      batch.push_back(std::move(in));
    }
    std::vector<int64_t> past;
    for (const KVCache& c : caches) past.push_back(c.length());
    at::Tensor hidden;
    run.logprobs.push_back(at::log_softmax(m.Forward(batch, {0, 2}, &hidden), -1));
    run.hidden.push_back(hidden);
    for (int s = 0; s < seqs; ++s) {
      if (plan[s].keep >= 0) caches[s].Truncate(past[s] + plan[s].keep);
      if (!plan[s].path.empty()) caches[s].KeepPath(past[s], plan[s].path);
    }
  }
  run.static_forwards = m.static_stats().forwards - before;
  return run;
}

TEST_P(StaticShapeForward, AgreesWithTheCpuKernels) {
  const int seqs = GetParam(), steps = 7;
  const StaticRun kernels = RunDecodeSteps(*model_, seqs, steps);
  model_->set_use_small_cpu_path(false);
  model_->set_static_shapes(true);
  const StaticRun padded = RunDecodeSteps(*model_, seqs, steps);
  model_->set_static_shapes(false);
  model_->set_use_small_cpu_path(true);
  EXPECT_EQ(kernels.static_forwards, 0);
  // Every step after the prefill (and the prefill of one sequence of 3 tokens).
  EXPECT_EQ(padded.static_forwards, seqs == 1 ? steps : steps - 1);
  double worst = 0;
  for (int step = 0; step < steps; ++step) {
    ASSERT_EQ(kernels.logprobs[step].sizes(), padded.logprobs[step].sizes()) << "step " << step;
    ASSERT_EQ(kernels.hidden[step].sizes(), padded.hidden[step].sizes()) << "step " << step;
    const double diff = (kernels.logprobs[step] - padded.logprobs[step]).abs().max().item<double>();
    EXPECT_LT(diff, kLogProbTol) << "step " << step;
    EXPECT_LT((kernels.hidden[step] - padded.hidden[step]).abs().max().item<double>(), kLogProbTol)
        << "step " << step;
    worst = std::max(worst, diff);
  }
  EXPECT_GT((kernels.logprobs[1][0] - kernels.logprobs[2][0]).abs().max().item<double>(), 0.1);
  RecordProperty("max_logprob_diff", std::to_string(worst));
}

INSTANTIATE_TEST_SUITE_P(Batch, StaticShapeForward, ::testing::Values(1, 4, 16));

// On CUDA (scripts/gpu/run.sh): the same steps through CUDA graphs (LoadOptions' default) and
// through the eager ATen forward (--no-cuda-graphs), float32 and float16. Log-probs within 1e-4
// (float16: 5e-2, a few of its ulps at the logits' size); graphs were captured and replayed: a
// second run of the same steps in the same pool captures nothing new and gives the same bits.
TEST(StaticShapeForwardOnCuda, GraphsReplayWhatTheEagerForwardComputes) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  c10::InferenceMode guard;
  for (const char* dtype : {"float32", "float16"}) {
    SCOPED_TRACE(dtype);
    LoadOptions graphs, eager;
    graphs.device = eager.device = "cuda";
    graphs.dtype = eager.dtype = dtype;
    eager.cuda_graphs = false;
    std::unique_ptr<LlamaModel> g, e;
    const std::string dir = testing::SharedDir() + "/models/target-6m";
    ASSERT_TRUE(LlamaModel::Load(dir, graphs, &g).ok());
    ASSERT_TRUE(LlamaModel::Load(dir, eager, &e).ok());
    for (const int seqs : {1, 4, 16}) {
      const StaticRun want = RunDecodeSteps(*e, seqs, 7);
      // Graphs belong to a pool (they read its storage where it lies): both runs in one.
      std::shared_ptr<KVBlockPool> pool = g->NewBlockPool(512, false);
      const int64_t before = g->static_stats().captures;
      const StaticRun got = RunDecodeSteps(*g, seqs, 7, pool);
      const int64_t captured = g->static_stats().captures;
      const StaticRun again = RunDecodeSteps(*g, seqs, 7, pool);
      EXPECT_EQ(g->static_stats().capture_failures, 0) << g->static_stats().capture_error;
      EXPECT_EQ(want.static_forwards, 0);
      EXPECT_EQ(got.static_forwards, seqs == 1 ? 7 : 6) << seqs;
      EXPECT_GT(captured, before);
      EXPECT_EQ(g->static_stats().captures, captured) << seqs << ": the second run recaptured";
      const double tol = std::string(dtype) == "float32" ? kLogProbTol : 5e-2;
      for (int step = 0; step < 7; ++step) {
        ASSERT_EQ(want.logprobs[step].sizes(), got.logprobs[step].sizes());
        EXPECT_LT((want.logprobs[step] - got.logprobs[step]).abs().max().item<double>(), tol)
            << seqs << " sequences, step " << step;
        EXPECT_LT((want.hidden[step] - got.hidden[step]).abs().max().item<double>(), tol * 10)
            << seqs << " sequences, step " << step;
        EXPECT_TRUE(at::equal(got.logprobs[step], again.logprobs[step]))
            << seqs << " sequences, step " << step << ": a replay differs from the capture";
      }
    }
  }
}

// On CUDA: graphs captured at start-up (PrepareStaticShapes, from plans of the shape alone)
// replay what the eager forward computes for the batches that later take them, and no step
// captures anew.
TEST(StaticShapeForwardOnCuda, PreparedGraphsReplayWhatTheEagerForwardComputes) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  c10::InferenceMode guard;
  LoadOptions graphs, eager;
  graphs.device = eager.device = "cuda";
  graphs.dtype = eager.dtype = "float32";
  eager.cuda_graphs = false;
  std::unique_ptr<LlamaModel> g, e;
  const std::string dir = testing::SharedDir() + "/models/target-6m";
  ASSERT_TRUE(LlamaModel::Load(dir, graphs, &g).ok());
  ASSERT_TRUE(LlamaModel::Load(dir, eager, &e).ok());
  std::shared_ptr<KVBlockPool> pool = g->NewBlockPool(512, false);
  // 16 sequences of 16 tokens over up to 128 positions: 5 x 5 x 4 shapes.
  EXPECT_EQ(g->PrepareStaticShapes(pool, 16, 16, 129, {0, 2}), 100);
  EXPECT_EQ(g->static_stats().capture_failures, 0) << g->static_stats().capture_error;
  const int64_t captured = g->static_stats().captures;
  EXPECT_EQ(captured, 100);
  for (const int seqs : {1, 4, 16}) {
    const StaticRun want = RunDecodeSteps(*e, seqs, 7);
    const StaticRun got = RunDecodeSteps(*g, seqs, 7, pool);
    EXPECT_EQ(got.static_forwards, seqs == 1 ? 7 : 6) << seqs;
    for (int step = 0; step < 7; ++step) {
      ASSERT_EQ(want.logprobs[step].sizes(), got.logprobs[step].sizes());
      EXPECT_LT((want.logprobs[step] - got.logprobs[step]).abs().max().item<double>(),
                kLogProbTol)
          << seqs << " sequences, step " << step;
    }
  }
  EXPECT_EQ(g->static_stats().captures, captured) << "a step captured a shape not prepared";
}

// PrepareStaticShapes on the CPU (forced static shapes, no graphs): it registers every padded
// shape of its bounds, each run once from a plan of the shape alone, without touching a cache;
// the decode steps within those bounds then meet no new shape, and one past them does.
TEST(StaticShapeForwardPrepare, RegistersEveryPaddedShapeOfItsBounds) {
  c10::InferenceMode guard;
  auto m = testing::RandomModel(testing::TinyFourLayerConfig(), 6);  // 128 positions
  auto pool = m->NewBlockPool(512, false);
  const int64_t free_before = pool->available();
  EXPECT_EQ(m->PrepareStaticShapes(pool, 4, 9, 128, {0, 2}), 0);  // the static path is off
  EXPECT_EQ(pool->available(), free_before);
  m->set_use_small_cpu_path(false);
  m->set_static_shapes(true);
  // Sequences {1, 2, 4} x tokens {1, 2, 4, 8, 16} x cached positions {16, 32, 64, 128}.
  EXPECT_EQ(m->PrepareStaticShapes(pool, 4, 9, 128, {0, 2}), 60);
  EXPECT_EQ(m->static_stats().shapes, 60);
  EXPECT_EQ(m->static_stats().forwards, 0);
  EXPECT_EQ(pool->available(), free_before - 1);  // the scratch block alone
  EXPECT_EQ(m->PrepareStaticShapes(pool, 4, 9, 128, {0, 2}), 60);  // nothing new
  EXPECT_EQ(m->static_stats().shapes, 60);

  const StaticRun run = RunDecodeSteps(*m, 4, 7, pool);  // contexts stay under 128
  EXPECT_EQ(run.static_forwards, 6);
  EXPECT_EQ(m->static_stats().shapes, 60) << "a step met a shape not prepared";
  std::vector<KVCache> five;  // companion: 5 sequences pad to 8, past the bounds
  std::vector<ForwardInput> batch;
  for (int s = 0; s < 5; ++s) {
    five.push_back(m->NewCache(pool));
  }
  for (int s = 0; s < 5; ++s) {
    batch.push_back({&five[s], RandomTokens(2, m->config().vocab_size, 30 + s), false, {}, {}});
  }
  at::Tensor hidden;
  m->Forward(batch, {0, 2}, &hidden);
  EXPECT_EQ(m->static_stats().shapes, 61);

  // Bounds past kStaticSeqs, kStaticTokens and max_model_len are clamped to them.
  auto other = m->NewBlockPool(64, false);
  EXPECT_EQ(m->PrepareStaticShapes(other, 1000, 1000, 1000), 7 * 5 * 4);
}

TEST(StaticShapeForwardScope, TakesOnlyDecodeShapedBatchesInOneBoundedPool) {
  c10::InferenceMode guard;
  auto m = testing::RandomModel(testing::TinyConfig(), 5);
  m->set_use_small_cpu_path(false);
  m->set_static_shapes(true);
  const int V = m->config().vocab_size;
  auto bounded = m->NewBlockPool(64, false), other = m->NewBlockPool(64, false);
  KVCache a = m->NewCache(bounded), b = m->NewCache(bounded), c = m->NewCache(other);
  KVCache own = m->NewCache();  // a pool of its own, unbounded: its storage moves as it grows
  auto forwards = [&] { return m->static_stats().forwards; };
  const int64_t free_before = bounded->available();
  m->Forward({{&a, RandomTokens(4, V, 1), false, {}, {}},
              {&b, RandomTokens(16, V, 2), false, {}, {}}});
  EXPECT_EQ(forwards(), 1);
  // One scratch block, taken once, beside the two sequences' blocks.
  EXPECT_EQ(bounded->available(), free_before - 1 - 1 - 1);
  m->Forward({{&a, RandomTokens(17, V, 3), false, {}, {}}});  // a prefill chunk: eager
  m->Forward({{&own, RandomTokens(2, V, 4), false, {}, {}}});
  m->Forward({{&a, RandomTokens(2, V, 5), false, {}, {}},
              {&c, RandomTokens(2, V, 6), false, {}, {}}});  // two pools: eager
  EXPECT_EQ(forwards(), 1);
  m->Forward({{&c, RandomTokens(1, V, 7), false, {}, {}}});  // a second pool: its own scratch
  EXPECT_EQ(forwards(), 2);
  EXPECT_EQ(other->available(), 64 - 1 - 1);
  // At most kStaticPools live pools at once; a pool that is gone frees its place.
  std::vector<KVCache> extra;  // pools three and four, held by their caches alone
  for (int i = 0; i < LlamaModel::kStaticPools - 2; ++i) {
    extra.push_back(m->NewCache(m->NewBlockPool(8, false)));
    m->Forward({{&extra.back(), RandomTokens(1, V, 10 + i), false, {}, {}}});
  }
  EXPECT_EQ(forwards(), LlamaModel::kStaticPools);
  KVCache late = m->NewCache(m->NewBlockPool(8, false));
  m->Forward({{&late, RandomTokens(1, V, 20), false, {}, {}}});
  EXPECT_EQ(forwards(), LlamaModel::kStaticPools);  // a fifth live pool: eager
  extra.clear();
  m->Forward({{&late, RandomTokens(1, V, 21), false, {}, {}}});
  EXPECT_EQ(forwards(), LlamaModel::kStaticPools + 1);
}

// Forward(..., token_ids) reads the new tokens from a tensor instead of the inputs (a draft
// forward's tokens drawn on the device): on each path (the CPU kernels, the ATen forward and
// the shape-static one, whose padding puts the real tokens' rows apart), steps whose inputs
// hold placeholder zeros and whose ids come as a tensor give the logits and hidden states of
// the same steps with the real tokens, to the bit. A forward that ignored the ids would
// compute the zeros' logits, which differ.
TEST(ForwardTokenIds, ReadInsteadOfTheInputsOnEveryPath) {
  c10::InferenceMode guard;
  auto m = testing::RandomModel(testing::TinyConfig(), 13);
  const int V = m->config().vocab_size;
  enum Path { kKernels, kAten, kStatic };
  for (const Path path : {kKernels, kAten, kStatic}) {
    SCOPED_TRACE(path);
    m->set_use_small_cpu_path(path == kKernels);
    m->set_static_shapes(path == kStatic);
    auto pool = m->NewBlockPool(/*max_blocks=*/64, /*prefix_caching=*/false);
    std::vector<KVCache> real, ids, zeros;
    for (int s = 0; s < 3; ++s) {
      real.push_back(m->NewCache(pool));
      ids.push_back(m->NewCache(pool));
      zeros.push_back(m->NewCache(pool));
    }
    const int64_t static_before = m->static_stats().forwards;
    for (int step = 0; step < 3; ++step) {
      // Three sequences of 4, 1 and 3 new tokens (chains; the last one a tree at step 2).
      std::vector<ForwardInput> a, b, c;
      std::vector<int64_t> flat;
      for (int s = 0; s < 3; ++s) {
        const int64_t n = s == 0 ? 4 : (s == 1 ? 1 : 3);
        const std::vector<int64_t> tokens = RandomTokens(n, V, 500 + 10 * step + s);
        std::vector<int> parents;
        if (s == 2 && step == 2) parents = {-1, 0, 0};
        flat.insert(flat.end(), tokens.begin(), tokens.end());
        const std::vector<int64_t> placeholder(n, 0);
        a.push_back({&real[s], tokens, s != 1, parents, {}});
        b.push_back({&ids[s], placeholder, s != 1, parents, {}});
        c.push_back({&zeros[s], placeholder, s != 1, parents, {}});
      }
      const at::Tensor token_ids = at::tensor(flat, at::TensorOptions().dtype(at::kLong));
      at::Tensor ha, hb, hc;
      const at::Tensor want = m->Forward(a, {0, 1}, &ha);
      const at::Tensor got = m->Forward(b, {0, 1}, &hb, token_ids);
      const at::Tensor ignored = m->Forward(c, {0, 1}, &hc);
      ASSERT_EQ(want.sizes(), got.sizes()) << "step " << step;
      EXPECT_TRUE(at::equal(want, got)) << "step " << step;
      EXPECT_TRUE(at::equal(ha, hb)) << "step " << step;
      EXPECT_GT((want - ignored).abs().max().item<double>(), 1e-3) << "step " << step;
      for (int s = 0; s < 3; ++s) EXPECT_EQ(ids[s].length(), real[s].length());
    }
    EXPECT_EQ(m->static_stats().forwards - static_before, path == kStatic ? 9 : 0);
  }
  m->set_static_shapes(false);
  m->set_use_small_cpu_path(true);

  // An ids tensor of another size, dtype or device is refused before any cache changes.
  KVCache cache = m->NewCache();
  const std::vector<ForwardInput> two = {{&cache, {0, 0}, false, {}, {}}};
  EXPECT_THROW(m->Forward(two, {}, nullptr, at::zeros({3}, at::kLong)), c10::Error);
  EXPECT_THROW(m->Forward(two, {}, nullptr, at::zeros({2}, at::kInt)), c10::Error);
  EXPECT_THROW(m->Forward(two, {}, nullptr, at::zeros({1, 2}, at::kLong)), c10::Error);
  EXPECT_THROW(m->Forward(two, {}, nullptr, at::full({2}, V, at::kLong)), c10::Error);
  EXPECT_EQ(cache.length(), 0);
}

TEST(BatchedAtenForwardPools, CachesInSeveralPoolsAgreeWithOnePool) {
  // Private caches (each its own pool, as generate and training use) beside shared ones in one
  // batch: one attention per pool, the rows put back in input order.
  c10::InferenceMode guard;
  auto m = testing::RandomModel(testing::TinyConfig(), 5);
  m->set_use_small_cpu_path(false);
  const int V = m->config().vocab_size;
  auto shared = m->NewBlockPool(0, false);
  std::vector<KVCache> mixed, kernels;
  for (int s = 0; s < 4; ++s) {
    mixed.push_back(s % 2 == 0 ? m->NewCache(shared) : m->NewCache());
    kernels.push_back(m->NewCache());
  }
  for (int step = 0; step < 3; ++step) {
    std::vector<ForwardInput> a, b;
    for (int s = 0; s < 4; ++s) {
      const Step st = MakeStep(s, step, V);
      a.push_back({&mixed[s], st.tokens, true, st.parents, {}});
      b.push_back({&kernels[s], st.tokens, true, st.parents, {}});
    }
    m->set_use_small_cpu_path(false);
    const at::Tensor got = at::log_softmax(m->Forward(a), -1);
    m->set_use_small_cpu_path(true);
    const at::Tensor want = at::log_softmax(m->Forward(b), -1);
    ASSERT_EQ(got.sizes(), want.sizes());
    EXPECT_LT((got - want).abs().max().item<double>(), kLogProbTol) << "step " << step;
  }
}

TEST(BatchedAtenForwardPools, UnwrittenSlotsHoldingNaNBeforeFirstUseDoNotLeak) {
  // The attention reads whole blocks and masks the slots past each sequence's length; those
  // slots were never written. A bounded pool's storage exists before its first block is handed
  // out: filled with NaN there, the forward must still agree with the CPU kernels (which read
  // written slots only), since the pool zeroes a block when it first hands it out.
  c10::InferenceMode guard;
  auto m = testing::RandomModel(testing::TinyConfig(), 9);
  const int V = m->config().vocab_size;
  auto poisoned = m->NewBlockPool(/*max_blocks=*/64, false);
  poisoned->storage().fill_(std::numeric_limits<float>::quiet_NaN());
  std::vector<KVCache> aten, kernels;
  for (int s = 0; s < 4; ++s) {
    aten.push_back(m->NewCache(poisoned));
    kernels.push_back(m->NewCache());
  }
  for (int step = 0; step < 3; ++step) {
    std::vector<ForwardInput> a, b;
    for (int s = 0; s < 4; ++s) {
      const Step st = MakeStep(s, step, V);
      a.push_back({&aten[s], st.tokens, true, st.parents, {}});
      b.push_back({&kernels[s], st.tokens, true, st.parents, {}});
    }
    m->set_use_small_cpu_path(false);
    const at::Tensor got = at::log_softmax(m->Forward(a), -1);
    m->set_use_small_cpu_path(true);
    const at::Tensor want = at::log_softmax(m->Forward(b), -1);
    ASSERT_TRUE(got.isfinite().all().item<bool>()) << "step " << step;
    EXPECT_LT((got - want).abs().max().item<double>(), kLogProbTol) << "step " << step;
  }
}

TEST(BatchedAtenTraining, PaddedBatchGradientsAreTheSumOfItsSequences) {
  // Sequences of different lengths (the batch pads them), one after a cached context: the
  // gradient of a sum of per-sequence losses in one forward equals the sum of the gradients
  // of each sequence's forward alone (no padding), so padded rows and keys leak nothing.
  auto m = testing::RandomModel(testing::TinyQwen3Config(), 7);
  const int V = m->config().vocab_size;
  std::vector<at::Tensor> params = m->Parameters();
  for (at::Tensor& p : params) p.requires_grad_(true);
  const std::vector<std::vector<int64_t>> seqs = {RandomTokens(9, V, 71), RandomTokens(3, V, 72),
                                                  RandomTokens(14, V, 73)};
  const std::vector<int64_t> context = RandomTokens(6, V, 74);
  auto forward = [&](const std::vector<int>& which, std::vector<at::Tensor>* grads) {
    for (at::Tensor& p : params) p.mutable_grad() = at::Tensor();
    auto pool = m->NewBlockPool(0, false);
    std::vector<KVCache> caches;
    for (size_t i = 0; i < which.size(); ++i) caches.push_back(m->NewCache(pool));
    std::vector<ForwardInput> batch;
    for (size_t i = 0; i < which.size(); ++i) {
      if (which[i] == 2) {  // a context run without gradients first
        at::NoGradGuard no_grad;
        m->Forward({{&caches[i], context, false, {}, {}}});
      }
      batch.push_back({&caches[i], seqs[which[i]], true, {}, {}});
    }
    const at::Tensor logits = m->Forward(batch);
    // A loss that weighs each row differently, so that rows cannot trade places unnoticed.
    const at::Tensor w = at::arange(1, logits.size(0) + 1, logits.options()).unsqueeze(1);
    (at::log_softmax(logits, -1).select(1, 3) * w.squeeze(1)).sum().backward();
    grads->clear();
    for (const at::Tensor& p : params) grads->push_back(p.grad().clone());
  };
  std::vector<at::Tensor> together, sum;
  forward({0, 1, 2}, &together);
  // Alone, each sequence's rows must carry the weights they had in the batch.
  int64_t first = 1;
  for (int s = 0; s < 3; ++s) {
    for (at::Tensor& p : params) p.mutable_grad() = at::Tensor();
    auto pool = m->NewBlockPool(0, false);
    KVCache cache = m->NewCache(pool);
    if (s == 2) {
      at::NoGradGuard no_grad;
      m->Forward({{&cache, context, false, {}, {}}});
    }
    const at::Tensor logits = m->Forward({{&cache, seqs[s], true, {}, {}}});
    const at::Tensor w = at::arange(first, first + logits.size(0), logits.options());
    first += logits.size(0);
    (at::log_softmax(logits, -1).select(1, 3) * w).sum().backward();
    for (size_t i = 0; i < params.size(); ++i) {
      if (s == 0) sum.push_back(params[i].grad().clone());
      else sum[i] += params[i].grad();
    }
  }
  ASSERT_EQ(together.size(), sum.size());
  double largest = 0;
  for (size_t i = 0; i < sum.size(); ++i) {
    const double scale = 1 + sum[i].abs().max().item<double>();
    EXPECT_LT((together[i] - sum[i]).abs().max().item<double>(), 1e-4 * scale) << "param " << i;
    largest = std::max(largest, sum[i].abs().max().item<double>());
  }
  EXPECT_GT(largest, 1e-3);  // gradients flow at all
}

TEST(BatchedAtenTraining, NewKeyAndValueGradientsMatchFiniteDifferences) {
  // Under autograd the attention's gradients reach this forward's new keys and values: layer
  // 0's k and v projections act on the loss only through them, so their gradients are nonzero
  // and equal central finite differences of the loss along them. The cached prefix is a
  // constant: the context is cached once and every evaluation reads those same keys. One
  // sequence has a cached context and a tree, the other none and fewer tokens (padded).
  auto m = testing::RandomModel(testing::TinyConfig(), 11);
  const ModelConfig& c = m->config();
  const int64_t q_rows = c.num_attention_heads * c.head_dim;
  const int64_t kv_rows = c.num_key_value_heads * c.head_dim;
  at::Tensor wqkv = m->Parameters()[2];  // layer 0's fused q, k, v (Parameters()' order)
  ASSERT_EQ(wqkv.size(0), q_rows + 2 * kv_rows);
  const int V = c.vocab_size;
  const int64_t context = 20;
  auto pool = m->NewBlockPool(0, false);
  KVCache with_context = m->NewCache(pool), fresh = m->NewCache(pool);
  {
    at::NoGradGuard no_grad;
    m->Forward({{&with_context, RandomTokens(context, V, 81), false, {}, {}}});
  }
  const std::vector<int64_t> a = RandomTokens(5, V, 82), b = RandomTokens(3, V, 83);
  auto loss = [&] {
    const at::Tensor logits =
        m->Forward({{&with_context, a, true, {-1, 0, 0, 1, 2}, {}}, {&fresh, b, true, {}, {}}});
    with_context.Truncate(context);
    fresh.Truncate(0);
    const at::Tensor w = at::arange(1, logits.size(0) + 1, logits.options());
    return (at::log_softmax(logits, -1).select(1, 3) * w).sum();
  };
  wqkv.requires_grad_(true);
  loss().backward();
  const at::Tensor grad = wqkv.grad().clone();
  wqkv.requires_grad_(false);
  at::NoGradGuard no_grad;
  for (int part = 0; part < 2; ++part) {  // the k rows, then the v rows
    const char* name = part == 0 ? "keys" : "values";
    at::Tensor d = at::zeros_like(grad);
    d.narrow(0, q_rows + part * kv_rows, kv_rows)
        .copy_(grad.narrow(0, q_rows + part * kv_rows, kv_rows));
    const double norm = d.norm().item<double>();  // the derivative along d / |d|
    ASSERT_GT(norm, 0.05) << "no gradient reaches the new " << name;
    d.div_(norm);
    constexpr double kStep = 1e-2;
    wqkv.add_(d, kStep);
    const double up = loss().item<double>();
    wqkv.add_(d, -2 * kStep);
    const double down = loss().item<double>();
    wqkv.add_(d, kStep);
    const double numeric = (up - down) / (2 * kStep);
    EXPECT_NEAR(numeric, norm, 5e-3 * norm) << name;
    RecordProperty(std::string(name) + "_autograd", std::to_string(norm));
    RecordProperty(std::string(name) + "_numeric", std::to_string(numeric));
  }
}

}  // namespace
}  // namespace specloop
