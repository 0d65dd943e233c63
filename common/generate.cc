#include "common/generate.h"

#include <chrono>

#include <c10/core/InferenceMode.h>

namespace specloop {

int SampleToken(const float* logits, int vocab, const SamplingParams& params, Rng* rng,
                std::vector<float>* scratch) {
  if (params.greedy()) return Argmax(logits, vocab);
  ProcessedDistribution(logits, vocab, params, scratch);
  return SampleFrom(scratch->data(), vocab, rng);
}

GenerateResult GeneratePlain(const LlamaModel& model, const std::vector<int>& prompt,
                             const GenerateOptions& options) {
  using Clock = std::chrono::steady_clock;
  c10::InferenceMode guard;
  const ModelConfig& c = model.config();
  GenerateResult r;
  if (prompt.empty() || options.max_tokens <= 0) return r;
  KVCache cache = model.NewCache(prompt.size() + options.max_tokens);
  Rng rng(options.sampling.seed);
  std::vector<float> scratch;
  ForwardInput in{&cache, std::vector<int64_t>(prompt.begin(), prompt.end()), false};

  auto t0 = Clock::now();
  while (true) {
    at::Tensor logits = model.Forward({in}).to(at::kCPU).contiguous();
    const int next = SampleToken(logits.data_ptr<float>(), c.vocab_size, options.sampling, &rng,
                                 &scratch);
    if (r.tokens.empty()) {
      auto t1 = Clock::now();
      r.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
      t0 = t1;
    }
    r.tokens.push_back(next);
    if (options.stop_at_eos && c.IsEos(next)) {
      r.hit_eos = true;
      break;
    }
    if (static_cast<int>(r.tokens.size()) >= options.max_tokens ||
        cache.length() >= c.max_position_embeddings) {  // no room to process `next`
      break;
    }
    in.tokens.assign(1, next);
  }
  r.decode_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

}  // namespace specloop
