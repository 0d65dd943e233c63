#include "common/model/llama_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>

#include <ATen/autocast_mode.h>
#include <c10/core/GradMode.h>

#include "common/model/batched_attention.h"
#include "common/model/device_graph.h"
#include "common/model/packed_linear.h"
#include "common/model/rope.h"

namespace specloop {

Status LlamaModel::Load(const std::string& dir, const LoadOptions& options,
                        std::unique_ptr<LlamaModel>* out) {
  ModelConfig config;
  SPECLOOP_RETURN_IF_ERROR(ModelConfig::FromDir(dir, &config));
  TensorMap tensors;
  SPECLOOP_RETURN_IF_ERROR(ReadModelWeights(dir, &tensors));
  return FromTensors(config, tensors, options, out).Annotate(dir);
}

Status LlamaModel::FromTensors(const ModelConfig& c, const TensorMap& tensors,
                               const LoadOptions& options, std::unique_ptr<LlamaModel>* out) {
  at::Device device(at::kCPU);
  try {
    device = at::Device(options.device);
  } catch (const c10::Error&) {
    return Status::InvalidArgument("unknown device " + options.device);
  }
  if (device.is_cuda() && !at::hasCUDA()) {
    return Status::NotSupported("--device cuda: this build of LibTorch has no CUDA");
  }
  auto it = tensors.find("model.embed_tokens.weight");
  if (it == tensors.end()) return Status::InvalidArgument("missing tensor model.embed_tokens.weight");
  at::ScalarType dtype;
  SPECLOOP_RETURN_IF_ERROR(ParseWeightDtype(options.dtype, it->second.scalar_type(), device.is_cuda(),
                                      &dtype));

  // Fetches a tensor, checks its shape, and moves it to the compute device and dtype. On CPU
  // the vectors (norm weights) stay float32 whatever the matrices' dtype.
  Status status;
  std::set<std::string> used;  // every tensor the forward reads
  auto get = [&](const std::string& name, std::vector<int64_t> shape) -> at::Tensor {
    if (!status.ok()) return {};
    used.insert(name);
    auto t = tensors.find(name);
    if (t == tensors.end()) {
      status = Status::InvalidArgument("missing tensor " + name + ", which the " +
                                       c.model_type + " forward that config.json describes reads");
      return {};
    }
    if (t->second.sizes() != at::IntArrayRef(shape)) {
      status = Status::InvalidArgument("tensor " + name + " has shape " +
                                       ShapeString(t->second.sizes()) + ", config.json implies " +
                                       ShapeString(shape));
      return {};
    }
    if (!at::isFloatingType(t->second.scalar_type())) {
      status = Status::InvalidArgument("tensor " + name + " is not floating point");
      return {};
    }
    const bool vector = shape.size() == 1 && device.is_cpu();
    return t->second.to(device, vector ? at::kFloat : dtype);
  };

  std::unique_ptr<LlamaModel> m(new LlamaModel());
  m->config_ = c;
  m->cuda_graphs_ = options.cuda_graphs;
  m->static_ = NewStaticState();
  const int limit = c.PositionLimit();
  m->config_.max_model_len = options.max_model_len > 0 ? options.max_model_len : limit;
  if (options.max_model_len > limit) {
    return c.sliding_window > 0 && c.sliding_window < c.max_position_embeddings
               ? Status::NotSupported(
                     "max_model_len " + std::to_string(options.max_model_len) +
                     ": attention beyond the sliding window of " +
                     std::to_string(c.sliding_window) + " positions is not implemented")
               : Status::InvalidArgument("max_model_len " + std::to_string(options.max_model_len) +
                                         " exceeds max_position_embeddings " +
                                         std::to_string(c.max_position_embeddings));
  }
  const int64_t hidden = c.hidden_size, hd = c.head_dim, ff = c.intermediate_size;
  const int64_t q_rows = c.num_attention_heads * hd, kv_rows = c.num_key_value_heads * hd;
  m->embed_ = get("model.embed_tokens.weight", {c.vocab_size, hidden});
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    Layer L;
    L.attn_norm = get(p + "input_layernorm.weight", {hidden});
    at::Tensor q = get(p + "self_attn.q_proj.weight", {q_rows, hidden});
    at::Tensor k = get(p + "self_attn.k_proj.weight", {kv_rows, hidden});
    at::Tensor v = get(p + "self_attn.v_proj.weight", {kv_rows, hidden});
    if (c.qkv_bias) {
      at::Tensor qb = get(p + "self_attn.q_proj.bias", {q_rows});
      at::Tensor kb = get(p + "self_attn.k_proj.bias", {kv_rows});
      at::Tensor vb = get(p + "self_attn.v_proj.bias", {kv_rows});
      if (status.ok()) L.bqkv = at::cat({qb, kb, vb});
    }
    if (c.qk_norm) {
      L.q_norm = get(p + "self_attn.q_norm.weight", {hd});
      L.k_norm = get(p + "self_attn.k_norm.weight", {hd});
    }
    L.wo = get(p + "self_attn.o_proj.weight", {hidden, q_rows});
    L.ffn_norm = get(p + "post_attention_layernorm.weight", {hidden});
    at::Tensor gate = get(p + "mlp.gate_proj.weight", {ff, hidden});
    at::Tensor up = get(p + "mlp.up_proj.weight", {ff, hidden});
    L.w_down = get(p + "mlp.down_proj.weight", {hidden, ff});
    if (!status.ok()) return status;
    L.wqkv = at::cat({q, k, v}, 0);
    L.w_gate_up = at::cat({gate, up}, 0);
    m->layers_.push_back(std::move(L));
  }
  m->final_norm_ = get("model.norm.weight", {hidden});
  auto lm_head = tensors.find("lm_head.weight");
  if (c.tie_word_embeddings && lm_head != tensors.end() && status.ok()) {
    // Tied: the forward reads the embedding; a stored copy must be that embedding.
    used.insert(lm_head->first);
    if (!lm_head->second.sizes().equals(it->second.sizes()) ||
        !at::equal(lm_head->second.to(at::kFloat), it->second.to(at::kFloat))) {
      return Status::InvalidArgument(
          "tie_word_embeddings is true but lm_head.weight differs from model.embed_tokens.weight");
    }
  }
  if (c.tie_word_embeddings) {
    m->lm_head_ = m->embed_;
  } else {
    m->lm_head_ = get("lm_head.weight", {c.vocab_size, hidden});
  }
  if (!status.ok()) return status;
  for (const auto& [name, tensor] : tensors) {
    const std::string suffix = "rotary_emb.inv_freq";  // a buffer older exports store
    const bool rope_buffer = name.size() >= suffix.size() &&
                             name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    if (!used.count(name) && !rope_buffer) {
      return Status::NotSupported("tensor " + name + " is not used by the " + c.model_type +
                                  " forward that config.json describes");
    }
  }

