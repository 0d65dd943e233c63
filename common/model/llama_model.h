// LlamaModel: a decoder-only causal LM of the Llama architecture and its relatives (RMSNorm,
// RoPE in the Hugging Face rotate_half layout with llama3 or linear scaling, SwiGLU,
// grouped-query attention, tied or untied embeddings; Qwen2's q/k/v biases, Qwen3's per-head
// q/k RMSNorm, Mistral: see ModelConfig) over LibTorch.
//
// One batched Forward() serves prefill, single-token decode, scoring a block of k+1 positions,
// and training: each sequence brings its own KVCache and any number of new tokens.
// Thread-safety: the model is immutable after load; concurrent Forward() calls are safe on
// distinct caches.
#pragma once

#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "common/base/status.h"
#include "common/kernels/linear_kernels.h"
#include "common/model/batched_attention.h"
#include "common/model/kv_cache.h"
#include "common/model/safetensors.h"
#include "common/tokenizer/model_config.h"

namespace specloop {

struct LoadOptions {
  // "cpu", "cuda" or "cuda:N". Default: cpu.
  std::string device = "cpu";
  // Weight dtype: "auto" (float32 on CPU, the stored dtype on CUDA), "float32", "float16",
  // "bfloat16". On CPU a 16-bit dtype keeps the matrices (and embeddings) in 16 bits, half the
  // bytes a decode step streams, and computes in float32; such a model serves inference only
  // (Forward under autograd throws). Default: auto.
  std::string dtype = "auto";
  // The context limit in positions (vLLM's --max-model-len): 0 for the model's
  // ModelConfig::PositionLimit(); more than that is refused. Nothing the model allocates
  // grows with it (RoPE is computed per forward); servers size their KV cache by it.
  int max_model_len = 0;
  // On CUDA, decode-shaped forwards replay CUDA graphs (LlamaModel::Forward), where LibTorch
  // was built with CUDA; false (--no-cuda-graphs) runs every forward eagerly. Default: true.
  bool cuda_graphs = true;
};

// One sequence's part of a batched forward.
struct ForwardInput {
  KVCache* cache = nullptr;     // positions [0, cache->length()) are already processed
  std::vector<int64_t> tokens;  // new tokens, at positions cache->length(), ... ; non-empty
  bool all_logits = false;      // logits for every new position, or only for the last
  // A tree of new tokens instead of a chain (speculative token trees): parents[i] is the index
  // of token i's parent among the new tokens, or -1 for a child of the cache's last position;
  // REQUIRES parents[i] < i. Token i takes cache slot length() + i, sits at position
  // length() + depth(i), and attends to the cache and its own ancestors only. Empty: a chain.
  // Afterwards KVCache::KeepPath() keeps one root-to-node path of the tree.
  std::vector<int> parents;
  // When non-empty: logits only for these new tokens (indices into `tokens`, in this order),
  // instead of all_logits or the last. Training reads a few positions of long sequences: the
  // vocabulary-sized head then runs on those alone.
  std::vector<int64_t> logit_rows;
};

class LlamaModel {
 public:
  // Loads DIR/config.json and DIR/model.safetensors (or its sharded index). Errors name the
  // file and tensor: missing tensors, wrong shapes, unsupported dtypes or architectures, and
  // (NotSupported) a tensor the family's forward does not use.
  static Status Load(const std::string& dir, const LoadOptions& options,
                     std::unique_ptr<LlamaModel>* out);
  // Builds a model from Hugging Face-named tensors (a loaded file, or random test weights).
  static Status FromTensors(const ModelConfig& config, const TensorMap& tensors,
                            const LoadOptions& options, std::unique_ptr<LlamaModel>* out);

  const ModelConfig& config() const { return config_; }
  // The token embedding [vocab, hidden] in the weights' dtype (EAGLE-3 heads read it).
  const at::Tensor& embedding() const { return embed_; }
  at::Device device() const { return embed_.device(); }
  // The weights' dtype (on CPU, activations are float32 whatever it is).
  at::ScalarType dtype() const { return embed_.scalar_type(); }

  // The weight bytes one CPU inference forward reads: every packed matrix once (0 once the
  // model is trained in place, or off the CPU). What bounds a decode step from below.
  int64_t StreamedWeightBytes() const;

