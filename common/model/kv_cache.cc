#include "common/model/kv_cache.h"

#include <algorithm>

#include <c10/util/Exception.h>

namespace specloop {

KVCache::KVCache(KVCache&& o) noexcept
    : pool_(std::move(o.pool_)),
      blocks_(std::move(o.blocks_)),
      length_(o.length_),
      published_(o.published_),
      chain_(o.chain_) {
  o.blocks_.clear();
  o.length_ = o.published_ = 0;
  o.chain_ = 0;
}

KVCache& KVCache::operator=(KVCache&& o) noexcept {
  if (this != &o) {
    Clear();
    pool_ = std::move(o.pool_);
    blocks_ = std::move(o.blocks_);
    length_ = o.length_;
    published_ = o.published_;
    chain_ = o.chain_;
    o.blocks_.clear();
    o.length_ = o.published_ = 0;
    o.chain_ = 0;
  }
  return *this;
}

void KVCache::Clear() {
  // Last blocks first: a cached chain is then evicted from its end, its shared start last.
  if (pool_) {
    for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) pool_->Release(*it);
  }
  blocks_.clear();
  length_ = published_ = 0;
  chain_ = 0;
}

bool KVCache::Reserve(int64_t n) {
  const int64_t need = KVBlockPool::BlocksFor(n) - static_cast<int64_t>(blocks_.size());
  return need <= 0 || pool_->Allocate(need, &blocks_);
}

void KVCache::Truncate(int64_t n) {
  TORCH_CHECK(n >= 0 && n <= length_, "KVCache::Truncate(", n, ") with length ", length_);
  TORCH_CHECK(n >= published_ * KVBlockPool::kBlockTokens,
              "KVCache::Truncate into a registered block");
  length_ = n;
}

void KVCache::KeepPath(int64_t past, const std::vector<int>& path) {
  constexpr int64_t B = KVBlockPool::kBlockTokens;
  for (size_t m = 0; m < path.size(); ++m) {
    TORCH_CHECK(past + path[m] < length_ && (m == 0 || path[m] > path[m - 1]) &&
                    path[m] >= static_cast<int>(m),
                "KVCache::KeepPath: bad path");
    if (path[m] == static_cast<int>(m)) continue;  // already in place
    const int64_t from = past + path[m], to = past + m;
    pool_->CopySlot(blocks_[from / B], from % B, blocks_[to / B], to % B);
  }
  Truncate(past + path.size());
}

int64_t KVCache::AdoptPrefix(const std::vector<int>& tokens, int64_t limit) {
  TORCH_CHECK(length_ == 0, "KVCache::AdoptPrefix on a non-empty cache");
  if (!pool_->prefix_caching()) return 0;
  Clear();  // blocks reserved ahead of any position go back first
  constexpr int64_t B = KVBlockPool::kBlockTokens;
  limit = std::min<int64_t>(limit, tokens.size());
  while ((published_ + 1) * B <= limit) {
    const KVBlockPool::Hit hit = pool_->Lookup(chain_, tokens.data() + published_ * B);
    if (hit.block < 0) break;
    blocks_.push_back(hit.block);
    chain_ = hit.chain;
    ++published_;
  }
  length_ = published_ * B;
  pool_->CountQuery(limit, length_);
  return length_;
}

void KVCache::Publish(const std::vector<int>& tokens, int64_t n) {
  if (!pool_ || !pool_->prefix_caching()) return;
  constexpr int64_t B = KVBlockPool::kBlockTokens;
  n = std::min<int64_t>({n, length_, static_cast<int64_t>(tokens.size())});
  for (; (published_ + 1) * B <= n; ++published_) {
    chain_ = pool_->Register(blocks_[published_], chain_, tokens.data() + published_ * B);
  }
}

}  // namespace specloop
