#include "trainer/head_warmup.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "common/base/clock.h"
#include "common/base/rng.h"
#include "common/engine/generate.h"

namespace specloop {
namespace trainer {

namespace {

using Clock = std::chrono::steady_clock;

// The seed of sequence `index`'s Rng: splitmix64 of the pair, so that neighbouring indices and
// seeds give unrelated streams.
uint64_t SequenceSeed(uint64_t seed, int64_t index) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ULL + static_cast<uint64_t>(index) + 0x632be59bd9b4e019ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

Status Validate(const LlamaModel& target, const HeadWarmupOptions& o) {
  if (o.tokens < 0) return Status::InvalidArgument("warm-up tokens must be >= 0");
  if (o.batch_sequences < 1) return Status::InvalidArgument("warm-up batch_sequences must be >= 1");
  if (o.batch_records < 1) return Status::InvalidArgument("warm-up batch_records must be >= 1");
  if (o.prefix_tokens < 0) return Status::InvalidArgument("warm-up prefix_tokens must be >= 0");
  if (!(o.temperature > 0)) return Status::InvalidArgument("warm-up temperature must be > 0");
  if (!(o.lr_width > 0)) return Status::InvalidArgument("warm-up lr_width must be > 0");
  if (o.sequence_tokens < 1 + o.prefix_tokens + 2) {
    return Status::InvalidArgument("warm-up sequences of " + std::to_string(o.sequence_tokens) +
                                   " tokens: at least the start, the prefix and 2 more");
  }
  if (1 + o.prefix_tokens + 2 > target.config().max_model_len) {
    return Status::InvalidArgument("warm-up prefix longer than the target's context");
  }
  return Status::OK();
}

}  // namespace

Status SampleWarmupExamples(const LlamaModel& target, const Eagle3Head& head,
                            const HeadWarmupOptions& o, int64_t first_index,
                            const std::vector<int>& lengths, std::vector<FeatureExample>* out) {
  out->clear();
  SPECLOOP_RETURN_IF_ERROR(Validate(target, o));
  const ModelConfig& c = target.config();
  const int count = static_cast<int>(lengths.size());
  for (const int n : lengths) {
    if (n < 3 || n > c.max_model_len) {
      return Status::InvalidArgument("a warm-up sequence of " + std::to_string(n) +
                                     " tokens (3 .. the target's context)");
    }
  }
  const int V = c.vocab_size;
  const std::vector<int>& draft_ids = head.draft_to_target();
  SamplingParams sampling;
  sampling.temperature = o.temperature;
  std::vector<Rng> rngs;
  out->resize(count);
  for (int i = 0; i < count; ++i) {
    rngs.emplace_back(SequenceSeed(o.seed, first_index + i));
    FeatureExample& ex = (*out)[i];
    ex.domain = "warmup";
    // The start: BOS, or (a config without one) a random id as the prefix's are drawn.
    const bool bos = c.bos_token_id >= 0 && c.bos_token_id < V;
    ex.tokens.push_back(bos ? c.bos_token_id : draft_ids[rngs[i].Next() % draft_ids.size()]);
    for (int p = 0; p < o.prefix_tokens && static_cast<int>(ex.tokens.size()) < lengths[i] - 1;
         ++p) {
      ex.tokens.push_back(draft_ids[rngs[i].Next() % draft_ids.size()]);
    }
  }
  try {
    // No gradient, but not InferenceMode: the tensors enter training graphs as constants.
    at::NoGradGuard no_grad;
    const at::Tensor ids =
        head.draft_vocab_size() == V
            ? at::Tensor()
            : at::tensor(std::vector<int64_t>(draft_ids.begin(), draft_ids.end()), at::kLong)
                  .to(target.device());
    std::vector<KVCache> caches;
    caches.reserve(count);
    // Per sequence, the features and the target's log-probabilities (draft vocabulary) of every
    // position fed so far, a tensor per forward.
    std::vector<std::vector<at::Tensor>> features(count), logprobs(count);
    for (int i = 0; i < count; ++i) caches.push_back(target.NewCache(lengths[i]));
    std::vector<int> live(count);  // sequences still running, in index order
    for (int i = 0; i < count; ++i) live[i] = i;
    std::vector<float> scratch;
    while (!live.empty()) {
      // Feed each live sequence's tokens not yet in its cache (the prefix at first, then the
      // token sampled last), every row's logits.
      std::vector<ForwardInput> in;
      in.reserve(live.size());
      for (const int i : live) {
        const std::vector<int64_t>& t = (*out)[i].tokens;
        ForwardInput fi;
        fi.cache = &caches[i];
        fi.tokens.assign(t.begin() + caches[i].length(), t.end());
        fi.all_logits = true;
        in.push_back(std::move(fi));
      }
      at::Tensor hidden;
      at::Tensor logits = target.Forward(in, head.config().aux_layers, &hidden);
      const at::Tensor cpu = logits.to(at::kCPU, at::kFloat).contiguous();
      if (ids.defined()) logits = logits.index_select(1, ids);
      const at::Tensor lp = at::log_softmax(logits.to(at::kFloat), 1);
      std::vector<int> still;
      int64_t row = 0;
      for (size_t k = 0; k < live.size(); ++k) {
        const int i = live[k];
        FeatureExample& ex = (*out)[i];
        const int64_t n = static_cast<int64_t>(in[k].tokens.size());
        features[i].push_back(hidden.narrow(0, row, n));
        logprobs[i].push_back(lp.narrow(0, row, n));
        row += n;
        // The last row predicts the next token: sample it unless the sequence is complete.
        if (c.IsEos(static_cast<int>(ex.tokens.back())) ||
            static_cast<int>(ex.tokens.size()) >= lengths[i]) {
          continue;
        }
        ex.tokens.push_back(SampleToken(cpu.data_ptr<float>() + (row - 1) * V, V, sampling,
                                        &rngs[i], &scratch));
        still.push_back(i);
      }
      live = std::move(still);
    }
    // Feature row t is position t's (t < N - 1); target row r the distribution at position
    // r + 1 (BuildFeatureExamples' alignment).
    for (int i = 0; i < count; ++i) {
      FeatureExample& ex = (*out)[i];
      const int64_t n = static_cast<int64_t>(ex.tokens.size());
      if (n < 3) continue;
      ex.features = at::cat(features[i], 0).narrow(0, 0, n - 1).contiguous();
      ex.target_logprobs = at::cat(logprobs[i], 0).narrow(0, 1, n - 1).contiguous();
    }
  } catch (const c10::Error& e) {
    return Status::IOError(std::string("warm-up sampling: ") + e.what_without_backtrace());
  }
  return Status::OK();
}

Status WarmUpHead(const LlamaModel& target, Eagle3Head* head, const HeadWarmupOptions& o,
                  HeadWarmupReport* report, const HeadWarmupProgress& progress) {
  HeadWarmupReport local;
  HeadWarmupReport& rep = report ? *report : local;
  rep = HeadWarmupReport();
  SPECLOOP_RETURN_IF_ERROR(Validate(target, o));
  if (o.tokens == 0) return Status::OK();
  const int length = std::min(o.sequence_tokens, target.config().max_model_len);
  std::vector<at::Tensor> params = head->Parameters();
  for (at::Tensor& p : params) p.requires_grad_(true);
  AdamWOptions adamw = o.adamw;
  adamw.lr = o.lr_width / static_cast<double>(head->hidden_size());
  AdamW optimizer(params, adamw);
  Status status;
  while (status.ok() && rep.tokens < o.tokens) {
    // A batch of sequences: full length while the budget lasts, the last one shorter (a
    // remainder under 3 tokens is dropped).
    std::vector<int> lengths;
    int64_t planned = rep.tokens;
    while (static_cast<int>(lengths.size()) < o.batch_sequences && o.tokens - planned >= 3) {
      const int n = static_cast<int>(std::min<int64_t>(length, o.tokens - planned));
      lengths.push_back(n);
      planned += n;
    }
    if (lengths.empty()) break;
    auto t0 = Clock::now();
    std::vector<FeatureExample> examples;
    status = SampleWarmupExamples(target, *head, o, rep.sequences, lengths, &examples);
    if (!status.ok()) break;
    rep.sample_seconds += SecondsSince(t0);
    rep.sequences += static_cast<int64_t>(examples.size());
    t0 = Clock::now();
    double loss_sum = 0;
    int loss_steps = 0;
    for (size_t b = 0; b < examples.size() && status.ok(); b += o.batch_records) {
      const std::vector<FeatureExample> batch(
          examples.begin() + b, examples.begin() + std::min(examples.size(), b + o.batch_records));
      const double lr_scale =
          o.decay ? 1.0 - static_cast<double>(rep.tokens) / static_cast<double>(o.tokens) : 1.0;
      for (const FeatureExample& ex : batch) rep.tokens += static_cast<int64_t>(ex.tokens.size());
      optimizer.ZeroGrad();
      double loss = 0;
      std::vector<std::string> rows;
      status = AccumulateExampleGradients(*head, batch, o.unroll, &loss, &rows);
      if (!status.ok() || rows.empty()) continue;
      optimizer.Step(lr_scale);
      loss_sum += loss;
      ++loss_steps;
      ++rep.steps;
    }
    rep.train_seconds += SecondsSince(t0);
    const double mean = loss_steps ? loss_sum / loss_steps : 0.0;
    if (rep.steps == loss_steps) rep.first_loss = mean;
    rep.last_loss = mean;
    if (status.ok() && progress) progress(rep);
  }
  for (at::Tensor& p : params) {
    p.requires_grad_(false);
    p.mutable_grad() = at::Tensor();
  }
  return status;
}

}  // namespace trainer
}  // namespace specloop
