#include "buffer/record_builder.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "common/base/half.h"
#include "common/kernels/cpu_kernels.h"

namespace specloop {

void FillTopK(const float* rows, int num_rows, int vocab, int top_k, SpecStep* step) {
  const int K = std::max(0, std::min(top_k, vocab));
  step->topk_ids.assign(static_cast<size_t>(num_rows) * top_k, 0);
  step->topk_logprobs.assign(static_cast<size_t>(num_rows) * top_k, FloatToHalf(-INFINITY));
  step->tail_mass.assign(num_rows, 0.0f);
  if (vocab <= 0) return;
  std::vector<std::pair<float, int>> candidates(vocab);
  // Larger logit first; ties toward the lower id.
  const auto first = [](const std::pair<float, int>& a, const std::pair<float, int>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  for (int j = 0; j < num_rows; ++j) {
    const float* x = rows + static_cast<size_t>(j) * vocab;
    // A threshold at most the K-th largest value: cut the row into K blocks; their maxima are
    // K distinct entries, so at least K entries reach the smallest maximum. Only entries at or
    // above it are ranked (a few hundred of 4096 on real logits).
    float m = -INFINITY, threshold = K > 0 ? INFINITY : -INFINITY;
    const int block = K > 0 ? vocab / K : vocab;
    for (int b = 0, lo = 0; lo < vocab; ++b, lo += block) {
      const int hi = (K > 0 && b == K - 1) ? vocab : std::min(vocab, lo + block);
      const float bm = *std::max_element(x + lo, x + hi);
      m = std::max(m, bm);
      threshold = std::min(threshold, bm);
      if (hi == vocab) break;
    }
    const double lse = m + std::log(SumExpBelow(x, vocab, m));
    size_t n = 0;  // candidates[0, n): (logit, id) at or above the threshold, branch-free
    for (int v = 0; v < vocab; ++v) {
      candidates[n] = {x[v], v};
      n += x[v] >= threshold;
    }
    if (n < static_cast<size_t>(K)) {  // NaN logits: no threshold holds; rank NaN last
      for (int v = 0; v < vocab; ++v) candidates[v] = {std::isnan(x[v]) ? -INFINITY : x[v], v};
      n = vocab;
    }
    if (K > 0) {
      std::nth_element(candidates.begin(), candidates.begin() + (K - 1), candidates.begin() + n,
                       first);
      std::sort(candidates.begin(), candidates.begin() + K, first);
    }
    double kept = 0;
    for (int i = 0; i < K; ++i) {
      const int id = candidates[i].second;
      const double lp = x[id] - lse;
      kept += std::exp(lp);
      step->topk_ids[static_cast<size_t>(j) * top_k + i] = id;
      step->topk_logprobs[static_cast<size_t>(j) * top_k + i] =
          FloatToHalf(static_cast<float>(lp));
    }
    step->tail_mass[j] = static_cast<float>(std::clamp(1.0 - kept, 0.0, 1.0));
  }
}

RecordBuilder::RecordBuilder(const RecordInfo& info, uint32_t prompt_len) {
  record_.domain = info.domain.substr(0, 255);
  record_.request_id = info.request_id;
  record_.worker_id = info.worker_id;
  record_.draft_version = info.draft_version;
  record_.target_id = info.target_id;
  record_.sampling = info.sampling;
  record_.prompt_len = prompt_len;
  record_.top_k = static_cast<uint32_t>(std::max(0, info.top_k));
}

Status RecordBuilder::CheckRows(int vocab) const {
  if (vocab <= 0) return Status::InvalidArgument("rows of an empty vocabulary");
  if (record_.top_k == 0) return Status::InvalidArgument("top_k must be positive");
  return Status::OK();
}

Status RecordBuilder::CheckStep(size_t k, uint32_t num_accepted, int num_rows) const {
  if (num_accepted > k) {
    return Status::InvalidArgument("num_accepted " + std::to_string(num_accepted) +
                                   " exceeds k = " + std::to_string(k));
  }
  if (num_rows < 0 || static_cast<size_t>(num_rows) != k + 1) {
    return Status::InvalidArgument("a step of k = " + std::to_string(k) + " needs k + 1 rows, got " +
                                   std::to_string(num_rows));
  }
  return Status::OK();
}

Status RecordBuilder::AddStep(uint32_t start_pos, std::vector<int32_t> draft_tokens,
                              uint32_t num_accepted, const float* rows, int num_rows,
                              int vocab) {
  SPECLOOP_RETURN_IF_ERROR(CheckRows(vocab));
  SPECLOOP_RETURN_IF_ERROR(CheckStep(draft_tokens.size(), num_accepted, num_rows));
  SpecStep step;
  step.start_pos = start_pos;
  step.draft_tokens = std::move(draft_tokens);
  step.num_accepted = num_accepted;
  FillTopK(rows, num_rows, vocab, static_cast<int>(record_.top_k), &step);
  record_.steps.push_back(std::move(step));
  return Status::OK();
}

Status RecordBuilder::AddStepTopK(uint32_t start_pos, std::vector<int32_t> draft_tokens,
                                  uint32_t num_accepted, const int64_t* ids,
                                  const float* logprobs, const float* tail_mass, int num_rows,
                                  int top_k) {
  if (top_k <= 0 || static_cast<uint32_t>(top_k) != record_.top_k) {
    return Status::InvalidArgument("a top-" + std::to_string(top_k) + " step in a record of K = " +
                                   std::to_string(record_.top_k));
  }
  SPECLOOP_RETURN_IF_ERROR(CheckStep(draft_tokens.size(), num_accepted, num_rows));
  SpecStep step;
  step.start_pos = start_pos;
  step.draft_tokens = std::move(draft_tokens);
  step.num_accepted = num_accepted;
  const size_t n = static_cast<size_t>(num_rows) * top_k;
  step.topk_ids.resize(n);
  step.topk_logprobs.resize(n);
  for (size_t i = 0; i < n; ++i) {
    step.topk_ids[i] = static_cast<int32_t>(ids[i]);
    step.topk_logprobs[i] = FloatToHalf(logprobs[i]);
  }
  step.tail_mass.resize(num_rows);
  for (int j = 0; j < num_rows; ++j) step.tail_mass[j] = std::clamp(tail_mass[j], 0.0f, 1.0f);
  record_.steps.push_back(std::move(step));
  return Status::OK();
}

Status RecordBuilder::AddPromptRows(uint32_t first, const float* rows, int num_rows, int vocab) {
  SPECLOOP_RETURN_IF_ERROR(CheckRows(vocab));
  if (first < 1 || num_rows < 0 ||
      static_cast<uint64_t>(first) + static_cast<uint64_t>(num_rows) > record_.prompt_len) {
    return Status::InvalidArgument("prompt rows at positions [" + std::to_string(first) + ", " +
                                   std::to_string(static_cast<int64_t>(first) + num_rows) +
                                   ") outside [1, prompt_len = " +
                                   std::to_string(record_.prompt_len) + ")");
  }
  for (int i = 0; i < num_rows; ++i) {
    SpecStep step;
    step.start_pos = first + static_cast<uint32_t>(i);
    FillTopK(rows + static_cast<size_t>(i) * vocab, 1, vocab, static_cast<int>(record_.top_k),
             &step);
    record_.steps.push_back(std::move(step));
  }
  return Status::OK();
}

Status RecordBuilder::Finish(std::vector<int32_t> tokens, Record* out) {
  if (tokens.size() < record_.prompt_len) {
    return Status::InvalidArgument("tokens (" + std::to_string(tokens.size()) +
                                   ") shorter than the prompt (" +
                                   std::to_string(record_.prompt_len) + ")");
  }
  record_.tokens = std::move(tokens);
  const std::string bad = ValidateRecord(record_);
  if (!bad.empty()) return Status::InvalidArgument("record: " + bad);
  *out = std::move(record_);
  record_ = Record();
  return Status::OK();
}

}  // namespace specloop