  m->rope_inv_freq_ = RopeInverseFrequencies(c);
  m->rope_inv_freq_t_ =
      at::from_blob(m->rope_inv_freq_.data(), {static_cast<int64_t>(m->rope_inv_freq_.size())},
                    at::kFloat)
          .to(device, /*non_blocking=*/false, /*copy=*/true);
  if (device.is_cpu()) {
    const auto pack = PackTensor;
    for (Layer& L : m->layers_) {
      L.qkv_packed = pack(L.wqkv);
      L.o_packed = pack(L.wo);
      L.gate_up_packed = pack(L.w_gate_up);
      L.down_packed = pack(L.w_down);
    }
    m->lm_head_packed_ = pack(m->lm_head_);
    m->packed_ = true;
  }
  *out = std::move(m);
  return Status::OK();
}

int64_t LlamaModel::StreamedWeightBytes() const {
  if (!packed_) return 0;
  int64_t bytes = lm_head_packed_.bytes();
  for (const Layer& L : layers_) {
    bytes += L.qkv_packed.bytes() + L.o_packed.bytes() + L.gate_up_packed.bytes() +
             L.down_packed.bytes();
  }
  return bytes;
}

KVBlockPool::Shape LlamaModel::CacheShape() const {
  return {config_.num_hidden_layers, config_.num_key_value_heads, config_.head_dim};
}

int64_t LlamaModel::CacheBlockBytes() const {
  const KVBlockPool::Shape sh = CacheShape();
  const int64_t element = device().is_cpu() ? 4 : static_cast<int64_t>(embed_.element_size());
  return sh.layers * 2 * sh.kv_heads * KVBlockPool::kBlockTokens * sh.head_dim * element;
}

