// The forward's invariants on tiny random models: incremental decoding, batching and cache
// truncation all give the logits of one plain full forward.
#include "common/model/llama_model.h"

#include <gtest/gtest.h>

#include <ATen/core/grad_mode.h>

#include <c10/core/InferenceMode.h>

#include "tests/common/test_models.h"

namespace specloop {
namespace {

using testing::RandomModel;
using testing::TinyConfig;

constexpr double kTol = 1e-5;  // float32 logits of magnitude ~1; different op order only

std::vector<int64_t> RandomTokens(int n, int vocab, uint64_t seed) {
  at::manual_seed(seed);
  at::Tensor t = at::randint(vocab, {n}, at::kLong);
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + n);
}

// Logits of every position of `tokens` from one forward over a fresh cache.
at::Tensor FullForward(const LlamaModel& m, const std::vector<int64_t>& tokens) {
  KVCache cache = m.NewCache();
  return m.Forward({{&cache, tokens, true}});
}

class LlamaModelTest : public ::testing::TestWithParam<bool> {  // param: tied embeddings
 protected:
  c10::InferenceMode guard_;
};

TEST_P(LlamaModelTest, IncrementalDecodeMatchesFullForward) {
  auto m = RandomModel(TinyConfig(GetParam()), 1);
  auto tokens = RandomTokens(40, m->config().vocab_size, 2);
  at::Tensor full = FullForward(*m, tokens);

  // Prefill 7, then one token at a time, then a block of 5: every row must match.
  KVCache cache = m->NewCache(4);  // small initial capacity: exercises growth
  std::vector<at::Tensor> rows;
  rows.push_back(m->Forward({{&cache, {tokens.begin(), tokens.begin() + 7}, true}}));
  for (int i = 7; i < 35; ++i) rows.push_back(m->Forward({{&cache, {tokens[i]}, false}}));
  rows.push_back(m->Forward({{&cache, {tokens.begin() + 35, tokens.end()}, true}}));
  at::Tensor inc = at::cat(rows, 0);
  EXPECT_EQ(cache.length(), 40);
  ASSERT_EQ(inc.sizes(), full.sizes());
  EXPECT_LT((inc - full).abs().max().item<double>(), kTol);
}

TEST_P(LlamaModelTest, BatchOfDifferentLengthsMatchesEachAlone) {
  auto m = RandomModel(TinyConfig(GetParam()), 3);
  const int V = m->config().vocab_size;
  // Three sequences with different cached prefixes and new-token counts.
  std::vector<std::vector<int64_t>> seqs = {RandomTokens(20, V, 4), RandomTokens(9, V, 5),
                                            RandomTokens(31, V, 6)};
  std::vector<int> past = {15, 0, 30};
  std::vector<bool> all = {true, true, false};

  std::vector<KVCache> caches;
  for (int b = 0; b < 3; ++b) {
    caches.push_back(m->NewCache());
    if (past[b] > 0) m->Forward({{&caches[b], {seqs[b].begin(), seqs[b].begin() + past[b]}, false}});
  }
  std::vector<ForwardInput> batch;
  for (int b = 0; b < 3; ++b) {
    batch.push_back({&caches[b], {seqs[b].begin() + past[b], seqs[b].end()}, all[b]});
  }
  at::Tensor batched = m->Forward(batch);

  std::vector<at::Tensor> alone;
  for (int b = 0; b < 3; ++b) {
    at::Tensor full = FullForward(*m, seqs[b]);
    const int64_t n = seqs[b].size() - past[b];
    alone.push_back(all[b] ? full.narrow(0, past[b], n) : full.narrow(0, seqs[b].size() - 1, 1));
  }
  at::Tensor expected = at::cat(alone, 0);
  ASSERT_EQ(batched.sizes(), expected.sizes());
  EXPECT_LT((batched - expected).abs().max().item<double>(), kTol);
  for (int b = 0; b < 3; ++b) EXPECT_EQ(caches[b].length(), (int64_t)seqs[b].size());
}

TEST_P(LlamaModelTest, TruncateThenRedecodeEqualsNeverDecoded) {
  auto m = RandomModel(TinyConfig(GetParam()), 7);
  const int V = m->config().vocab_size;
  auto prefix = RandomTokens(12, V, 8);
  auto rejected = RandomTokens(5, V, 9);  // a speculative block that gets rolled back
  auto accepted = RandomTokens(6, V, 10);

  KVCache cache = m->NewCache();
  m->Forward({{&cache, prefix, false}});
  m->Forward({{&cache, rejected, true}});
  cache.Truncate(12);
  EXPECT_EQ(cache.length(), 12);
  at::Tensor after = m->Forward({{&cache, accepted, true}});

  std::vector<int64_t> clean = prefix;
  clean.insert(clean.end(), accepted.begin(), accepted.end());
  at::Tensor expected = FullForward(*m, clean).narrow(0, 12, 6);
  EXPECT_LT((after - expected).abs().max().item<double>(), kTol);
}

TEST_P(LlamaModelTest, SmallCpuPathMatchesAtenPath) {
  // The same batched decode and verification blocks through both implementations.
  auto m = RandomModel(TinyConfig(GetParam()), 21);
  const int V = m->config().vocab_size;
  std::vector<std::vector<int64_t>> seqs = {RandomTokens(60, V, 22), RandomTokens(45, V, 23)};
  at::Tensor out[2];
  for (int path = 0; path < 2; ++path) {
    m->set_use_small_cpu_path(path == 1);
    std::vector<KVCache> caches(2);
    for (KVCache& c : caches) c = m->NewCache();
    std::vector<at::Tensor> rows;
    // Prefill (20 tokens: always the ATen path), then blocks of 1, 5 and 16 with a rollback.
    m->Forward({{&caches[0], {seqs[0].begin(), seqs[0].begin() + 20}, false},
                {&caches[1], {seqs[1].begin(), seqs[1].begin() + 20}, false}});
    int64_t at0 = 20, at1 = 20;
    for (int n : {1, 5, 16, 1, 3}) {
      rows.push_back(m->Forward({{&caches[0], {seqs[0].begin() + at0, seqs[0].begin() + at0 + n}, true},
                                 {&caches[1], {seqs[1][at1]}, false}}));
      caches[0].Truncate(at0 + n - 1);  // reject the last token of the block
      at0 += n - 1;
      at1 += 1;
    }
    out[path] = at::cat(rows, 0);
  }
  EXPECT_LT((out[0] - out[1]).abs().max().item<double>(), kTol);
}

TEST_P(LlamaModelTest, LogitRowsSelectThoseRowsInTheirOrder) {
  // A batch mixing logit_rows (out of order, one repeated) with all_logits and last-only
  // inputs, through both implementations (the small path takes blocks of up to 16 tokens).
  auto m = RandomModel(TinyConfig(GetParam()), 31);
  const int V = m->config().vocab_size;
  std::vector<std::vector<int64_t>> seqs = {RandomTokens(14, V, 32), RandomTokens(12, V, 33),
                                            RandomTokens(9, V, 34)};
  std::vector<at::Tensor> full;
  for (const auto& s : seqs) full.push_back(FullForward(*m, s));
  const std::vector<int64_t> pick = {7, 2, 13, 2};
  at::Tensor expected = at::cat({full[0].index_select(0, at::tensor(pick)), full[1],
                                 full[2].narrow(0, 8, 1)},
                                0);
  for (bool small : {false, true}) {
    m->set_use_small_cpu_path(small);
    std::vector<KVCache> caches(3);
    for (KVCache& c : caches) c = m->NewCache();
    ForwardInput a{&caches[0], seqs[0], false, {}, pick};
    ForwardInput b{&caches[1], seqs[1], true, {}, {}};
    ForwardInput c{&caches[2], seqs[2], false, {}, {}};
    at::Tensor got = m->Forward({a, b, c});
    ASSERT_EQ(got.sizes(), expected.sizes()) << small;
    EXPECT_LT((got - expected).abs().max().item<double>(), kTol) << small;
  }
  // As many rows as tokens, reversed: still a selection, not every row in order.
  m->set_use_small_cpu_path(false);
  std::vector<int64_t> reversed(seqs[1].size());
  for (size_t i = 0; i < reversed.size(); ++i) reversed[i] = reversed.size() - 1 - i;
  KVCache cache = m->NewCache();
  at::Tensor back = m->Forward({{&cache, seqs[1], false, {}, reversed}});
  EXPECT_LT((back - full[1].flip(0)).abs().max().item<double>(), kTol);
  cache = m->NewCache();
  EXPECT_THROW(m->Forward({{&cache, seqs[2], false, {}, {9}}}), c10::Error);
  EXPECT_EQ(cache.length(), 0);
}

INSTANTIATE_TEST_SUITE_P(Embeddings, LlamaModelTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Tied" : "Untied"; });

TEST(LlamaModel, CausalPositionsDoNotSeeTheFuture) {
  c10::InferenceMode guard;
  auto m = RandomModel(TinyConfig(), 11);
  auto a = RandomTokens(10, m->config().vocab_size, 12);
  auto b = a;
  b[9] = (b[9] + 1) % m->config().vocab_size;  // change only the last token
  at::Tensor la = FullForward(*m, a), lb = FullForward(*m, b);
  EXPECT_LT((la.narrow(0, 0, 9) - lb.narrow(0, 0, 9)).abs().max().item<double>(), kTol);
  EXPECT_GT((la[9] - lb[9]).abs().max().item<double>(), 1e-3);
}

TEST(LlamaModel, TrainingOverACachedContextKeepsItsValuesAndStopsItsGradient) {
  // The trainer's context forward (TrainerOptions::context_gradient off): the context runs
  // under NoGradGuard into the cache, the rest under autograd. The logits are those of one
  // training forward over all tokens, and so is the head's gradient (the head reads only the
  // final hidden states of the rows); the embeddings of tokens seen only in the context get
  // no gradient, where the full forward gives them some.
  auto m = RandomModel(TinyConfig(/*tied=*/false), 41);
  const int V = m->config().vocab_size;
  std::vector<at::Tensor> params = m->Parameters();  // the embeddings first, the head last
  for (at::Tensor& p : params) p.requires_grad_(true);
  const std::vector<int64_t> context = RandomTokens(12, V / 2, 42);
  std::vector<int64_t> rest = RandomTokens(8, V / 2, 43);
  for (int64_t& t : rest) t += V / 2;  // ids disjoint from the context's
  const std::vector<int64_t> rows = {5, 0, 7};  // of `rest`
  at::Tensor logits[2], embed_grad[2], head_grad[2];
  for (int cached = 0; cached < 2; ++cached) {
    for (at::Tensor& p : params) p.mutable_grad() = at::Tensor();
    KVCache cache = m->NewCache();
    ForwardInput in{&cache, rest, false, {}, rows};
    if (cached) {
      at::NoGradGuard no_grad;
      m->Forward({{&cache, context}});
    } else {
      in.tokens.insert(in.tokens.begin(), context.begin(), context.end());
      for (int64_t& r : in.logit_rows) r += static_cast<int64_t>(context.size());
    }
    logits[cached] = m->Forward({in});
    EXPECT_EQ(cache.length(), 20);
    logits[cached].pow(2).sum().backward();
    embed_grad[cached] = params.front().grad().clone();
    head_grad[cached] = params.back().grad().clone();
  }
  ASSERT_EQ(logits[1].sizes(), (at::IntArrayRef{3, V}));
  EXPECT_LT((logits[0] - logits[1]).abs().max().item<double>(), kTol);
  EXPECT_LT((head_grad[0] - head_grad[1]).abs().max().item<double>(), 1e-4);
  const int64_t half = V / 2;
  EXPECT_GT(embed_grad[0].narrow(0, 0, half).abs().max().item<double>(), 1e-6);
  EXPECT_EQ(embed_grad[1].narrow(0, 0, half).abs().max().item<double>(), 0.0);
  EXPECT_GT(embed_grad[1].narrow(0, half, V - half).abs().max().item<double>(), 1e-6);
}

TEST(LlamaModel, HalfPrecisionWeightsLoadAndAgree) {
  c10::InferenceMode guard;
  ModelConfig c = TinyConfig();
  TensorMap w = testing::RandomLlamaWeights(c, 13);
  auto tokens = RandomTokens(16, c.vocab_size, 14);
  std::unique_ptr<LlamaModel> ref;
  ASSERT_TRUE(LlamaModel::FromTensors(c, w, LoadOptions(), &ref).ok());
  at::Tensor expected = FullForward(*ref, tokens);
  for (auto dtype : {at::kHalf, at::kBFloat16}) {
    TensorMap half;
    for (auto& [k, v] : w) half[k] = v.to(dtype);
    std::unique_ptr<LlamaModel> m;
    ASSERT_TRUE(LlamaModel::FromTensors(c, half, LoadOptions(), &m).ok());
    EXPECT_EQ(m->dtype(), at::kFloat);  // computed in float32 on CPU
    // Only the weights' rounding differs: bf16 keeps 8 bits of mantissa.
    EXPECT_LT((FullForward(*m, tokens) - expected).abs().max().item<double>(), 0.1);
  }
}

TEST(LlamaModel, NamedWeightsRoundTripThroughSafetensors) {
  c10::InferenceMode guard;
  for (bool tied : {false, true}) {
    ModelConfig c = TinyConfig(tied);
    auto m = RandomModel(c, 15);
    const std::string path = ::testing::TempDir() + "/roundtrip.safetensors";
    ASSERT_TRUE(WriteSafetensors(path, m->NamedWeights()).ok());
    TensorMap back;
    ASSERT_TRUE(ReadSafetensors(path, &back).ok());
    EXPECT_EQ(back.count("lm_head.weight"), tied ? 0u : 1u);
    std::unique_ptr<LlamaModel> m2;
    ASSERT_TRUE(LlamaModel::FromTensors(c, back, LoadOptions(), &m2).ok());
    auto tokens = RandomTokens(8, c.vocab_size, 16);
    EXPECT_TRUE(at::equal(FullForward(*m, tokens), FullForward(*m2, tokens)));
  }
}

TEST(LlamaModel, ContextLimitIsEnforced) {
  c10::InferenceMode guard;
  ModelConfig c = TinyConfig();
  c.max_position_embeddings = 16;
  auto m = RandomModel(c, 17);
  KVCache cache = m->NewCache();
  m->Forward({{&cache, RandomTokens(15, c.vocab_size, 18), false}});
  EXPECT_THROW(m->Forward({{&cache, {1, 2}, false}}), c10::Error);
  EXPECT_EQ(cache.length(), 15);  // a refused forward leaves the cache as it was
  m->Forward({{&cache, {1}, false}});
  EXPECT_EQ(cache.length(), 16);
}

TEST(LlamaModel, OutOfVocabularyTokenIsRefused) {
  c10::InferenceMode guard;
  auto m = RandomModel(TinyConfig(), 19);
  KVCache cache = m->NewCache();
  EXPECT_THROW(m->Forward({{&cache, {5, 97}, false}}), c10::Error);
  EXPECT_THROW(m->Forward({{&cache, {-1}, false}}), c10::Error);
  EXPECT_EQ(cache.length(), 0);
}

}  // namespace
}  // namespace specloop

