// Eagle3Head: an EAGLE-3 feature draft (Li et al. 2025) for a LlamaModel target, in the layout
// vLLM and SGLang load (architecture LlamaForCausalLMEagle3; eagle3_config.h).
//
// At target position t the head reads the target's residual stream entering three of its
// layers (`aux_layers`, low / middle / high), side by side [3 * target_hidden], fused by `fc`
// into g_t [hidden], and the target's embedding of the next token x_{t+1}. Its one decoder
// layer (`midlayer`) attends, with its own KV cache, over
//   cat(input_layernorm(embed(x_{t+1})), hidden_norm(g_t))    [2 * hidden]
// with g_t as the residual; `norm` and `lm_head` give logits over the draft vocabulary, the
// distribution of x_{t+2}. Its output hidden state (before `norm`) stands in for g at the
// next position when it drafts on past the target's features. Draft id d is target id
// d + d2t[d] (the draft vocabulary, ascending target ids; the target's own when
// draft_vocab_size == vocab_size).
//
// The embedding is the target's (frozen, not saved). RoPE is the head's own (rope_theta of its
// config). Thread-safety: immutable after load; concurrent Forward() calls on distinct caches.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "common/base/status.h"
#include "common/kernels/linear_kernels.h"
#include "common/model/eagle3_config.h"
#include "common/model/llama_model.h"
#include "common/model/safetensors.h"

namespace specloop {

class Eagle3Head {
 public:
  // DIR/config.json (Eagle3Config) and DIR/model.safetensors, for `target` (which must
  // outlive the head: its embedding is read). Errors name what is missing or mismatched: a
  // tensor, a shape, a target of another width or vocabulary, an aux layer the target lacks;
  // tensors the forward does not read (embed_tokens aside) are NotSupported.
  // options.dtype as LlamaModel's; options.device must be the target's.
  static Status Load(const std::string& dir, const LlamaModel& target, const LoadOptions& options,
                     std::unique_ptr<Eagle3Head>* out);
  static Status FromTensors(const Eagle3Config& config, const TensorMap& tensors,
                            const LlamaModel& target, const LoadOptions& options,
                            std::unique_ptr<Eagle3Head>* out);

  // A head grown from the target alone (`specloop draft init`): see eagle3_head.cc's
  // InitFromTarget for how each tensor starts. `token_counts` (target vocabulary sized, may be
  // empty) chooses the draft vocabulary: the `draft_vocab_size` most frequent ids (ties and
  // empty counts: lowest ids first), in ascending order.
  struct InitOptions {
    std::vector<int> aux_layers;      // empty: DefaultAuxLayers(target layers)
    int draft_vocab_size = 0;         // 0: min(target vocabulary, 32000)
    std::vector<int64_t> token_counts;
    uint64_t seed = 1;
  };
  static Status InitFromTarget(const LlamaModel& target, const InitOptions& options,
                               std::unique_ptr<Eagle3Head>* out);

  // Writes DIR/config.json and DIR/model.safetensors (every floating tensor in `dtype`:
  // "float32", "float16" or "bfloat16", as published heads; see NamedWeights).
  Status Save(const std::string& dir, const std::string& dtype = "float32") const;
  // The checkpoint's tensors under their LlamaForCausalLMEagle3 names, in a fixed order:
  // fc.weight, midlayer.*, norm.weight, lm_head.weight, d2t (int64 [draft_vocab]), t2d (bool
  // [vocab]).
  std::vector<std::pair<std::string, at::Tensor>> NamedWeights() const;
  // The trainable tensors (fc, midlayer, norm, lm_head; not the embedding, d2t or t2d).
  // Training updates them in place: from this call on the head runs inference from them
  // (its packed CPU copies are dropped). Not while another thread runs Forward().
  std::vector<at::Tensor> Parameters();

  const Eagle3Config& config() const { return config_; }
  const LlamaModel& target() const { return *target_; }
  int64_t hidden_size() const { return config_.layer.hidden_size; }
  // Width of the target features the head reads: 3 * target_hidden_size.
  int64_t feature_width() const { return 3 * static_cast<int64_t>(config_.target_hidden_size); }
  int draft_vocab_size() const { return config_.draft_vocab_size; }
  // Target id of draft id d.
  int ToTarget(int d) const { return draft_to_target_[d]; }
  const std::vector<int>& draft_to_target() const { return draft_to_target_; }
  // The weight bytes one CPU inference forward reads (fc counted: catch-up forwards read it).
  int64_t StreamedWeightBytes() const;