std::shared_ptr<KVBlockPool> LlamaModel::NewBlockPool(int64_t max_blocks,
                                                      bool prefix_caching) const {
  auto opts = embed_.options().requires_grad(false);
  if (device().is_cpu()) opts = opts.dtype(at::kFloat);  // the CPU forward's activations
  return std::make_shared<KVBlockPool>(CacheShape(), opts, max_blocks, prefix_caching);
}

KVCache LlamaModel::NewCache(std::shared_ptr<KVBlockPool> pool) const {
  TORCH_CHECK(pool && pool->shape() == CacheShape(), "a KV block pool of another model's shape");
  return KVCache(std::move(pool));
}

KVCache LlamaModel::NewCache(int64_t initial_capacity) const {
  KVCache cache(NewBlockPool(0, false));
  cache.Reserve(std::max<int64_t>(1, std::min<int64_t>(initial_capacity, config_.max_model_len)));
  return cache;
}

at::Tensor LlamaModel::RmsNorm(const at::Tensor& x, const at::Tensor& weight) const {
  if (x.scalar_type() == at::kFloat) {
    return x * at::rsqrt(x.square().mean(-1, true) + config_.rms_norm_eps) * weight;
  }
  // Half precision: normalize in float32, as Hugging Face does.
  at::Tensor xf = x.to(at::kFloat);
  return (xf * at::rsqrt(xf.square().mean(-1, true) + config_.rms_norm_eps)).to(x.scalar_type()) *
         weight;
}

std::pair<at::Tensor, at::Tensor> LlamaModel::RopeTables(const at::Tensor& positions) const {
  // The angle in float32 (pos * inv_freq), as the tables of Hugging Face and llama2.c; cast to
  // the activations' dtype afterwards, as transformers does.
  const at::Tensor angle = positions.to(at::kFloat).unsqueeze(1) * rope_inv_freq_t_;  // [N, D/2]
  const at::Tensor c = at::cos(angle), s = at::sin(angle);
  const at::ScalarType t = device().is_cpu() ? at::kFloat : dtype();
  return {at::stack({c, c}, 1).unsqueeze(1).to(t), at::stack({-s, s}, 1).unsqueeze(1).to(t)};
}

at::Tensor LlamaModel::Forward(const std::vector<ForwardInput>& batch) const {
  return Forward(batch, {}, nullptr);
}

at::Tensor LlamaModel::Forward(const std::vector<ForwardInput>& batch,
                               const std::vector<int>& layers, at::Tensor* hidden) const {
  return Forward(batch, layers, hidden, at::Tensor());
}

at::Tensor LlamaModel::Forward(const std::vector<ForwardInput>& batch,
                               const std::vector<int>& layers, at::Tensor* hidden,
                               const at::Tensor& token_ids) const {
  if (token_ids.defined()) {
    size_t tokens = 0;
    for (const ForwardInput& in : batch) tokens += in.tokens.size();
    TORCH_CHECK(token_ids.dim() == 1 && token_ids.scalar_type() == at::kLong &&
                    token_ids.numel() == static_cast<int64_t>(tokens) &&
                    token_ids.device() == device(),
                "token_ids must be ", tokens, " int64 ids on ", device().str(), ", not ",
                token_ids.toString(), " ", token_ids.sizes());
  }
  for (const int l : layers) {
    TORCH_CHECK(l >= 0 && l < config_.num_hidden_layers, "hidden states of layer ", l,
                " asked of a model of ", config_.num_hidden_layers, " layers");
  }
  TORCH_CHECK(layers.empty() || hidden != nullptr, "hidden states asked without an output");
  if (packed_ && !c10::GradMode::is_enabled() && !batch.empty() &&
      (use_small_cpu_path_ || dtype() != at::kFloat)) {
    if (!token_ids.defined()) return ForwardCpu(batch, layers, hidden);
    std::vector<ForwardInput> with_ids = batch;  // the CPU kernels read the host's ids
    const at::Tensor ids = token_ids.contiguous();
    const int64_t* id = ids.data_ptr<int64_t>();
    for (ForwardInput& in : with_ids) {
      for (int64_t& t : in.tokens) t = *id++;  // Flatten checks the range
    }
    return ForwardCpu(with_ids, layers, hidden);
  }
  TORCH_CHECK(!device().is_cpu() || dtype() == at::kFloat,
              "a model with 16-bit weights on the CPU serves inference only (no autograd)");
  if (!c10::GradMode::is_enabled() && !batch.empty() &&
      (static_shapes_ || (cuda_graphs_ && device().is_cuda() && DeviceGraph::Supported()))) {
    at::Tensor logits = ForwardStatic(batch, layers, hidden, token_ids);
    if (logits.defined()) return logits;
  }
  return ForwardAten(batch, layers, hidden, token_ids);
}

