// KVBlockPool: the attention keys and values of many sequences of one model, in fixed-size
// blocks of kBlockTokens positions (vLLM's paged KV cache). A KVCache is a table of block ids
// into a pool; the forward reads the blocks where they lie.
//
// Prefix caching: a full block whose tokens are committed can be registered under its tokens
// and the block chain before it. A new sequence adopts the longest chain of registered blocks
// matching its prompt instead of computing it (shared, reference-counted; a shared block is
// never written: only full blocks of committed tokens are registered, and a cache writes only
// past its committed length). A registered block that no cache references stays cached until
// an allocation needs it, least recently released first.
//
// Capacity: a bounded pool (max_blocks > 0) never holds more than max_blocks blocks: what a
// server sizes by --kv-cache-mb; its storage is reserved at once and touched only as blocks
// are first used. An unbounded pool (max_blocks = 0: one private cache, as generate, training
// and calibration use) grows by doubling, with a copy.
//
// Not thread-safe: a pool is used by one thread at a time (the scheduler's).
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include <ATen/ATen.h>

namespace specloop {

class KVBlockPool {
 public:
  static constexpr int64_t kBlockTokens = 16;

  struct Shape {
    int64_t layers = 0, kv_heads = 0, head_dim = 0;
    bool operator==(const Shape& o) const {
      return layers == o.layers && kv_heads == o.kv_heads && head_dim == o.head_dim;
    }
  };
  // `options`: the storage's dtype and device. `max_blocks` 0: unbounded. Without
  // `prefix_caching` nothing is registered and nothing found.
  KVBlockPool(Shape shape, at::TensorOptions options, int64_t max_blocks,
              bool prefix_caching = false);

  const Shape& shape() const { return shape_; }
  bool bounded() const { return max_blocks_ > 0; }
  bool prefix_caching() const { return prefix_caching_; }
  // Blocks a bounded pool holds in all (0 when unbounded).
  int64_t max_blocks() const { return max_blocks_; }
  // Blocks an allocation can get without growing: free ones (in a bounded pool, those never
  // used yet too) and cached ones no cache references.
  int64_t available() const {
    return reusable() + (bounded() ? max_blocks_ - allocated_ : 0);
  }
  // Blocks referenced by caches.
  int64_t used() const { return allocated_ - reusable(); }
  static int64_t BlocksFor(int64_t tokens) { return (tokens + kBlockTokens - 1) / kBlockTokens; }

  // Takes `n` blocks (reference count 1) into `out`, all or none: false when a bounded pool
  // cannot give them. Takes free blocks first, then evicts cached ones.
  bool Allocate(int64_t n, std::vector<int32_t>* out);
  // Drops one reference; at zero a registered block stays cached, another goes free.
  void Release(int32_t block);

  // Prefix caching. The registered blocks continuing the chain `parent` (0: the sequence's
  // start) with `tokens` (kBlockTokens of them): its block id and chain id, or -1.
  struct Hit {
    int32_t block = -1;
    uint64_t chain = 0;
  };
  // Takes a reference on a hit.
  Hit Lookup(uint64_t parent, const int* tokens);
  // Registers a full block of committed tokens after chain `parent`; returns the chain id of
  // the content (an earlier block's when the same content is already registered, which then
  // stays the one found).
  uint64_t Register(int32_t block, uint64_t parent, const int* tokens);
  // Unregisters every cached block (the keys and values are no longer the model's: a new
  // draft). Blocks still referenced stay with their caches.
  void DropCached();

  // Prefix-cache statistics in tokens: looked up, and found (KVCache::AdoptPrefix counts them).
  void CountQuery(int64_t queried, int64_t hit) {
    query_tokens_ += queried;
    hit_tokens_ += hit;
  }
  int64_t query_tokens() const { return query_tokens_; }
  int64_t hit_tokens() const { return hit_tokens_; }

  // The storage, [blocks, layers, 2 (keys, values), kv_heads, kBlockTokens, head_dim].
  const at::Tensor& storage() const { return storage_; }
  // CPU float32 storage: the kBlockTokens x head_dim keys (kind 0) or values (kind 1) of one
  // layer and key/value head in a block.
  float* Rows(int32_t block, int64_t layer, int kind, int64_t kv_head) const {
    return storage_ptr_ + (((block * shape_.layers + layer) * 2 + kind) * shape_.kv_heads +
                           kv_head) * kBlockTokens * shape_.head_dim;
  }
  // Copies the keys and values of every layer at one slot to another (any device).
  void CopySlot(int32_t from_block, int64_t from_offset, int32_t to_block, int64_t to_offset);

 private:
  // Blocks used before and now free or cached unreferenced.
  int64_t reusable() const { return static_cast<int64_t>(free_.size() + evictable_.size()); }

  struct Meta {
    int32_t refs = 0;
    uint64_t chain = 0;    // registration id (0: not registered)
    uint64_t parent = 0;   // the chain id before it
    uint64_t key = 0;      // its key in cached_
    std::vector<int> tokens;
    std::list<int32_t>::iterator lru;  // in evictable_ while refs == 0 and registered
  };
  static uint64_t Key(uint64_t parent, const int* tokens);
  void Grow(int64_t blocks);
  void Unregister(int32_t block);

  Shape shape_;
  at::TensorOptions options_;
  int64_t max_blocks_;
  bool prefix_caching_;
  at::Tensor storage_;
  float* storage_ptr_ = nullptr;  // CPU float32 storage, else null
  int64_t allocated_ = 0;         // blocks with storage
  std::vector<Meta> meta_;
  std::vector<int32_t> free_;           // unreferenced, unregistered
  std::list<int32_t> evictable_;        // unreferenced, registered: least recently released first
  std::unordered_multimap<uint64_t, int32_t> cached_;  // Key(parent, tokens) -> block
  uint64_t next_chain_ = 1;
  int64_t query_tokens_ = 0, hit_tokens_ = 0;
};

}  // namespace specloop