  // An empty cache for one sequence of this model, in a pool of its own (unbounded), with
  // room for `initial_capacity` positions.
  KVCache NewCache(int64_t initial_capacity = 64) const;
  // A pool of at most `max_blocks` cache blocks (0: unbounded) for many sequences of this
  // model, and an empty cache in it (see kv_block_pool.h).
  std::shared_ptr<KVBlockPool> NewBlockPool(int64_t max_blocks, bool prefix_caching) const;
  KVCache NewCache(std::shared_ptr<KVBlockPool> pool) const;
  // The shape of this model's cache blocks, and the bytes of one.
  KVBlockPool::Shape CacheShape() const;
  int64_t CacheBlockBytes() const;

  // Runs the new tokens of every input through the model and appends them to the caches.
  // Returns float32 logits [rows, vocab] on the model's device: for each input in order, one
  // row per entry of logit_rows when given, else per new token when all_logits, else one row
  // for its last token.
  // REQUIRES: each cache came from this model's NewCache() and has room within
  // config().max_model_len, and its pool has the blocks the new tokens need (a bounded pool:
  // callers reserve first); throws c10::Error otherwise, leaving the caches' contents as they
  // were.
  // On CUDA with LoadOptions::cuda_graphs, outside autograd, a batch of at most
  // kStaticSeqs sequences of at most kStaticTokens new tokens each, whose caches share one
  // bounded pool (a server's), runs the shape-static forward: padded to powers of two in
  // sequences, new tokens and cached positions, it replays that padded shape's CUDA graph,
  // captured by PrepareStaticShapes() or else the first time the shape runs (at most
  // kStaticGraphs per pool; beyond, the same forward runs eagerly). Its padding writes go to one scratch block the model takes from the pool at
  // first use and keeps while the pool lives; at most kStaticPools live pools at once take
  // this path (those past them run eagerly).
  // Call under c10::InferenceMode for serving. Under autograd (training) attention reads the
  // new keys and values from the graph, so no in-place update enters it; what a cache already
  // holds (e.g. a prompt run under at::NoGradGuard, not InferenceMode) is a constant: no
  // gradient reaches the forward that computed it.
  at::Tensor Forward(const std::vector<ForwardInput>& batch) const;
  // The same forward, also returning in *hidden the residual stream entering each layer of
  // `layers` (Hugging Face's hidden_states[k]; layer 0's is the embedding) at every new token
  // of the batch, whatever logits are asked: float32 [tokens, layers.size() * hidden_size] on
  // the model's device, the inputs' tokens in order, the layers side by side in the order given
  // (the features EAGLE-3 draft heads read, at no extra target work: the layers run on every
  // token anyway). REQUIRES: 0 <= layers[i] < num_hidden_layers.
  at::Tensor Forward(const std::vector<ForwardInput>& batch, const std::vector<int>& layers,
                     at::Tensor* hidden) const;
  // The same forward with the new tokens read from `token_ids` (when defined) instead of the
  // inputs: [the batch's new tokens] int64 on the model's device, the inputs' tokens in order.
  // The inputs' token values are then placeholders (ids in the vocabulary, such as 0); their
  // count still sets each input's length. A draft forward thus reads the tokens the last one
  // drew where they were drawn (DrawOnDeviceAsync), with no copy to the host between them.
  // REQUIRES: every id lies in the vocabulary (checked on the CPU only: a GPU reads an id
  // outside it as an out-of-bounds index).
  at::Tensor Forward(const std::vector<ForwardInput>& batch, const std::vector<int>& layers,
                     at::Tensor* hidden, const at::Tensor& token_ids) const;

  // The weights under their Hugging Face names (fused projections split again), in load order;
  // the lm_head is left out when embeddings are tied. For saving checkpoints.
  std::vector<std::pair<std::string, at::Tensor>> NamedWeights() const;
  // Every trainable tensor (each once). Training updates them in place, so from this call on
  // the model drops its packed inference copies of the matrices and runs CPU inference from
  // these tensors (ForwardAten). Not to be called while another thread runs Forward().
  std::vector<at::Tensor> Parameters();

