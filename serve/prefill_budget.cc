#include "serve/prefill_budget.h"

#include <algorithm>

namespace specloop {

double PrefillChunkSeconds(const StepCostTable& costs, int rows, int64_t tokens, int64_t prefix) {
  const int n = static_cast<int>(tokens);
  const double attention =
      costs.TargetSeconds(n, prefix + (tokens - 1) / 2.0) - costs.TargetSeconds(n, 0);
  return costs.TargetSeconds(rows + n, 0) - costs.TargetSeconds(rows, 0) + attention;
}

int64_t PrefillBudget(const StepCostTable& costs, int decode_rows, int decoding, int prefilling,
                      double context, int64_t prefix) {
  if (decode_rows <= 0 || decoding <= 0) return kMaxPrefillChunk;
  const double share =
      std::max(kMinPrefillShare, static_cast<double>(prefilling) / decoding);
  const double allowed = share * costs.TargetSeconds(decode_rows + prefilling, context);
  int64_t lo = kMinPrefillChunk, hi = kMaxPrefillChunk;
  while (lo < hi) {  // the largest chunk within the allowance (seconds grow with tokens)
    const int64_t mid = (lo + hi + 1) / 2;
    if (PrefillChunkSeconds(costs, decode_rows, mid, prefix) <= allowed) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

}  // namespace specloop