LlamaModel::FlatBatch LlamaModel::Flatten(const std::vector<ForwardInput>& batch) const {
  TORCH_CHECK(!batch.empty(), "Forward of an empty batch");
  FlatBatch f;
  for (const auto& in : batch) {
    TORCH_CHECK(in.cache != nullptr && !in.tokens.empty(), "ForwardInput needs a cache and tokens");
    const int64_t L0 = in.cache->length(), n = in.tokens.size();
    TORCH_CHECK(L0 + n <= config_.max_model_len, "sequence of ", L0 + n,
                " positions exceeds the context limit ", config_.max_model_len);
    f.starts.push_back(f.ids.size());
    f.lengths.push_back(n);
    f.past.push_back(L0);
    // Tree inputs: depth of each token and which new tokens it sees (its ancestors and itself).
    std::vector<int64_t> depth(n);  // a chain: token i at depth i
    std::iota(depth.begin(), depth.end(), 0);
    std::vector<char> visible;
    if (!in.parents.empty()) {
      TORCH_CHECK(static_cast<int64_t>(in.parents.size()) == n, "parents must match tokens");
      visible.assign(n * n, 0);
      for (int64_t i = 0; i < n; ++i) {
        const int p = in.parents[i];
        TORCH_CHECK(p >= -1 && p < i, "parents[", i, "] = ", p, " is not an earlier token");
        depth[i] = p < 0 ? 0 : depth[p] + 1;
        if (p >= 0) std::copy_n(visible.begin() + p * n, n, visible.begin() + i * n);
        visible[i * n + i] = 1;
      }
    }
    f.visible.push_back(std::move(visible));
    for (const int64_t r : in.logit_rows) {
      TORCH_CHECK(r >= 0 && r < n, "logit row ", r, " outside the ", n, " new tokens");
      f.out_rows.push_back(f.starts.back() + r);
    }
    for (int64_t i = 0; i < n; ++i) {
      TORCH_CHECK(in.tokens[i] >= 0 && in.tokens[i] < config_.vocab_size, "token id ",
                  in.tokens[i], " outside the vocabulary of ", config_.vocab_size);
      if (in.logit_rows.empty() && (in.all_logits || i == n - 1)) {
        f.out_rows.push_back(f.ids.size());
      }
      f.ids.push_back(in.tokens[i]);
      f.positions.push_back(L0 + depth[i]);
    }
  }
  // Only now, with every input checked, take the blocks the new positions need.
  for (const auto& in : batch) {
    TORCH_CHECK(in.cache->pool() && in.cache->pool()->shape() == CacheShape(),
                "a KV cache of another model's shape");
    TORCH_CHECK(in.cache->Reserve(in.cache->length() + in.tokens.size()),
                "the KV cache pool has no free blocks for ", in.tokens.size(), " positions");
  }
  return f;
}

at::Tensor LlamaModel::ForwardAten(const std::vector<ForwardInput>& batch,
                                   const std::vector<int>& layers, at::Tensor* hidden,
                                   const at::Tensor& token_ids) const {
  AtenPlan plan = PlanAten(batch);
  plan.upload.Upload(device());
  if (token_ids.defined()) plan.upload.part(plan.tokens).copy_(token_ids);
  at::Tensor logits = at::linear(RunAten(plan, layers, hidden), lm_head_).to(at::kFloat);
  for (size_t b = 0; b < batch.size(); ++b) {
    batch[b].cache->length_ = plan.f.past[b] + plan.f.lengths[b];
  }
  return logits;
}

