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
    const bool top_k = job.top_k.ids.defined();
    if (top_k ? !job.top_k.logprobs.defined() || !job.top_k.tail_mass.defined()
              : !job.rows.defined()) {
      steps_dropped_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    job.bytes = top_k ? static_cast<size_t>(job.top_k.ids.numel()) * sizeof(int64_t) +
                            static_cast<size_t>(job.top_k.logprobs.numel() +
                                                job.top_k.tail_mass.numel()) *
                                sizeof(float)
                      : static_cast<size_t>(job.rows.numel()) * sizeof(float);
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
    const auto own = [](const at::Tensor& t, at::ScalarType type) {
      return t.to(at::kCPU, type, /*non_blocking=*/false, /*copy=*/true,
                  at::MemoryFormat::Contiguous);
    };
    if (top_k) {
      job.top_k = {own(job.top_k.ids, at::kLong), own(job.top_k.logprobs, at::kFloat),
                   own(job.top_k.tail_mass, at::kFloat)};
    } else {
      job.rows = own(job.rows, at::kFloat);
    }
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

void SampleLogger::AddStepTopK(const std::shared_ptr<Trace>& trace, uint32_t start_pos,
                               const std::vector<int>& draft_tokens, int num_accepted,
                               const spec::TopKTensors& top_k) {
  Job job;
  job.trace = trace;
  job.step.start_pos = start_pos;
  job.step.draft_tokens.assign(draft_tokens.begin(), draft_tokens.end());
  job.step.num_accepted = static_cast<uint32_t>(num_accepted);
  job.top_k = top_k;
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
      Status s;
      if (job.top_k.ids.defined()) {  // Push's contiguous CPU copies
        const spec::TopKTensors& t = job.top_k;
        const bool shaped = t.ids.dim() == 2 && t.logprobs.sizes() == t.ids.sizes() &&
                            t.tail_mass.dim() == 1 && t.tail_mass.size(0) == t.ids.size(0);
        s = !shaped ? Status::InvalidArgument("top-K tensors of mismatched shapes")
                    : builder.AddStepTopK(job.step.start_pos, std::move(job.step.draft_tokens),
                                          job.step.num_accepted, t.ids.data_ptr<int64_t>(),
                                          t.logprobs.data_ptr<float>(),
                                          t.tail_mass.data_ptr<float>(),
                                          static_cast<int>(t.ids.size(0)),
                                          static_cast<int>(t.ids.size(1)));
      } else {
        const at::Tensor& rows = job.rows;  // Push's contiguous float32 CPU copy
        const int num_rows = rows.dim() == 2 ? static_cast<int>(rows.size(0)) : -1;
        const int vocab = rows.dim() == 2 ? static_cast<int>(rows.size(1)) : 0;
        s = job.prompt ? builder.AddPromptRows(job.step.start_pos, rows.data_ptr<float>(),
                                               num_rows, vocab)
                       : builder.AddStep(job.step.start_pos, std::move(job.step.draft_tokens),
                                         job.step.num_accepted, rows.data_ptr<float>(), num_rows,
                                         vocab);
      }
      if (!s.ok()) steps_dropped_.fetch_add(job.steps(), std::memory_order_relaxed);
      job.rows = at::Tensor();  // the rows are freed: they no longer count
      job.top_k = spec::TopKTensors();
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