  // Prepares `pool`'s shape-static forward for decode steps of at most `max_seqs` sequences of
  // at most `max_tokens` new tokens each over at most `max_past` cached positions, asking the
  // hidden states of `layers`: on CUDA, captures the graph of every padded shape such steps
  // take (smallest contexts first, up to kStaticGraphs per pool), so that a server replays
  // graphs from its first step instead of capturing as shapes first appear. The captures run
  // on a scratch block alone: no cache's contents change. A no-op (returning 0) where Forward()
  // would not take the static path for this pool. Returns the padded shapes the pool has;
  // stops early if a capture fails (static_stats()). Bounds past kStaticSeqs, kStaticTokens or
  // max_model_len are clamped to them.
  int PrepareStaticShapes(const std::shared_ptr<KVBlockPool>& pool, int64_t max_seqs,
                          int64_t max_tokens, int64_t max_past,
                          const std::vector<int>& layers = {}) const;

  // Graphs per pool: a server of --max-batch 16 verifying up to 9 tokens a sequence over
  // contexts to 2K positions uses at most 5 x 5 x 8 = 200 padded shapes. A graph keeps its
  // padded rows' final hidden states, not their logits.
  static constexpr int64_t kStaticSeqs = 64, kStaticTokens = 16;
  static constexpr int kStaticGraphs = 256, kStaticPools = 4;
  // The shape-static forward since load: forwards run, padded shapes met or prepared (per
  // pool; each is a graph where graphs are on), graphs captured, and failed captures (after
  // the first, every forward runs eagerly; capture_error says why).
  struct StaticStats {
    int64_t forwards = 0, shapes = 0, captures = 0, capture_failures = 0;
    std::string capture_error;
  };
  StaticStats static_stats() const;

 private:
  struct Layer {
    at::Tensor attn_norm;  // [hidden]
    at::Tensor wqkv;       // [(heads + 2 kv_heads) * head_dim, hidden]: q, k, v stacked
    at::Tensor bqkv;       // [(heads + 2 kv_heads) * head_dim] (qkv_bias), else undefined
    at::Tensor q_norm, k_norm;  // [head_dim] each (qk_norm), else undefined
    at::Tensor wo;         // [hidden, heads * head_dim]
    at::Tensor ffn_norm;   // [hidden]
    at::Tensor w_gate_up;  // [2 * intermediate, hidden]: gate, up stacked
    at::Tensor w_down;     // [hidden, intermediate]
    // The CPU inference forward's copies of the four matrices (empty once trained).
    PackedMatrix qkv_packed, o_packed, gate_up_packed, down_packed;
  };
  // The new tokens of a batch, flattened; see Flatten().
  struct FlatBatch {
    std::vector<int64_t> ids, positions;  // [N]: every new token and its position
    std::vector<int64_t> starts, lengths, past;  // per input: first row, new tokens, cached
    std::vector<int64_t> out_rows;        // rows whose logits are returned
    // [input]: visible[i * n + j] for new tokens i, j of a tree input; empty for chains.
    std::vector<std::vector<char>> visible;
  };
  // Checks token ids and limits (throws c10::Error, leaving caches unchanged) and makes room
  // in every cache.
  FlatBatch Flatten(const std::vector<ForwardInput>& batch) const;

