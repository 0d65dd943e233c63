// KVCache: the attention keys and values of one sequence under one model.
//
// Holds positions [0, length()). A forward appends the positions it processes; Truncate()
// rolls back to an earlier length (speculative rejection), after which decoding continues as if
// the dropped positions had never been decoded. Storage grows by doubling up to the model's
// context limit. Not thread-safe: one sequence is stepped by one thread at a time.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

namespace specloop {

class LlamaModel;

class KVCache {
 public:
  KVCache() = default;  // empty; made usable by LlamaModel::NewCache()

  int64_t length() const { return length_; }
  int64_t capacity() const { return keys_.defined() ? keys_.size(2) : 0; }

  // REQUIRES: 0 <= n <= length().
  void Truncate(int64_t n);

  // After a tree forward at `past`: keeps slots past + path[0], past + path[1], ... (a
  // root-to-node path, in order) as positions past, past + 1, ... and drops the rest.
  // REQUIRES: path indices increasing and past + path.back() < length().
  void KeepPath(int64_t past, const std::vector<int>& path);

 private:
  friend class LlamaModel;
  KVCache(at::Tensor keys, at::Tensor values) : keys_(keys), values_(values) {}
  // Ensures room for `n` positions, keeping the first length() of them.
  void Reserve(int64_t n, int64_t limit);

  at::Tensor keys_;    // [layers, kv_heads, capacity, head_dim]
  at::Tensor values_;  // [layers, kv_heads, capacity, head_dim]
  int64_t length_ = 0;
};

}  // namespace specloop