LlamaModel::AtenPlan LlamaModel::PlanAten(const std::vector<ForwardInput>& batch) const {
  const auto& c = config_;
  const int64_t H = c.num_attention_heads, KVH = c.num_key_value_heads, D = c.head_dim;
  AtenPlan p;
  p.f = Flatten(batch);
  const FlatBatch& f = p.f;
  const int64_t N = p.rows = f.ids.size();
  bool every_row = static_cast<int64_t>(f.out_rows.size()) == N;
  for (int64_t i = 0; every_row && i < N; ++i) every_row = f.out_rows[i] == i;

  // Every index this forward needs, built here and moved to the device in one copy.
  p.tokens = p.upload.Append(f.ids);
  p.positions = p.upload.Append(f.positions);
  if (!every_row) p.out_rows = p.upload.Append(f.out_rows);
  // The inputs by pool (a server's caches share one; private caches bring one each): one
  // attention per pool and layer, its rows then put back in input order.
  std::vector<std::vector<AttentionInput>> groups;
  for (size_t b = 0; b < batch.size(); ++b) {
    KVBlockPool* pool = batch[b].cache->pool();
    const size_t g = std::find(p.pools.begin(), p.pools.end(), pool) - p.pools.begin();
    if (g == p.pools.size()) {
      p.pools.push_back(pool);
      groups.emplace_back();
    }
    groups[g].push_back({&batch[b].cache->blocks(), f.starts[b], f.past[b], f.lengths[b],
                         &batch[b].parents, -1});
  }
  const int64_t nmax = *std::max_element(f.lengths.begin(), f.lengths.end());
  const int64_t pmax = *std::max_element(f.past.begin(), f.past.end());
  for (const auto& group : groups) {
    p.attention.emplace_back(group, N, nmax, pmax, H, KVH, D, &p.upload);
  }
  if (groups.size() > 1) {  // order[r] is token r's row in the groups' outputs
    std::vector<int64_t> order(N);
    int64_t i = 0;
    for (const auto& group : groups) {
      for (const AttentionInput& in : group) {
        for (int64_t j = 0; j < in.tokens; ++j) order[in.row + j] = i++;
      }
    }
    p.order = p.upload.Append(order);
  }
  return p;
}

at::Tensor LlamaModel::RunAten(AtenPlan& p, const std::vector<int>& layers,
                               at::Tensor* hidden) const {
  const auto& c = config_;
  const int64_t H = c.num_attention_heads, KVH = c.num_key_value_heads, D = c.head_dim;
  const int64_t F = c.intermediate_size, N = p.rows;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const IndexUpload& upload = p.upload;
  for (BatchedAttention& a : p.attention) a.Prepare(upload, embed_.options().requires_grad(false));
  auto [cos, sin] = RopeTables(upload.part(p.positions));  // [N, 1, 2, D/2]

  at::Tensor x = embed_.index_select(0, upload.part(p.tokens));  // [N, hidden]
  std::vector<at::Tensor> captured(layers.size());  // [N, hidden] each: the layers' inputs
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    for (size_t i = 0; i < layers.size(); ++i) {
      if (layers[i] == l) captured[i] = x;
    }
    const Layer& L = layers_[l];
    at::Tensor qkv = at::linear(RmsNorm(x, L.attn_norm), L.wqkv, L.bqkv);  // [N, (H + 2 KVH) D]
    at::Tensor qk = qkv.narrow(1, 0, (H + KVH) * D).view({N, H + KVH, D});
    if (c.qk_norm) {  // each head normalized over head_dim, before RoPE
      qk = at::cat({RmsNorm(qk.narrow(1, 0, H), L.q_norm), RmsNorm(qk.narrow(1, H, KVH), L.k_norm)},
                   1);
    }
    // rotate_half(x) * sin == flip(halves of x) * (-sin, sin).
    qk = qk.view({N, H + KVH, 2, D / 2});
    qk = qk * cos + qk.flip(2) * sin;
    at::Tensor q = qk.narrow(1, 0, H).reshape({N, H, D});
    at::Tensor k = qk.narrow(1, H, KVH).reshape({N, KVH, D});
    at::Tensor v = qkv.narrow(1, (H + KVH) * D, KVH * D).view({N, KVH, D});
    at::Tensor attn;  // [N, H * D]
    if (p.attention.size() == 1) {
      attn = p.attention[0].Layer(p.pools[0]->storage(), l, q, k, v, scale);
    } else {
      std::vector<at::Tensor> parts;
      for (size_t g = 0; g < p.attention.size(); ++g) {
        parts.push_back(p.attention[g].Layer(p.pools[g]->storage(), l, q, k, v, scale));
      }
      attn = at::cat(parts, 0).index_select(0, upload.part(p.order));
    }
    x = x + at::linear(attn, L.wo);
    at::Tensor gu = at::linear(RmsNorm(x, L.ffn_norm), L.w_gate_up);  // [N, 2F]
    x = x + at::linear(at::silu(gu.narrow(1, 0, F)) * gu.narrow(1, F, F), L.w_down);
  }
  if (p.out_rows >= 0) x = x.index_select(0, upload.part(p.out_rows));
  if (hidden != nullptr) {
    *hidden = layers.empty() ? at::empty({N, 0}, x.options().dtype(at::kFloat))
                             : at::cat(captured, 1).to(at::kFloat);
  }
  return RmsNorm(x, final_norm_);
}