  // The head's KV cache of one sequence: [capacity, kv_heads, head_dim] keys and values
  // (float32 on the head's device); positions [0, length) are valid. Rolling back is setting
  // length.
  struct Cache {
    at::Tensor keys, values;
    int64_t length = 0;
  };
  Cache NewCache(int64_t initial_capacity = 64) const;

  // One sequence's part of a batched forward: n rows at positions cache->length, ...
  struct Input {
    Cache* cache = nullptr;
    // [n, feature_width()]: the target's features (fused by fc), or [n, hidden_size()]: the
    // head's own output hidden states (fed as they are). Float32 on the head's device.
    at::Tensor hidden;
    // [n] target ids of the tokens whose embeddings go with the rows (x_{t+1} for row t).
    std::vector<int64_t> tokens;
  };
  // Runs every input's rows and appends them to the caches. Returns float32 logits over the
  // draft vocabulary for the last row of each input [inputs, draft_vocab], and in
  // *last_hidden those rows' output hidden states [inputs, hidden] (float32). A row's results do
  // not depend on the rest of the batch.
  // `token_ids`, when defined: the inputs' tokens read from [the batch's tokens] int64 on the
  // head's device instead (the inputs' values are then placeholders in the vocabulary), as
  // LlamaModel::Forward's; REQUIRES every id in the vocabulary.
  at::Tensor Forward(const std::vector<Input>& batch, at::Tensor* last_hidden,
                     const at::Tensor& token_ids = at::Tensor()) const;

  // Training-time test over one sequence of T positions (trainer): step 0 reads `features`
  // [T, feature_width()] with the embeddings of tokens[1..T]; step j >= 1 reads step j-1's output
  // hidden state at row t (standing at position t + j) with the embedding of tokens[t + j + 1].
  // Row t of step j attends to step 0's keys at positions <= t and to its own steps 1..j, as
  // drafting does. REQUIRES: tokens.size() == T + steps. Returns each step's logits over the
  // draft vocabulary [T, draft_vocab] (row t of step j predicts tokens[t + j + 2]). Autograd
  // flows into Parameters(); features are constants.
  std::vector<at::Tensor> ForwardUnrolled(const at::Tensor& features,
                                          const std::vector<int64_t>& tokens, int steps) const;

 private:
  Eagle3Head() = default;
  // The decoder layer over n rows: `x` [n, hidden] (fused features or own hidden), `tokens`
  // [n] long on the device, `positions` [n] long; attention by `attend(q, k, v)` -> [n, H * D]
  // (q [n, H, D], k and v [n, KVH, D] after RoPE). Returns the output hidden [n, hidden].
  template <typename Attend>
  at::Tensor Layer(const at::Tensor& x, const at::Tensor& tokens, const at::Tensor& positions,
                   Attend attend) const;
  at::Tensor Lin(const at::Tensor& x, const at::Tensor& w, const PackedMatrix& packed) const;
  at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& w) const;
  at::Tensor Logits(const at::Tensor& hidden) const;
  // Packs the matrices for CPU inference (packed_ = true).
  void Pack();

  Eagle3Config config_;
  const LlamaModel* target_ = nullptr;
  at::Tensor embed_;  // the target's [vocab, target_hidden] (any dtype; rows read as float32)
  at::Tensor fc_;     // [hidden, 3 * target_hidden]
  at::Tensor input_norm_, hidden_norm_, post_norm_, final_norm_;  // [hidden]
  at::Tensor wqkv_;     // [(H + 2 KVH) * D, 2 * hidden]: q, k, v stacked
  at::Tensor wo_;       // [hidden, H * D]
  at::Tensor w_gate_up_;  // [2 * intermediate, hidden]: gate, up stacked
  at::Tensor w_down_;   // [hidden, intermediate]
  at::Tensor lm_head_;  // [draft_vocab, hidden]
  std::vector<int> draft_to_target_;
  std::vector<float> rope_inv_freq_;
  at::Tensor rope_inv_freq_t_;
  PackedMatrix fc_p_, qkv_p_, o_p_, gate_up_p_, down_p_, lm_head_p_;
  bool packed_ = false;
};

}  // namespace specloop
