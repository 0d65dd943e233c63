#include "serve/sample_logger.h"

#include <algorithm>
#include <cmath>

#include <c10/core/InferenceMode.h>

#include "buffer/half.h"
#include "common/kernels/cpu_kernels.h"

namespace specloop {

struct SampleLogger::Trace {
  Record record;  // touched by the worker only, after Begin()
};

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

SampleLogger::SampleLogger(ReplayLogger* logger, const SampleLoggerOptions& options)
    : logger_(logger), options_(options), worker_([this] { WorkerLoop(); }) {}

SampleLogger::~SampleLogger() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

size_t SampleLogger::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return jobs_.size();
}

std::shared_ptr<SampleLogger::Trace> SampleLogger::Begin(const std::string& domain,
                                                         const std::string& request_id,
                                                         uint64_t draft_version,
                                                         const SamplingParams& sampling,
                                                         const std::vector<int>& prompt) {
  auto t = std::make_shared<Trace>();
  Record& r = t->record;
  r.domain = domain.substr(0, 255);
  r.request_id = request_id;
  r.worker_id = options_.worker_id;
  r.draft_version = draft_version;
  r.target_id = options_.target_id;
  r.sampling = sampling;
  r.prompt_len = static_cast<uint32_t>(prompt.size());
  r.top_k = static_cast<uint32_t>(options_.top_k);
  return t;
}

void SampleLogger::Push(Job job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!job.finish) {
      if (pending_steps_ + job.steps() > options_.max_pending_steps) {
        steps_dropped_.fetch_add(job.steps(), std::memory_order_relaxed);
        return;  // `job` (and its view of the logits) is released here
      }
      pending_steps_ += job.steps();
    }
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
}

void SampleLogger::AddStep(const std::shared_ptr<Trace>& trace, uint32_t start_pos,
                           const std::vector<int>& draft_tokens, int num_accepted,
                           at::Tensor rows) {
  Job job;
  job.trace = trace;
  job.step.start_pos = start_pos;
  job.step.draft_tokens.assign(draft_tokens.begin(), draft_tokens.end());
  job.step.num_accepted = static_cast<uint32_t>(num_accepted);
  job.rows = std::move(rows);
  Push(std::move(job));
}

void SampleLogger::AddPromptRows(const std::shared_ptr<Trace>& trace, uint32_t first,
                                 at::Tensor rows) {
  Job job;
  job.trace = trace;
  job.step.start_pos = first;
  job.prompt = true;
  job.rows = std::move(rows);
  Push(std::move(job));
}

void SampleLogger::Finish(const std::shared_ptr<Trace>& trace, const std::vector<int>& tokens) {
  Job job;
  job.trace = trace;
  job.finish = true;
  job.tokens.assign(tokens.begin(), tokens.end());
  records_submitted_.fetch_add(1, std::memory_order_relaxed);
  Push(std::move(job));
}

void SampleLogger::WorkerLoop() {
  c10::InferenceMode guard;
  while (true) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stop_ and drained
      job = std::move(jobs_.front());
      jobs_.pop_front();
      if (!job.finish) pending_steps_ -= job.steps();
    }
    Record& r = job.trace->record;
    if (job.prompt) {
      const at::Tensor rows = job.rows.contiguous();
      const int vocab = static_cast<int>(rows.size(1));
      for (int64_t i = 0; i < rows.size(0); ++i) {
        SpecStep step;
        step.start_pos = job.step.start_pos + static_cast<uint32_t>(i);
        FillTopK(rows.data_ptr<float>() + i * vocab, 1, vocab, options_.top_k, &step);
        r.steps.push_back(std::move(step));
      }
      job.rows = at::Tensor();
    } else if (!job.finish) {
      at::Tensor rows = job.rows.contiguous();
      FillTopK(rows.data_ptr<float>(), static_cast<int>(rows.size(0)),
               static_cast<int>(rows.size(1)), options_.top_k, &job.step);
      job.rows = at::Tensor();  // let the batch's logits go
      r.steps.push_back(std::move(job.step));
    } else {
      r.tokens = std::move(job.tokens);
      Record record = std::move(r);
      logger_->Log(&record);  // drops are counted by the ReplayLogger
    }
  }
}

}  // namespace specloop
