#include "common/model/kv_cache.h"

#include <algorithm>

#include <c10/util/Exception.h>

namespace specloop {

void KVCache::Truncate(int64_t n) {
  TORCH_CHECK(n >= 0 && n <= length_, "KVCache::Truncate(", n, ") with length ", length_);
  length_ = n;
}

void KVCache::KeepPath(int64_t past, const std::vector<int>& path) {
  for (size_t m = 0; m < path.size(); ++m) {
    TORCH_CHECK(past + path[m] < length_ && (m == 0 || path[m] > path[m - 1]) &&
                    path[m] >= static_cast<int>(m),
                "KVCache::KeepPath: bad path");
    if (path[m] == static_cast<int>(m)) continue;  // already in place
    keys_.narrow(2, past + m, 1).copy_(keys_.narrow(2, past + path[m], 1));
    values_.narrow(2, past + m, 1).copy_(values_.narrow(2, past + path[m], 1));
  }
  Truncate(past + path.size());
}

void KVCache::Reserve(int64_t n, int64_t limit) {
  if (n <= capacity()) return;
  TORCH_CHECK(n <= limit, "sequence of ", n, " positions exceeds the context limit ", limit);
  const int64_t cap = std::min(limit, std::max<int64_t>(n, 2 * capacity()));
  auto grow = [&](const at::Tensor& old) {
    auto sizes = old.sizes().vec();
    sizes[2] = cap;
    at::Tensor t = at::empty(sizes, old.options());
    if (length_ > 0) t.narrow(2, 0, length_).copy_(old.narrow(2, 0, length_));
    return t;
  };
  keys_ = grow(keys_);
  values_ = grow(values_);
}

}  // namespace specloop
