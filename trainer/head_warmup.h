// Head warm-up: self-distillation of a freshly grown EAGLE-3 head (Eagle3Head::InitFromTarget)
// on text its target samples itself, so that `specloop draft init` writes a head that already
// drafts, with no corpus and no traffic.
//
// The target samples sequences from its config's bos_token_id (for families whose tokenizer
// adds no BOS, such as Qwen, that id is the document separator, a start as well; a random id of
// the head's draft vocabulary where the config has none in the vocabulary), plus
// `prefix_tokens` random ids of the draft vocabulary, at `temperature`, many side by side in
// one batched forward per position. The same forwards give the features the head reads and the
// target's full distribution at every position, so each batch of sequences is a set of training
// examples at no further target work; the feature-draft trainer's training-time test
// (feature_draft_training.h: AccumulateExampleGradients, the loss and targets of online
// training) trains the head on them, `batch_records` sequences per optimizer step, each
// sequence once. The target's distribution is the training target whatever text it is computed
// on; sampled text puts the head where the target itself writes.
//
// Deterministic: sequence i draws from its own Rng (seed, i), and a row's logits do not depend
// on the rest of the batch, so the text does not depend on batch_sequences; training visits it
// in a fixed order. The same options on the same machine and thread count give the same head.
//
// Thread safety: none (runs the target and trains the head on the calling thread).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "common/base/status.h"
#include "common/model/eagle3_head.h"
#include "common/model/llama_model.h"
#include "trainer/adamw.h"
#include "trainer/feature_draft_training.h"

namespace specloop {
namespace trainer {

struct HeadWarmupOptions {
  // Tokens of the sampled sequences (starts and prefixes included), each trained on once; 0: no
  // warm-up. Default: 0 (the command's default is kDefaultWarmupTokens).
  int64_t tokens = 0;
  // Sequences sampled side by side (one batched target forward per position). Default: 16.
  int batch_sequences = 16;
  // Tokens of a sequence, start and prefix included (fewer where it samples an EOS; capped by
  // the target's context limit). Default: 128.
  int sequence_tokens = 128;
  // Random ids of the draft vocabulary after the start, drawn uniformly: a spread of starts
  // beyond what the target writes first. Default: 0.
  int prefix_tokens = 0;
  // Sampling temperature of the target's text (1: its own distribution). Default: 1.
  float temperature = 1.0f;
  // Sequences per optimizer step: a budget of 64-256 sequences makes few steps, so each one
  // counts. Default: 1.
  int batch_records = 1;
  // AdamW's learning rate times the head's hidden size: lr = lr_width / hidden_size, so that a
  // wider head takes smaller steps (as muP scales Adam's for hidden layers). Default: 0.768:
  // 3e-3 at hidden 256 (target-6m), 1e-3 at 768 (target-wide-46m); bench/head_warmup_bench
  // compares settings.
  double lr_width = 0.768;
  // AdamW's other settings (clip 1.0; its lr is set from lr_width).
  AdamWOptions adamw;
  // The learning rate falls linearly from adamw.lr to 0 over the budget (by tokens trained on
  // before each step); false: constant. Default: true.
  bool decay = true;
  // The training-time test: the trainer's objective and step decay, but 1 unrolled step: a
  // warm-up is bound by CPU, and S = 1 trains on about twice the tokens of the online
  // trainer's 3 for the same time. Default: steps 1.
  UnrollOptions unroll = [] {
    UnrollOptions u;
    u.steps = 1;
    return u;
  }();
  // Seed of the sampled text. Default: 1.
  uint64_t seed = 1;
};

// `draft init`'s budget: what one core warms a head for target-wide-46m on in under a minute
// (bench/head_warmup_bench measures the alpha it buys against larger budgets).
inline constexpr int64_t kDefaultWarmupTokens = 16384;

struct HeadWarmupReport {
  int64_t tokens = 0;     // tokens sampled (and trained on)
  int64_t sequences = 0;  // sequences sampled
  int64_t steps = 0;      // optimizer steps
  double sample_seconds = 0, train_seconds = 0;
  // Mean training loss over the first and the last batch of sequences (0 when none).
  double first_loss = 0, last_loss = 0;
};

// Called after each batch of sequences is trained on, with the totals so far.
using HeadWarmupProgress = std::function<void(const HeadWarmupReport&)>;

// Samples `count` (>= 0) sequences from `target` as the options say, sequence i (0-based) of
// at most lengths[i] tokens (each >= 3) from an Rng seeded by (seed, first_index + i), into
// *out: one example each (domain "warmup"), its tokens, features and target_logprobs aligned as
// BuildFeatureExamples builds them for `head` (feature_draft_training.h), taken from the
// sampling forwards themselves: no second target forward. An example shorter than 3 tokens (an
// early EOS) has no rows. Plain tensors (not inference tensors), constants under autograd.
// InvalidArgument names a bad option; IOError wraps a LibTorch failure.
Status SampleWarmupExamples(const LlamaModel& target, const Eagle3Head& head,
                            const HeadWarmupOptions& options, int64_t first_index,
                            const std::vector<int>& lengths, std::vector<FeatureExample>* out);

// Warms `head` (grown for `target`) up on options.tokens sampled tokens as described above;
// *report (may be null) gets what was done. Nothing happens for tokens == 0. Afterwards the
// head has run training (its Parameters() were taken: it computes from its unpacked tensors,
// gradients off); save and reload it for packed CPU inference. InvalidArgument names a bad
// option; IOError wraps a LibTorch failure.
Status WarmUpHead(const LlamaModel& target, Eagle3Head* head, const HeadWarmupOptions& options,
                  HeadWarmupReport* report, const HeadWarmupProgress& progress = nullptr);

}  // namespace trainer
}  // namespace specloop