  // ForwardAten in two halves. The host half (PlanAten, PlanStatic) checks the batch, makes
  // room in the caches and appends every index the device needs to one upload; the device half
  // (RunAten) runs the layers from that upload alone, with the shapes the plan fixed and no
  // host synchronization: what a CUDA graph captures.
  struct AtenPlan {
    FlatBatch f;
    IndexUpload upload;
    int64_t rows = 0;                                // the forward's rows
    int tokens = -1, positions = -1;                 // parts: [rows] each
    int out_rows = -1;   // part: the rows RunAten returns; -1: every row
    int order = -1;      // several pools: the row of token r in the pools' outputs, or -1
    int select = -1, select_hidden = -1;  // PlanStatic: [rows] each, see ForwardStatic()
    std::vector<KVBlockPool*> pools;
    std::vector<BatchedAttention> attention;  // one per pool
  };
  AtenPlan PlanAten(const std::vector<ForwardInput>& batch) const;
  // The padded shape of a batch in the shape-static forward.
  struct StaticShape {
    int64_t seqs = 0, tokens = 0, past = 0;
    std::vector<int> layers;
    bool operator<(const StaticShape& o) const {
      return std::tie(seqs, tokens, past, layers) < std::tie(o.seqs, o.tokens, o.past, o.layers);
    }
  };
  // Sequence b's new tokens take rows [b * shape.tokens, b * shape.tokens + its count); the
  // rest of its rows are padding, written to `scratch`; sequences past the batch's are padding
  // entirely (an empty batch: a plan of the shape alone, for a capture). REQUIRES: the batch's
  // caches lie in `pool`.
  AtenPlan PlanStatic(const std::vector<ForwardInput>& batch, const StaticShape& shape,
                      KVBlockPool* pool, int32_t scratch) const;
  // Returns the final norm's output at the plan's out_rows (every row when -1), in the
  // activations' dtype, which the lm_head turns into logits; *hidden as Forward(). REQUIRES
  // plan.upload uploaded to the model's device.
  at::Tensor RunAten(AtenPlan& plan, const std::vector<int>& layers, at::Tensor* hidden) const;
  // The shape-static forward (see Forward()), or an undefined tensor, before any change to the
  // caches, when the batch is not one it takes.
  at::Tensor ForwardStatic(const std::vector<ForwardInput>& batch, const std::vector<int>& layers,
                           at::Tensor* hidden, const at::Tensor& token_ids) const;

  LlamaModel() = default;
  at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight) const;
  // RoPE's cos and sin for `positions` (a [N] long tensor on the device), laid out for
  // ForwardAten: [N, 1, 2, head_dim / 2] each, cos twice, then (-sin, sin).
  std::pair<at::Tensor, at::Tensor> RopeTables(const at::Tensor& positions) const;
  // Forward() over LibTorch operators: any device, any block size, autograd.
  // token_ids as Forward()'s.
  at::Tensor ForwardAten(const std::vector<ForwardInput>& batch, const std::vector<int>& layers,
                         at::Tensor* hidden, const at::Tensor& token_ids) const;
  // Forward() for CPU inference (no autograd), any block size, from the packed matrices in
  // float32, float16 or bfloat16 with float32 activations and accumulation
  // (llama_forward_cpu.cc). Same results as ForwardAten to float rounding; a row's logits do
  // not depend on the rest of the batch.
  at::Tensor ForwardCpu(const std::vector<ForwardInput>& batch, const std::vector<int>& layers,
                        at::Tensor* hidden) const;

  ModelConfig config_;
  at::Tensor embed_;       // [vocab, hidden]
  std::vector<Layer> layers_;
  at::Tensor final_norm_;  // [hidden]
  at::Tensor lm_head_;     // [vocab, hidden]; the same tensor as embed_ when tied
  std::vector<float> rope_inv_freq_;  // [head_dim / 2] (rope.h)
  at::Tensor rope_inv_freq_t_;        // the same, float32 on the model's device
  PackedMatrix lm_head_packed_;
  bool packed_ = false;    // the PackedMatrix copies are current (CPU models until trained)
  bool cuda_graphs_ = true;  // LoadOptions::cuda_graphs
  struct StaticState;        // static_forward.cc: scratch blocks and graphs, per pool
  static std::shared_ptr<StaticState> NewStaticState();
  std::shared_ptr<StaticState> static_;

 public:
  // Routes CPU inference to ForwardAten (false) or ForwardCpu (true). Default: true. Tests
  // turn it off to compare the two.
  void set_use_small_cpu_path(bool on) { use_small_cpu_path_ = on; }
  // Runs the shape-static forward (without graphs off CUDA) wherever a batch qualifies and the
  // ATen forward would run (on the CPU: with set_use_small_cpu_path(false)). Default: off (on
  // CUDA, LoadOptions::cuda_graphs decides). Tests compare the two.
  void set_static_shapes(bool on) { static_shapes_ = on; }

 private:
  bool use_small_cpu_path_ = true;
  bool static_shapes_ = false;
};

}  // namespace specloop
