// KVCache: the attention keys and values of one sequence under one model, as a table of blocks
// in a KVBlockPool (kv_block_pool.h): position p lies in block blocks()[p / kBlockTokens].
//
// Holds positions [0, length()). A forward appends the positions it processes; Truncate()
// rolls back to an earlier length (speculative rejection), after which decoding continues as if
// the dropped positions had never been decoded. Blocks are taken as the cache grows (Reserve)
// and kept until the cache goes; the pool may be shared with other caches (a server's, bounded
// by --kv-cache-mb) or the cache's own (unbounded). Prefix caching: AdoptPrefix() starts a
// cache from registered blocks, Publish() registers its committed full blocks for others.
// Move-only; destruction returns the blocks. Not thread-safe: one sequence is stepped by one
// thread at a time, and a pool's caches by one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/model/kv_block_pool.h"

namespace specloop {

class LlamaModel;

class KVCache {
 public:
  KVCache() = default;  // empty; made usable by LlamaModel::NewCache()
  explicit KVCache(std::shared_ptr<KVBlockPool> pool) : pool_(std::move(pool)) {}
  ~KVCache() { Clear(); }
  KVCache(KVCache&& o) noexcept;
  KVCache& operator=(KVCache&& o) noexcept;
  KVCache(const KVCache&) = delete;
  KVCache& operator=(const KVCache&) = delete;

  int64_t length() const { return length_; }
  // Positions the blocks taken so far hold.
  int64_t capacity() const {
    return static_cast<int64_t>(blocks_.size()) * KVBlockPool::kBlockTokens;
  }
  const std::vector<int32_t>& blocks() const { return blocks_; }
  KVBlockPool* pool() const { return pool_.get(); }

  // Takes blocks for `n` positions in all: false (and nothing taken) when a bounded pool has
  // too few; always true for an unbounded one.
  bool Reserve(int64_t n);

  // REQUIRES: 0 <= n <= length().
  void Truncate(int64_t n);

  // After a tree forward at `past`: keeps slots past + path[0], past + path[1], ... (a
  // root-to-node path, in order) as positions past, past + 1, ... and drops the rest.
  // REQUIRES: path indices increasing and past + path.back() < length().
  void KeepPath(int64_t past, const std::vector<int>& path);

  // Prefix caching. REQUIRES an empty cache: takes the pool's registered blocks matching the
  // longest whole-block prefix of tokens[0, limit) and returns the positions they hold (a
  // multiple of kBlockTokens), from which the cache continues.
  int64_t AdoptPrefix(const std::vector<int>& tokens, int64_t limit);
  // Registers the full blocks of positions [0, min(n, length())) whose tokens, `tokens`, are
  // committed (never truncated away). Blocks registered before are skipped: a call per step
  // costs the blocks filled since the last.
  void Publish(const std::vector<int>& tokens, int64_t n);

  // Returns every block to the pool and empties the cache (its pool stays).
  void Clear();

 private:
  friend class LlamaModel;
  std::shared_ptr<KVBlockPool> pool_;
  std::vector<int32_t> blocks_;
  int64_t length_ = 0;
  // Prefix caching: the leading blocks registered (or adopted), and the last one's chain id.
  int64_t published_ = 0;
  uint64_t chain_ = 0;
};

}  // namespace specloop