std::vector<std::pair<std::string, at::Tensor>> LlamaModel::NamedWeights() const {
  const auto& c = config_;
  const int64_t q_rows = c.num_attention_heads * c.head_dim;
  const int64_t kv_rows = c.num_key_value_heads * c.head_dim;
  std::vector<std::pair<std::string, at::Tensor>> w;
  w.emplace_back("model.embed_tokens.weight", embed_);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const Layer& L = layers_[l];
    w.emplace_back(p + "input_layernorm.weight", L.attn_norm);
    w.emplace_back(p + "self_attn.q_proj.weight", L.wqkv.narrow(0, 0, q_rows));
    w.emplace_back(p + "self_attn.k_proj.weight", L.wqkv.narrow(0, q_rows, kv_rows));
    w.emplace_back(p + "self_attn.v_proj.weight", L.wqkv.narrow(0, q_rows + kv_rows, kv_rows));
    if (L.bqkv.defined()) {
      w.emplace_back(p + "self_attn.q_proj.bias", L.bqkv.narrow(0, 0, q_rows));
      w.emplace_back(p + "self_attn.k_proj.bias", L.bqkv.narrow(0, q_rows, kv_rows));
      w.emplace_back(p + "self_attn.v_proj.bias", L.bqkv.narrow(0, q_rows + kv_rows, kv_rows));
    }
    if (L.q_norm.defined()) {
      w.emplace_back(p + "self_attn.q_norm.weight", L.q_norm);
      w.emplace_back(p + "self_attn.k_norm.weight", L.k_norm);
    }
    w.emplace_back(p + "self_attn.o_proj.weight", L.wo);
    w.emplace_back(p + "post_attention_layernorm.weight", L.ffn_norm);
    w.emplace_back(p + "mlp.gate_proj.weight", L.w_gate_up.narrow(0, 0, c.intermediate_size));
    w.emplace_back(p + "mlp.up_proj.weight",
                   L.w_gate_up.narrow(0, c.intermediate_size, c.intermediate_size));
    w.emplace_back(p + "mlp.down_proj.weight", L.w_down);
  }
  w.emplace_back("model.norm.weight", final_norm_);
  if (!lm_head_.is_same(embed_)) w.emplace_back("lm_head.weight", lm_head_);
  return w;
}

std::vector<at::Tensor> LlamaModel::Parameters() {
  if (packed_) {
    packed_ = false;
    for (Layer& L : layers_) {
      L.qkv_packed = {};
      L.o_packed = {};
      L.gate_up_packed = {};
      L.down_packed = {};
    }
    lm_head_packed_ = {};
  }
  std::vector<at::Tensor> p = {embed_};
  for (const Layer& L : layers_) {
    p.insert(p.end(), {L.attn_norm, L.wqkv, L.wo, L.ffn_norm, L.w_gate_up, L.w_down});
    for (const at::Tensor* t : {&L.bqkv, &L.q_norm, &L.k_norm}) {
      if (t->defined()) p.push_back(*t);
    }
  }
  p.push_back(final_norm_);
  if (!lm_head_.is_same(embed_)) p.push_back(lm_head_);
  return p;
}

}  // namespace specloop