namespace specloop {
namespace {

// A tree of new tokens scores each node exactly as a chain forward of its root-to-node path.
TEST(LlamaModelTree, TreeAttentionMatchesEachPath) {
  c10::InferenceMode guard;
  auto m = testing::RandomModel(testing::TinyConfig(), 31);
  const std::vector<int64_t> prefix = RandomTokens(9, m->config().vocab_size, 32);
  //        -1
  //      /    \
  //     0      1
  //    / \     |
  //   2   3    4
  //   |
  //   5
  const std::vector<int> parents = {-1, -1, 0, 0, 1, 2};
  const std::vector<int64_t> tokens = {11, 12, 13, 14, 15, 16};
  for (bool small : {true, false}) {
    m->set_use_small_cpu_path(small);
    KVCache cache = m->NewCache();
    m->Forward({{&cache, prefix, false}});
    ForwardInput in{&cache, tokens, true, parents};
    at::Tensor tree = m->Forward({in});
    ASSERT_EQ(tree.size(0), 6);
    for (int i = 0; i < 6; ++i) {
      std::vector<int64_t> path;
      for (int j = i; j >= 0; j = parents[j]) path.insert(path.begin(), tokens[j]);
      std::vector<int64_t> seq = prefix;
      seq.insert(seq.end(), path.begin(), path.end());
      at::Tensor expected = FullForward(*m, seq)[seq.size() - 1];
      EXPECT_LT((tree[i] - expected).abs().max().item<double>(), kTol) << "node " << i;
    }
    // Keeping the path 0 -> 2 -> 5 leaves the cache as if that chain had been decoded.
    cache.KeepPath(prefix.size(), {0, 2, 5});
    EXPECT_EQ(cache.length(), 12);
    at::Tensor next = m->Forward({{&cache, {17}, false}});
    std::vector<int64_t> seq = prefix;
    seq.insert(seq.end(), {11, 13, 16, 17});
    EXPECT_LT((next[0] - FullForward(*m, seq)[seq.size() - 1]).abs().max().item<double>(), kTol);
  }
}

TEST(LlamaModelTree, BadParentsAreRefused) {
  c10::InferenceMode guard;
  auto m = testing::RandomModel(testing::TinyConfig(), 33);
  KVCache cache = m->NewCache();
  EXPECT_THROW(m->Forward({{&cache, {1, 2}, true, {-1, 1}}}), c10::Error);  // not earlier
  EXPECT_THROW(m->Forward({{&cache, {1, 2}, true, {-1}}}), c10::Error);     // size mismatch
  EXPECT_EQ(cache.length(), 0);
}

}  // namespace
}  // namespace specloop
