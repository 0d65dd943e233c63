// The paged KV cache: the block pool's accounting and prefix cache, and the forward over blocks
// scattered through a shared pool, adopted from the prefix cache or rearranged by a tree
// giving the bits of a private cache.
#include "common/model/kv_block_pool.h"
#include "common/model/kv_cache.h"

#include <algorithm>

#include <gtest/gtest.h>

#include <c10/core/InferenceMode.h>

#include "common/model/llama_model.h"
#include "tests/common/test_models.h"

namespace specloop {
namespace {

using testing::RandomModel;
using testing::TinyConfig;
constexpr int64_t B = KVBlockPool::kBlockTokens;

std::shared_ptr<KVBlockPool> SmallPool(int64_t blocks, bool prefix_caching = true) {
  return std::make_shared<KVBlockPool>(KVBlockPool::Shape{1, 1, 4}, at::kFloat, blocks,
                                       prefix_caching);
}

std::vector<int> Tokens(int n, int salt) {
  std::vector<int> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 7 + salt) % 50;
  return t;
}

TEST(KVBlockPool, BoundedAllocationIsAllOrNothing) {
  auto pool = SmallPool(4);
  EXPECT_EQ(pool->available(), 4);  // blocks never used yet count
  std::vector<int32_t> a, b;
  ASSERT_TRUE(pool->Allocate(3, &a));
  EXPECT_EQ(pool->available(), 1);
  EXPECT_EQ(pool->used(), 3);
  EXPECT_FALSE(pool->Allocate(2, &b));  // one left
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(pool->used(), 3);
  ASSERT_TRUE(pool->Allocate(1, &b));
  EXPECT_EQ(pool->available(), 0);
  for (int32_t x : a) pool->Release(x);
  EXPECT_EQ(pool->available(), 3);
  EXPECT_EQ(pool->used(), 1);
}

TEST(KVBlockPool, UnboundedPoolGrowsAndKeepsContents) {
  auto pool = SmallPool(0);
  std::vector<int32_t> a;
  ASSERT_TRUE(pool->Allocate(1, &a));
  pool->Rows(a[0], 0, 1, 0)[3] = 42.0f;
  ASSERT_TRUE(pool->Allocate(9, &a));  // grows the storage (a copy)
  EXPECT_EQ(pool->Rows(a[0], 0, 1, 0)[3], 42.0f);
  EXPECT_EQ(pool->used(), 10);
}

TEST(KVBlockPool, RegisteredBlocksAreFoundByContentAndChain) {
  auto pool = SmallPool(8);
  const std::vector<int> t = Tokens(3 * B, 1);
  std::vector<int32_t> blocks;
  ASSERT_TRUE(pool->Allocate(2, &blocks));
  const uint64_t c0 = pool->Register(blocks[0], 0, t.data());
  const uint64_t c1 = pool->Register(blocks[1], c0, t.data() + B);
  EXPECT_NE(c0, 0u);
  EXPECT_NE(c1, c0);

  KVBlockPool::Hit h = pool->Lookup(0, t.data());
  EXPECT_EQ(h.block, blocks[0]);
  EXPECT_EQ(h.chain, c0);
  pool->Release(h.block);
  // The second block's tokens after another chain, or at the start: not the same prefix.
  EXPECT_LT(pool->Lookup(0, t.data() + B).block, 0);
  EXPECT_LT(pool->Lookup(c1, t.data() + B).block, 0);
  std::vector<int> other = t;
  other[B - 1] += 1;  // one token differs
  EXPECT_LT(pool->Lookup(0, other.data()).block, 0);
  h = pool->Lookup(c0, t.data() + B);
  EXPECT_EQ(h.block, blocks[1]);
  pool->Release(h.block);

  // The same content computed again (by another sequence) keeps the first registration.
  std::vector<int32_t> dup;
  ASSERT_TRUE(pool->Allocate(1, &dup));
  EXPECT_EQ(pool->Register(dup[0], 0, t.data()), c0);
  h = pool->Lookup(0, t.data());
  EXPECT_EQ(h.block, blocks[0]);
}

TEST(KVBlockPool, CachedBlocksAreEvictedLeastRecentlyReleasedFirst) {
  auto pool = SmallPool(3);
  const std::vector<int> t = Tokens(3 * B, 2);
  std::vector<int32_t> blocks;
  ASSERT_TRUE(pool->Allocate(3, &blocks));
  uint64_t chain = 0;
  for (int i = 0; i < 3; ++i) chain = pool->Register(blocks[i], chain, t.data() + i * B);
  // Released last block first (as KVCache::Clear does): the chain's start is the most recent.
  for (int i = 2; i >= 0; --i) pool->Release(blocks[i]);
  EXPECT_EQ(pool->available(), 3);
  EXPECT_EQ(pool->used(), 0);
  std::vector<int32_t> fresh;
  ASSERT_TRUE(pool->Allocate(1, &fresh));  // evicts the chain's end
  EXPECT_EQ(fresh[0], blocks[2]);
  KVBlockPool::Hit h = pool->Lookup(0, t.data());
  ASSERT_EQ(h.block, blocks[0]);
  h = pool->Lookup(h.chain, t.data() + B);
  ASSERT_EQ(h.block, blocks[1]);
  EXPECT_LT(pool->Lookup(h.chain, t.data() + 2 * B).block, 0);
  // Referenced blocks are not evictable: the pool is full.
  std::vector<int32_t> more;
  EXPECT_FALSE(pool->Allocate(1, &more));
  pool->DropCached();
  EXPECT_LT(pool->Lookup(0, t.data()).block, 0);
}

// A bounded pool hands out blocks never used before it evicts cached ones: cached prefixes
// survive until the pool is full.
TEST(KVBlockPool, CachedBlocksAreEvictedOnlyWhenNoUnusedBlockIsLeft) {
  auto pool = SmallPool(4);
  const std::vector<int> t = Tokens(2 * B, 4);
  std::vector<int32_t> blocks;
  ASSERT_TRUE(pool->Allocate(2, &blocks));
  const uint64_t chain = pool->Register(blocks[0], 0, t.data());
  pool->Register(blocks[1], chain, t.data() + B);
  for (int i = 1; i >= 0; --i) pool->Release(blocks[i]);
  std::vector<int32_t> other;
  ASSERT_TRUE(pool->Allocate(2, &other));  // the two unused blocks
  for (int32_t b : other) EXPECT_EQ(std::count(blocks.begin(), blocks.end(), b), 0);
  KVBlockPool::Hit h = pool->Lookup(0, t.data());
  EXPECT_EQ(h.block, blocks[0]);
  pool->Release(h.block);
  std::vector<int32_t> third;
  ASSERT_TRUE(pool->Allocate(1, &third));  // now a cached one goes: the chain's end
  EXPECT_EQ(third[0], blocks[1]);
  EXPECT_FALSE(pool->Allocate(2, &third));
}

TEST(KVBlockPool, WithoutPrefixCachingNothingIsFound) {
  auto pool = SmallPool(4, /*prefix_caching=*/false);
  const std::vector<int> t = Tokens(B, 3);
  std::vector<int32_t> blocks;
  ASSERT_TRUE(pool->Allocate(1, &blocks));
  EXPECT_EQ(pool->Register(blocks[0], 0, t.data()), 0u);
  EXPECT_LT(pool->Lookup(0, t.data()).block, 0);
  pool->Release(blocks[0]);
  EXPECT_EQ(pool->available(), 4);
  EXPECT_EQ(pool->used(), 0);
}

class PagedForward : public ::testing::TestWithParam<bool> {  // param: the CPU path (or ATen)
 protected:
  c10::InferenceMode guard_;
};

std::vector<int64_t> Ids(const std::vector<int>& t, size_t begin, size_t end) {
  return std::vector<int64_t>(t.begin() + begin, t.begin() + end);
}

// Two sequences decoding in one shared pool take blocks in turn, so each one's blocks are
// scattered; their logits equal those of private (contiguous) caches, bit for bit.
TEST_P(PagedForward, ScatteredBlocksGiveThePrivateCachesBits) {
  auto m = RandomModel(TinyConfig(), 11);
  m->set_use_small_cpu_path(GetParam());
  const int V = m->config().vocab_size;
  std::vector<int> a = Tokens(70, 4), b = Tokens(70, 9);
  for (int& x : a) x %= V;
  for (int& x : b) x %= V;
  auto pool = m->NewBlockPool(64, /*prefix_caching=*/false);
  KVCache pa = m->NewCache(pool), pb = m->NewCache(pool);
  KVCache ca = m->NewCache(), cb = m->NewCache();
  // Prefill 10 and 13, then blocks of 1..5 alternating, each rejecting its last token.
  at::Tensor want = m->Forward({{&ca, Ids(a, 0, 10), true}, {&cb, Ids(b, 0, 13), true}});
  at::Tensor got = m->Forward({{&pa, Ids(a, 0, 10), true}, {&pb, Ids(b, 0, 13), true}});
  EXPECT_TRUE(at::equal(want, got));
  size_t ia = 10, ib = 13;
  for (int n : {1, 3, 5, 2, 4, 5, 5, 1, 5, 3, 5, 5}) {
    want = m->Forward({{&ca, Ids(a, ia, ia + n), true}, {&cb, Ids(b, ib, ib + 2), true}});
    got = m->Forward({{&pa, Ids(a, ia, ia + n), true}, {&pb, Ids(b, ib, ib + 2), true}});
    ASSERT_TRUE(at::equal(want, got)) << "block of " << n << " at " << ia;
    ia += n - 1;
    ib += 2;
    for (KVCache* c : {&ca, &pa}) c->Truncate(ia);
  }
  // The blocks interleave: a's are not one run.
  bool scattered = false;
  for (size_t i = 1; i < pa.blocks().size(); ++i) {
    scattered |= pa.blocks()[i] != pa.blocks()[i - 1] + 1;
  }
  EXPECT_TRUE(scattered);
}

// A tree forward across a block boundary, then KeepPath: the kept path's slots move between
// blocks, and the next forward sees what a chain forward of that path would have left.
TEST_P(PagedForward, KeepPathAcrossBlocksEqualsTheChain) {
  auto m = RandomModel(TinyConfig(), 12);
  m->set_use_small_cpu_path(GetParam());
  const int V = m->config().vocab_size;
  std::vector<int> t = Tokens(40, 5);
  for (int& x : t) x %= V;
  auto pool = m->NewBlockPool(16, false);
  KVCache tree = m->NewCache(pool), chain = m->NewCache(pool);
  const size_t past = B - 2;  // the tree's nodes straddle blocks 0 and 1
  m->Forward({{&tree, Ids(t, 0, past), false}});
  m->Forward({{&chain, Ids(t, 0, past), false}});
  // Nodes 0..5: 0 -> {1, 2}, 2 -> {3, 4}, 4 -> {5}; the path 0, 2, 4, 5.
  ForwardInput in{&tree, {t[20], t[21], t[22], t[23], t[24], t[25]}, true, {-1, 0, 0, 2, 2, 4}};
  m->Forward({in});
  tree.KeepPath(past, {0, 2, 4, 5});
  m->Forward({{&chain, {t[20], t[22], t[24], t[25]}, true}});
  ASSERT_EQ(tree.length(), chain.length());
  at::Tensor want = m->Forward({{&chain, Ids(t, 30, 34), true}});
  at::Tensor got = m->Forward({{&tree, Ids(t, 30, 34), true}});
  EXPECT_LT((want - got).abs().max().item<double>(), 1e-6);
}

// A second sequence sharing a prompt's first blocks adopts them and computes only the rest; its
// logits equal computing everything: bitwise on the small-block CPU path, whose rows do not
// depend on how many rows share a product; within float rounding on ATen's GEMMs.
TEST_P(PagedForward, AdoptedPrefixGivesTheComputedBits) {
  auto m = RandomModel(TinyConfig(), 13);
  m->set_use_small_cpu_path(GetParam());
  const int V = m->config().vocab_size;
  std::vector<int> first = Tokens(3 * B + 5, 6);
  for (int& x : first) x %= V;
  std::vector<int> second(first.begin(), first.begin() + 2 * B + 3);  // shares 2 full blocks
  for (int i = 0; i < 9; ++i) second.push_back((i * 13 + 1) % V);

  auto pool = m->NewBlockPool(32, /*prefix_caching=*/true);
  {
    KVCache c = m->NewCache(pool);
    EXPECT_EQ(c.AdoptPrefix(first, first.size() - 1), 0);
    m->Forward({{&c, Ids(first, 0, first.size()), false}});
    c.Publish(first, first.size());
  }  // released: its blocks stay cached
  EXPECT_EQ(pool->used(), 0);

  KVCache c = m->NewCache(pool);
  ASSERT_EQ(c.AdoptPrefix(second, second.size() - 1), 2 * B);
  EXPECT_EQ(pool->hit_tokens(), 2 * B);
  at::Tensor got = m->Forward({{&c, Ids(second, 2 * B, second.size()), true}});
  KVCache fresh = m->NewCache();
  at::Tensor want = m->Forward({{&fresh, Ids(second, 0, second.size()), true}})
                        .narrow(0, 2 * B, second.size() - 2 * B);
  if (GetParam()) {
    EXPECT_TRUE(at::equal(want, got));
  } else {
    EXPECT_LT((want - got).abs().max().item<double>(), 1e-5);
  }
  // Registered blocks are never written again: truncating into them is refused.
  c.Publish(second, second.size());
  EXPECT_THROW(c.Truncate(B), c10::Error);
}

INSTANTIATE_TEST_SUITE_P(Paths, PagedForward, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "Cpu" : "Aten";
                         });

TEST(PagedForwardLimits, AFullBoundedPoolRefusesTheForwardAndKeepsTheCache) {
  c10::InferenceMode guard;
  auto m = RandomModel(TinyConfig(), 14);
  auto pool = m->NewBlockPool(2, false);
  KVCache a = m->NewCache(pool), b = m->NewCache(pool);
  std::vector<int64_t> ids(B, 1);
  m->Forward({{&a, ids, false}});
  m->Forward({{&b, ids, false}});
  EXPECT_FALSE(a.Reserve(B + 1));
  EXPECT_THROW(m->Forward({{&a, {3}, false}}), c10::Error);
  EXPECT_EQ(a.length(), B);
  b = KVCache();  // its block returns
  EXPECT_NO_THROW(m->Forward({{&a, {3}, false}}));
  EXPECT_EQ(a.length(), B + 1);
}

}  // namespace
}  // namespace specloop
