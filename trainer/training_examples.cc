#include "trainer/training_examples.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/base/half.h"
#include "trainer/heldout_split.h"

namespace specloop {
namespace trainer {

bool IsHeldOut(const Record& r, double fraction) {
  if (r.prompt_len > 0 && r.prompt_len <= r.tokens.size()) {
    return IsHeldOutPrompt(r.tokens.data(), r.prompt_len, fraction);
  }
  const std::string key = !r.request_id.empty()
                              ? r.request_id
                              : std::to_string(r.time_us) + "/" + std::to_string(r.worker_id) +
                                    "/" + r.domain;
  return IsHeldOutKey(key, fraction);
}

std::vector<std::vector<const Record*>> SplitForForward(const std::vector<const Record*>& records,
                                                        size_t max_records, size_t max_tokens) {
  std::vector<std::vector<const Record*>> groups;
  size_t tokens = 0;
  for (const Record* r : records) {
    const size_t n = r->tokens.size();
    if (groups.empty() || (max_records > 0 && groups.back().size() >= max_records) ||
        tokens + n > max_tokens) {
      groups.emplace_back();
      tokens = 0;
    }
    groups.back().push_back(r);
    tokens += n;
  }
  return groups;
}

void BuildPositionBatch(const std::vector<const Record*>& records, int vocab, int max_positions,
                        Positions which, PositionBatch* out) {
  *out = PositionBatch();
  size_t K = std::numeric_limits<size_t>::max();
  for (const Record* r : records) {
    if (!r->steps.empty()) K = std::min<size_t>(K, r->top_k);
  }
  if (K == std::numeric_limits<size_t>::max() || K == 0) K = 0;
  std::vector<int64_t> ids, record_rows;
  std::vector<float> lps, tails;
  std::vector<uint32_t> seen(static_cast<size_t>(std::max(vocab, 1)), 0);
  uint32_t stamp = 0;
  for (size_t ri = 0; ri < records.size(); ++ri) {
    const Record* r = records[ri];
    if (K == 0) break;
    const size_t RK = r->top_k;
    const int64_t limit = std::min<int64_t>(r->tokens.size(), max_positions);
    int64_t needed = 0;  // tokens to feed: covers every used row's input index
    record_rows.clear();
    for (const SpecStep& st : r->steps) {
      const size_t k = st.draft_tokens.size();
      if (st.topk_ids.size() != (k + 1) * RK || st.topk_logprobs.size() != (k + 1) * RK ||
          st.tail_mass.size() != k + 1) {
        continue;
      }
      for (size_t j = 0; j <= std::min<size_t>(st.num_accepted, k); ++j) {
        const int64_t pos = static_cast<int64_t>(st.start_pos) + static_cast<int64_t>(j);
        if (pos < 1 || pos >= limit) continue;  // row predicts tokens[pos]; read at pos - 1
        if (which == Positions::kGenerated && pos < static_cast<int64_t>(r->prompt_len)) continue;
        // Validate the row.
        ++stamp;
        bool ok = true;
        double mass = 0, dropped = 0;
        for (size_t i = 0; i < RK && ok; ++i) {
          const int32_t id = st.topk_ids[j * RK + i];
          const float lp = HalfToFloat(st.topk_logprobs[j * RK + i]);
          if (i >= K) {
            if (!std::isnan(lp)) dropped += std::exp(static_cast<double>(lp));
            continue;
          }
          if (id < 0 || id >= vocab || seen[id] == stamp || std::isnan(lp)) ok = false;
          if (ok) {
            seen[id] = stamp;
            mass += std::exp(static_cast<double>(lp));
          }
        }
        float tail = st.tail_mass[j];
        if (std::isnan(tail)) tail = 0.0f;
        tail = static_cast<float>(std::clamp(static_cast<double>(tail) + dropped, 0.0, 1.0));
        if (!ok || mass + tail <= 0) continue;
        for (size_t i = 0; i < K; ++i) {
          ids.push_back(st.topk_ids[j * RK + i]);
          lps.push_back(HalfToFloat(st.topk_logprobs[j * RK + i]));
        }
        tails.push_back(tail);
        record_rows.push_back(pos - 1);
        out->domains.push_back(r->domain);
        out->record_index.push_back(static_cast<int32_t>(ri));
        out->predicted.push_back(pos);
        out->draft_index.push_back(static_cast<int32_t>(j));
        needed = std::max(needed, pos);
      }
    }
    if (record_rows.empty()) continue;
    out->inputs.emplace_back(r->tokens.begin(), r->tokens.begin() + needed);
    out->logit_rows.push_back(record_rows);
  }
  const int64_t N = out->size();
  const int64_t KK = static_cast<int64_t>(K);
  auto i64 = at::TensorOptions().dtype(at::kLong);
  auto f32 = at::TensorOptions().dtype(at::kFloat);
  out->target_ids = at::from_blob(ids.data(), {N, KK}, i64).clone();
  out->target_logprobs = at::from_blob(lps.data(), {N, KK}, f32).clone();
  out->target_tail = at::from_blob(tails.data(), {N}, f32).clone();
}

}  // namespace trainer
}  // namespace specloop
