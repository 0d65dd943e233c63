#include "serve/sample_logger.h"

#include <algorithm>

#include <c10/core/InferenceMode.h>

namespace specloop {

struct SampleLogger::Trace {
  explicit Trace(const RecordInfo& info, uint32_t prompt_len) : builder(info, prompt_len) {}
  RecordBuilder builder;  // touched by the worker only, after Begin()
};

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

size_t SampleLogger::pending_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_bytes_;
}

size_t SampleLogger::peak_pending_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_pending_bytes_;
}

std::shared_ptr<SampleLogger::Trace> SampleLogger::Begin(const std::string& domain,
                                                         const std::string& request_id,
                                                         uint64_t draft_version,
                                                         const SamplingParams& sampling,
                                                         const std::vector<int>& prompt) {
  RecordInfo info;
  info.domain = domain;
  info.request_id = request_id;
  info.worker_id = options_.worker_id;
  info.draft_version = draft_version;
  info.target_id = options_.target_id;
  info.sampling = sampling;
  info.top_k = options_.top_k;
  return std::make_shared<Trace>(info, static_cast<uint32_t>(prompt.size()));
}

void SampleLogger::Push(Job job) {
  if (!job.finish) {
    if (!job.rows.defined()) {
      steps_dropped_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    job.bytes = static_cast<size_t>(job.rows.numel()) * sizeof(float);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (pending_steps_ + job.steps() > options_.max_pending_steps ||
          pending_bytes_ + job.bytes > options_.max_pending_bytes) {
        steps_dropped_.fetch_add(job.steps(), std::memory_order_relaxed);
        return;  // the caller's rows are released here, never copied
      }
      pending_steps_ += job.steps();
      pending_bytes_ += job.bytes;
      peak_pending_bytes_ = std::max(peak_pending_bytes_, pending_bytes_);
    }
    // Outside the lock (one producer: nothing is pushed between the reservation and here).
    job.rows = job.rows.to(at::kCPU, at::kFloat, /*non_blocking=*/false, /*copy=*/true,
                           at::MemoryFormat::Contiguous);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
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
    RecordBuilder& builder = job.trace->builder;
    if (!job.finish) {
      const at::Tensor& rows = job.rows;  // Push's contiguous float32 CPU copy
      const int num_rows = rows.dim() == 2 ? static_cast<int>(rows.size(0)) : -1;
      const int vocab = rows.dim() == 2 ? static_cast<int>(rows.size(1)) : 0;
      const Status s =
          job.prompt ? builder.AddPromptRows(job.step.start_pos, rows.data_ptr<float>(), num_rows,
                                             vocab)
                     : builder.AddStep(job.step.start_pos, std::move(job.step.draft_tokens),
                                       job.step.num_accepted, rows.data_ptr<float>(), num_rows,
                                       vocab);
      if (!s.ok()) steps_dropped_.fetch_add(job.steps(), std::memory_order_relaxed);
      job.rows = at::Tensor();  // the rows are freed: they no longer count
      std::lock_guard<std::mutex> lock(mu_);
      pending_bytes_ -= job.bytes;
    } else {
      Record record;
      if (builder.Finish(std::move(job.tokens), &record).ok()) {
        logger_->Log(&record);  // drops are counted by the ReplayLogger
      } else {
        records_refused_.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
}

}  // namespace specloop
