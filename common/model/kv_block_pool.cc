#include "common/model/kv_block_pool.h"

#include <algorithm>
#include <cstring>

#include <c10/util/Exception.h>

namespace specloop {

KVBlockPool::KVBlockPool(Shape shape, at::TensorOptions options, int64_t max_blocks,
                         bool prefix_caching)
    : shape_(shape),
      options_(options.requires_grad(false)),
      max_blocks_(max_blocks),
      prefix_caching_(prefix_caching) {
  TORCH_CHECK(shape.layers > 0 && shape.kv_heads > 0 && shape.head_dim > 0 && max_blocks >= 0,
              "KVBlockPool: bad shape or size");
  if (bounded()) Grow(max_blocks_);
}

// Storage for `blocks` blocks in all. A bounded pool makes it once, of max_blocks (reserved
// memory, touched as blocks are first written); an unbounded one doubles, copying.
void KVBlockPool::Grow(int64_t blocks) {
  const int64_t old = storage_.defined() ? storage_.size(0) : 0;
  if (blocks <= old) return;
  at::Tensor s = at::empty({blocks, shape_.layers, 2, shape_.kv_heads, kBlockTokens,
                            shape_.head_dim},
                           options_);
  if (allocated_ > 0) s.narrow(0, 0, allocated_).copy_(storage_.narrow(0, 0, allocated_));
  storage_ = s;
  storage_ptr_ = storage_.is_cpu() && storage_.scalar_type() == at::kFloat
                     ? storage_.data_ptr<float>()
                     : nullptr;
}

bool KVBlockPool::Allocate(int64_t n, std::vector<int32_t>* out) {
  if (n <= 0) return true;
  if (bounded() && n > available()) return false;
  // Blocks never used yet go before cached ones are evicted.
  int64_t fresh = std::max<int64_t>(0, n - static_cast<int64_t>(free_.size()));
  if (bounded()) {
    fresh = std::min(fresh, max_blocks_ - allocated_);
  } else if (fresh > 0) {
    Grow(std::max(allocated_ + fresh, 2 * allocated_));
  }
  if (fresh > 0) {
    // Zeroed, so that a block's slots never written hold finite values: the batched ATen
    // attention reads whole blocks and masks the unwritten slots out, which garbage would
    // defeat (NaN or infinity times a zero weight is NaN).
    storage_.narrow(0, allocated_, fresh).zero_();
    // They join the free list, last ones first (so the lowest ids go out first: memory is
    // touched in order).
    meta_.resize(allocated_ + fresh);
    for (int64_t b = allocated_ + fresh - 1; b >= allocated_; --b) {
      free_.push_back(static_cast<int32_t>(b));
    }
    allocated_ += fresh;
  }
  for (int64_t i = 0; i < n; ++i) {
    int32_t b;
    if (!free_.empty()) {
      b = free_.back();
      free_.pop_back();
    } else {
      b = evictable_.front();  // the least recently released cached block
      Unregister(b);
      free_.pop_back();  // Unregister put it there
    }
    meta_[b].refs = 1;
    out->push_back(b);
  }
  return true;
}

void KVBlockPool::Release(int32_t block) {
  Meta& m = meta_[block];
  TORCH_CHECK(m.refs > 0, "KVBlockPool::Release of a free block");
  if (--m.refs > 0) return;
  if (m.chain != 0) {
    m.lru = evictable_.insert(evictable_.end(), block);
  } else {
    free_.push_back(block);
  }
}

uint64_t KVBlockPool::Key(uint64_t parent, const int* tokens) {
  uint64_t h = parent * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  for (int64_t i = 0; i < kBlockTokens; ++i) {
    h ^= static_cast<uint32_t>(tokens[i]);
    h *= 0x100000001B3ull;
    h ^= h >> 29;
  }
  return h;
}

KVBlockPool::Hit KVBlockPool::Lookup(uint64_t parent, const int* tokens) {
  if (!prefix_caching_) return {};
  const auto range = cached_.equal_range(Key(parent, tokens));
  for (auto it = range.first; it != range.second; ++it) {
    Meta& m = meta_[it->second];
    if (m.parent != parent || !std::equal(m.tokens.begin(), m.tokens.end(), tokens)) continue;
    if (m.refs++ == 0) evictable_.erase(m.lru);
    return {it->second, m.chain};
  }
  return {};
}

uint64_t KVBlockPool::Register(int32_t block, uint64_t parent, const int* tokens) {
  if (!prefix_caching_) return 0;
  Meta& m = meta_[block];
  if (m.chain != 0) return m.chain;  // already registered (an adopted block)
  const uint64_t key = Key(parent, tokens);
  const auto range = cached_.equal_range(key);
  for (auto it = range.first; it != range.second; ++it) {
    const Meta& o = meta_[it->second];
    if (o.parent == parent && std::equal(o.tokens.begin(), o.tokens.end(), tokens)) {
      return o.chain;  // the same content, computed by another sequence: that one stays
    }
  }
  m.chain = next_chain_++;
  m.parent = parent;
  m.key = key;
  m.tokens.assign(tokens, tokens + kBlockTokens);
  cached_.emplace(key, block);
  return m.chain;
}

// Forgets a registered block's content; an unreferenced one goes free. Blocks registered
// after it (chained to its id) can no longer be found and age out as they are evicted.
void KVBlockPool::Unregister(int32_t block) {
  Meta& m = meta_[block];
  const auto range = cached_.equal_range(m.key);
  for (auto it = range.first; it != range.second; ++it) {
    if (it->second == block) {
      cached_.erase(it);
      break;
    }
  }
  m.chain = 0;
  m.tokens.clear();
  if (m.refs == 0) {
    evictable_.erase(m.lru);
    free_.push_back(block);
  }
}

void KVBlockPool::DropCached() {
  std::vector<int32_t> registered;
  for (const auto& kv : cached_) registered.push_back(kv.second);
  for (int32_t b : registered) Unregister(b);
}

void KVBlockPool::CopySlot(int32_t from_block, int64_t from_offset, int32_t to_block,
                           int64_t to_offset) {
  storage_[to_block].narrow(3, to_offset, 1).copy_(storage_[from_block].narrow(3, from_offset, 1));
}

}  // namespace specloop
