#include "common/engine/generate.h"

#include <algorithm>
#include <chrono>

#include <c10/core/InferenceMode.h>

namespace specloop {

int SampleToken(const float* logits, int vocab, const SamplingParams& params, Rng* rng,
                std::vector<float>* scratch) {
  if (params.greedy()) return Argmax(logits, vocab);
  ProcessedDistribution(logits, vocab, params, scratch);
  return SampleFrom(scratch->data(), vocab, rng);
}

using Clock = std::chrono::steady_clock;

PlainGeneration::PlainGeneration(const LlamaModel& model, const std::vector<int>& prompt,
                                 const GenerateOptions& options, TokenObserver observer)
    : model_(model),
      options_(options),
      observer_(std::move(observer)),
      cache_(options.pool ? model.NewCache(options.pool)
                          : model.NewCache(prompt.size() + std::max(0, options.max_tokens))),
      rng_(options.sampling.seed) {
  finished_ = prompt.empty() || options.max_tokens <= 0;
  if (finished_) return;
  c10::InferenceMode guard;
  const auto t0 = Clock::now();
  Sample(model_.Forward({{&cache_, std::vector<int64_t>(prompt.begin(), prompt.end()), false}}));
  result_.prefill_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
}

void PlainGeneration::Step() {
  c10::InferenceMode guard;
  const auto t0 = Clock::now();
  Sample(model_.Forward({{&cache_, {result_.tokens.back()}, false}}));
  result_.decode_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
}

void PlainGeneration::Sample(const at::Tensor& logits) {
  const ModelConfig& c = model_.config();
  at::Tensor row = logits.to(at::kCPU).contiguous();
  const int next = SampleToken(row.data_ptr<float>(), c.vocab_size, options_.sampling, &rng_,
                               &scratch_);
  result_.tokens.push_back(next);
  if (observer_) observer_(next, row.data_ptr<float>(), c.vocab_size);
  if (options_.stop_at_eos && c.IsEos(next)) {
    result_.hit_eos = finished_ = true;
  } else if (static_cast<int>(result_.tokens.size()) >= options_.max_tokens ||
             cache_.length() >= c.max_model_len) {  // no room to process `next`
    finished_ = true;
  }
}

GenerateResult GeneratePlain(const LlamaModel& model, const std::vector<int>& prompt,
                             const GenerateOptions& options) {
  PlainGeneration g(model, prompt, options);
  while (!g.finished()) g.Step();
  return g.result();
}

}  // namespace specloop
