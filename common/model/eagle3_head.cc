#include "common/model/eagle3_head.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <set>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include "common/model/packed_linear.h"
#include "common/model/rope.h"
#include "common/spec/tensor_upload.h"

namespace specloop {

namespace {

// Applies RoPE (rotate_half layout) to x [n, heads, D] at `positions` [n] (long).
at::Tensor Rope(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& inv_freq) {
  const int64_t half = x.size(2) / 2;
  const at::Tensor angle = positions.to(at::kFloat).unsqueeze(1) * inv_freq;  // [n, D/2]
  const at::Tensor c = at::cos(angle).unsqueeze(1), s = at::sin(angle).unsqueeze(1);
  const at::Tensor x1 = x.narrow(2, 0, half), x2 = x.narrow(2, half, half);
  return at::cat({x1 * c - x2 * s, x2 * c + x1 * s}, 2);
}

// Attention of q [n, H, D] over keys / values [T, KVH, D] with an additive mask [n, T] (or
// undefined: every key), grouped-query. Returns [n, H * D].
at::Tensor Attend(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                  const at::Tensor& mask, double scale) {
  const int64_t n = q.size(0), H = q.size(1), D = q.size(2), KVH = keys.size(1), G = H / KVH;
  const at::Tensor qg = q.view({n, KVH, G, D}).permute({1, 2, 0, 3}).reshape({KVH, G * n, D});
  at::Tensor scores = at::bmm(qg, keys.permute({1, 2, 0})).mul(scale);  // [KVH, G * n, T]
  if (mask.defined()) scores = scores + mask.repeat({G, 1});
  const at::Tensor o = at::bmm(at::softmax(scores, -1), values.transpose(0, 1));  // [KVH, G n, D]
  return o.view({KVH, G, n, D}).permute({2, 0, 1, 3}).reshape({n, H * D});
}

}  // namespace

Status Eagle3Head::Load(const std::string& dir, const LlamaModel& target,
                        const LoadOptions& options, std::unique_ptr<Eagle3Head>* out) {
  Eagle3Config config;
  SPECLOOP_RETURN_IF_ERROR(Eagle3Config::FromDir(dir, &config));
  TensorMap tensors;
  SPECLOOP_RETURN_IF_ERROR(ReadModelWeights(dir, &tensors));
  return FromTensors(config, tensors, target, options, out).Annotate(dir);
}

Status Eagle3Head::FromTensors(const Eagle3Config& config_in, const TensorMap& tensors,
                               const LlamaModel& target, const LoadOptions& options,
                               std::unique_ptr<Eagle3Head>* out) {
  Eagle3Config config = config_in;
  const ModelConfig& t = target.config();
  ModelConfig& c = config.layer;
  if (config.target_hidden_size != t.hidden_size) {
    return Status::InvalidArgument("the head reads features of width 3 x " +
                                   std::to_string(config.target_hidden_size) +
                                   ", its target has hidden_size " + std::to_string(t.hidden_size));
  }
  if (c.hidden_size != t.hidden_size) {
    return Status::NotSupported("a head of hidden_size " + std::to_string(c.hidden_size) +
                                " for a target of " + std::to_string(t.hidden_size) +
                                " (it would need an embedding of its own)");
  }
  if (c.vocab_size != t.vocab_size) {
    return Status::InvalidArgument("the head's vocab_size " + std::to_string(c.vocab_size) +
                                   " is not its target's " + std::to_string(t.vocab_size));
  }
  if (config.aux_layers.empty()) config.aux_layers = DefaultAuxLayers(t.num_hidden_layers);
  if (config.aux_layers.size() != 3) {
    return Status::NotSupported("the head reads three layers of its target; a target of " +
                                std::to_string(t.num_hidden_layers) + " layers has too few");
  }
  for (size_t i = 0; i < config.aux_layers.size(); ++i) {
    const int l = config.aux_layers[i];
    if (l < 1 || l >= t.num_hidden_layers || (i > 0 && l <= config.aux_layers[i - 1])) {
      return Status::InvalidArgument(
          "eagle_aux_hidden_state_layer_ids names layer " + std::to_string(l) + " of a target of " +
          std::to_string(t.num_hidden_layers) + " layers (ascending ids in 1 .. L-1)");
    }
  }
  const at::Device device = target.device();
  c.max_model_len = t.max_model_len;  // the head drafts within its target's context
  if (at::Device(options.device).type() != device.type()) {
    return Status::InvalidArgument("the head must load on its target's device (" +
                                   device.str() + "), not " + options.device);
  }
  auto fc_it = tensors.find("fc.weight");
  if (fc_it == tensors.end()) return Status::InvalidArgument("missing tensor fc.weight");
  at::ScalarType dtype;
  SPECLOOP_RETURN_IF_ERROR(
      ParseWeightDtype(options.dtype, fc_it->second.scalar_type(), device.is_cuda(), &dtype));

  const int64_t h = c.hidden_size, H = c.num_attention_heads, KVH = c.num_key_value_heads,
                D = c.head_dim, F = c.intermediate_size, V = c.vocab_size,
                Vd = config.draft_vocab_size;
  Status status;
  std::set<std::string> used;
  auto get = [&](const std::string& name, std::vector<int64_t> shape,
                 bool matrix) -> at::Tensor {
    if (!status.ok()) return {};
    used.insert(name);
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      status = Status::InvalidArgument("missing tensor " + name);
      return {};
    }
    if (it->second.sizes() != at::IntArrayRef(shape)) {
      status = Status::InvalidArgument("tensor " + name + " has shape " +
                                       ShapeString(it->second.sizes()) + ", expected " +
                                       ShapeString(shape));
      return {};
    }
    const at::ScalarType want = matrix || device.is_cuda() ? dtype : at::kFloat;
    return it->second.to(device, want, /*non_blocking=*/false, /*copy=*/true).contiguous();
  };
  std::unique_ptr<Eagle3Head> m(new Eagle3Head());
  m->fc_ = get("fc.weight", {h, 3 * h}, true);
  const std::string p = "midlayer.";
  m->input_norm_ = get(p + "input_layernorm.weight", {h}, false);
  m->hidden_norm_ = get(p + "hidden_norm.weight", {h}, false);
  m->post_norm_ = get(p + "post_attention_layernorm.weight", {h}, false);
  const at::Tensor wq = get(p + "self_attn.q_proj.weight", {H * D, 2 * h}, true);
  const at::Tensor wk = get(p + "self_attn.k_proj.weight", {KVH * D, 2 * h}, true);
  const at::Tensor wv = get(p + "self_attn.v_proj.weight", {KVH * D, 2 * h}, true);
  m->wo_ = get(p + "self_attn.o_proj.weight", {h, H * D}, true);
  const at::Tensor wg = get(p + "mlp.gate_proj.weight", {F, h}, true);
  const at::Tensor wu = get(p + "mlp.up_proj.weight", {F, h}, true);
  m->w_down_ = get(p + "mlp.down_proj.weight", {h, F}, true);
  m->final_norm_ = get("norm.weight", {h}, false);
  m->lm_head_ = get("lm_head.weight", {Vd, h}, true);
  // The vocabulary map: d2t [Vd] (int64 offsets), t2d [V] (bool); absent when Vd == V.
  m->draft_to_target_.resize(Vd);
  std::iota(m->draft_to_target_.begin(), m->draft_to_target_.end(), 0);
  const bool has_map = tensors.count("d2t") || tensors.count("t2d");
  if (status.ok() && (has_map || Vd != V)) {
    used.insert("d2t");
    used.insert("t2d");
    auto d2t = tensors.find("d2t"), t2d = tensors.find("t2d");
    if (d2t == tensors.end() || t2d == tensors.end()) {
      return Status::InvalidArgument(
          "draft_vocab_size " + std::to_string(Vd) + " < vocab_size " + std::to_string(V) +
          " needs both d2t and t2d (the draft vocabulary's map)");
    }
    if (d2t->second.sizes() != at::IntArrayRef({Vd}) ||
        !at::isIntegralType(d2t->second.scalar_type(), false)) {
      return Status::InvalidArgument("tensor d2t must be integer [" + std::to_string(Vd) + "]");
    }
    if (t2d->second.sizes() != at::IntArrayRef({V})) {
      return Status::InvalidArgument("tensor t2d must be [" + std::to_string(V) + "]");
    }
    const at::Tensor offsets = d2t->second.to(at::kLong).contiguous();
    const at::Tensor in_draft = t2d->second.to(at::kBool).contiguous();
    const bool* flags = in_draft.data_ptr<bool>();
    for (int64_t d = 0; d < Vd; ++d) {
      const int64_t id = d + offsets.data_ptr<int64_t>()[d];
      if (id < 0 || id >= V || (d > 0 && id <= m->draft_to_target_[d - 1]) || !flags[id]) {
        return Status::InvalidArgument(
            "d2t maps draft id " + std::to_string(d) + " to target id " + std::to_string(id) +
            ": the draft vocabulary must be ascending target ids, each marked in t2d");
      }
      m->draft_to_target_[d] = static_cast<int>(id);
    }
    if (in_draft.sum().item<int64_t>() != Vd) {
      return Status::InvalidArgument("t2d marks " + std::to_string(in_draft.sum().item<int64_t>()) +
                                     " target ids, d2t maps " + std::to_string(Vd));
    }
  }
  SPECLOOP_RETURN_IF_ERROR(status);
  for (const auto& [name, tensor] : tensors) {
    if (used.count(name)) continue;
    if (name == "embed_tokens.weight") {  // some heads carry the target's embedding: the same?
      const at::Tensor e = target.embedding().to(at::kCPU, tensor.scalar_type());
      if (tensor.sizes() == e.sizes() && at::equal(tensor, e)) continue;
      return Status::NotSupported(
          "tensor embed_tokens.weight differs from the target's embedding (a head with an "
          "embedding of its own is not implemented)");
    }
    return Status::NotSupported(
        "tensor " + name + " is not read by the EAGLE-3 head's forward (LlamaForCausalLMEagle3)");
  }
  m->wqkv_ = at::cat({wq, wk, wv}, 0).contiguous();
  m->w_gate_up_ = at::cat({wg, wu}, 0).contiguous();
  m->embed_ = target.embedding().detach();  // frozen: no gradient reaches the target
  m->target_ = &target;
  m->rope_inv_freq_ = RopeInverseFrequencies(c);
  m->rope_inv_freq_t_ = at::tensor(m->rope_inv_freq_, at::kFloat).to(device);
  m->config_ = std::move(config);
  if (device.is_cpu()) m->Pack();
  *out = std::move(m);
  return Status::OK();
}

void Eagle3Head::Pack() {
  fc_p_ = PackTensor(fc_);
  qkv_p_ = PackTensor(wqkv_);
  o_p_ = PackTensor(wo_);
  gate_up_p_ = PackTensor(w_gate_up_);
  down_p_ = PackTensor(w_down_);
  lm_head_p_ = PackTensor(lm_head_);
  packed_ = true;
}

Status Eagle3Head::InitFromTarget(const LlamaModel& target, const InitOptions& options,
                                  std::unique_ptr<Eagle3Head>* out) {
  const ModelConfig& t = target.config();
  Eagle3Config config;
  config.layer = t;
  config.layer.num_hidden_layers = 1;
  config.layer.tie_word_embeddings = false;
  config.layer.qkv_bias = false;
  config.layer.qk_norm = false;
  config.layer.model_type = "llama";
  config.target_hidden_size = t.hidden_size;
  config.aux_layers =
      options.aux_layers.empty() ? DefaultAuxLayers(t.num_hidden_layers) : options.aux_layers;
  if (config.aux_layers.size() != 3) {
    return Status::NotSupported("an EAGLE-3 head reads three distinct layers (1 .. L-1) of its "
                                "target; a target of " + std::to_string(t.num_hidden_layers) +
                                " layers has too few");
  }
  const int V = t.vocab_size;
  if (options.draft_vocab_size > V) {
    return Status::InvalidArgument("a draft vocabulary of " +
                                   std::to_string(options.draft_vocab_size) +
                                   " ids for a target of " + std::to_string(V));
  }
  config.draft_vocab_size = options.draft_vocab_size > 0 ? options.draft_vocab_size
                                                         : std::min(V, 32000);
  const int Vd = config.draft_vocab_size;
  if (!options.token_counts.empty() && static_cast<int>(options.token_counts.size()) != V) {
    return Status::InvalidArgument("token counts for " +
                                   std::to_string(options.token_counts.size()) +
                                   " ids, the target's vocabulary has " + std::to_string(V));
  }
  // The draft vocabulary: the Vd most frequent ids (lowest first on ties), ascending.
  std::vector<int> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  if (!options.token_counts.empty()) {
    std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) {
      return options.token_counts[a] > options.token_counts[b];
    });
  }
  ids.resize(Vd);
  std::sort(ids.begin(), ids.end());

  // Each tensor starts from the target's last layer where the shapes allow, so that the
  // head begins in the target's own representation: fc passes the highest feature through
  // (g = the input of aux layer 3), the attention reads it with the last layer's q / k / v
  // (hidden half; the embedding half starts at zero), o_proj, the MLP and every norm are the
  // last layer's, norm and lm_head the target's final ones (lm_head cut to the draft
  // vocabulary). At step 0 the head then computes the target's last layer over g: the
  // target's own next-token distribution at t, one position early (greedy alpha ~0.01); the
  // random part is small noise in the embedding half, so that its gradient is not zero by
  // symmetry. What makes it draft is the warm-up that `specloop draft init` runs next
  // (trainer/head_warmup.h, --warmup-tokens, default 16384): the target samples text from BOS
  // at temperature 1 and the head is trained once on each sequence with the trainer's
  // training-time-test loss against the target's full distribution. On target-wide-46m that
  // takes held-out greedy alpha at k = 4 to ~0.29 (mean acceptance length 1.40) in ~50 CPU s.
  TensorMap w;
  for (const auto& [name, tensor] : target.NamedWeights()) {
    w[name] = tensor.to(at::kCPU, at::kFloat).contiguous();
  }
  const int64_t h = t.hidden_size;
  const std::string last = "model.layers." + std::to_string(t.num_hidden_layers - 1) + ".";
  auto gen = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  auto half_and_half = [&](const at::Tensor& m) {  // [rows, h] -> [rows, 2h]
    at::Tensor noise = at::randn({m.size(0), h}, gen, at::kFloat) * (0.02 * m.std().item<double>());
    return at::cat({noise, m}, 1);
  };
  TensorMap head;
  head["fc.weight"] = at::cat({at::zeros({h, 2 * h}), at::eye(h)}, 1);
  head["midlayer.input_layernorm.weight"] = w[last + "input_layernorm.weight"].clone();
  head["midlayer.hidden_norm.weight"] = w[last + "input_layernorm.weight"].clone();
  head["midlayer.post_attention_layernorm.weight"] =
      w[last + "post_attention_layernorm.weight"].clone();
  for (const char* proj : {"q_proj", "k_proj", "v_proj"}) {
    head[std::string("midlayer.self_attn.") + proj + ".weight"] =
        half_and_half(w[last + "self_attn." + proj + ".weight"]);
  }
  head["midlayer.self_attn.o_proj.weight"] = w[last + "self_attn.o_proj.weight"].clone();
  for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
    head[std::string("midlayer.mlp.") + proj + ".weight"] =
        w[last + "mlp." + proj + ".weight"].clone();
  }
  head["norm.weight"] = w["model.norm.weight"].clone();
  const at::Tensor lm =
      t.tie_word_embeddings ? w["model.embed_tokens.weight"] : w["lm_head.weight"];
  const at::Tensor draft_ids =
      at::tensor(std::vector<int64_t>(ids.begin(), ids.end()), at::kLong);
  head["lm_head.weight"] = lm.index_select(0, draft_ids).contiguous();
  head["d2t"] = draft_ids - at::arange(Vd, at::kLong);
  head["t2d"] = at::zeros({V}, at::kBool).index_fill_(0, draft_ids, true);
  // (A Qwen target's q / k / v biases and q / k norms have no place in the head: it starts
  // without them.)
  LoadOptions load;
  load.device = target.device().str();
  load.dtype = "float32";
  return FromTensors(config, head, target, load, out);
}

Status Eagle3Head::Save(const std::string& dir, const std::string& dtype) const {
  at::ScalarType type;
  SPECLOOP_RETURN_IF_ERROR(ParseWeightDtype(dtype, at::kFloat, false, &type));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IOError(dir + ": " + ec.message());
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (auto& [name, t] : NamedWeights()) {
    tensors.emplace_back(name, t.is_floating_point() ? t.to(at::kCPU, type) : t.to(at::kCPU));
  }
  SPECLOOP_RETURN_IF_ERROR(WriteSafetensors(dir + "/model.safetensors", tensors));
  Eagle3Config c = config_;
  c.layer.torch_dtype = dtype;
  const std::string path = dir + "/config.json";
  std::ofstream f(path + ".tmp");
  f << c.ToJson();
  f.close();
  if (!f) return Status::IOError(path + ": cannot write");
  std::filesystem::rename(path + ".tmp", path, ec);
  if (ec) return Status::IOError(path + ": " + ec.message());
  return Status::OK();
}

std::vector<std::pair<std::string, at::Tensor>> Eagle3Head::NamedWeights() const {
  const ModelConfig& c = config_.layer;
  const int64_t q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  const int64_t F = c.intermediate_size;
  const std::string p = "midlayer.";
  std::vector<std::pair<std::string, at::Tensor>> w;
  w.emplace_back("fc.weight", fc_);
  w.emplace_back(p + "hidden_norm.weight", hidden_norm_);
  w.emplace_back(p + "input_layernorm.weight", input_norm_);
  w.emplace_back(p + "self_attn.q_proj.weight", wqkv_.narrow(0, 0, q));
  w.emplace_back(p + "self_attn.k_proj.weight", wqkv_.narrow(0, q, kv));
  w.emplace_back(p + "self_attn.v_proj.weight", wqkv_.narrow(0, q + kv, kv));
  w.emplace_back(p + "self_attn.o_proj.weight", wo_);
  w.emplace_back(p + "post_attention_layernorm.weight", post_norm_);
  w.emplace_back(p + "mlp.gate_proj.weight", w_gate_up_.narrow(0, 0, F));
  w.emplace_back(p + "mlp.up_proj.weight", w_gate_up_.narrow(0, F, F));
  w.emplace_back(p + "mlp.down_proj.weight", w_down_);
  w.emplace_back("norm.weight", final_norm_);
  w.emplace_back("lm_head.weight", lm_head_);
  // The vocabulary map, written for a full draft vocabulary too (zeros, all true), as
  // SpecForge does: every loader finds what it looks for.
  const int64_t V = c.vocab_size, Vd = config_.draft_vocab_size;
  const at::Tensor ids =
      at::tensor(std::vector<int64_t>(draft_to_target_.begin(), draft_to_target_.end()));
  w.emplace_back("d2t", ids - at::arange(Vd, at::kLong));
  w.emplace_back("t2d", at::zeros({V}, at::kBool).index_fill_(0, ids, true));
  for (auto& [name, t] : w) t = t.detach();
  return w;
}

std::vector<at::Tensor> Eagle3Head::Parameters() {
  packed_ = false;
  for (PackedMatrix* m : {&fc_p_, &qkv_p_, &o_p_, &gate_up_p_, &down_p_, &lm_head_p_}) {
    *m = PackedMatrix();
  }
  return {fc_, input_norm_, hidden_norm_, post_norm_, wqkv_, wo_, w_gate_up_, w_down_,
          final_norm_, lm_head_};
}

int64_t Eagle3Head::StreamedWeightBytes() const {
  if (!packed_) return 0;
  return fc_p_.bytes() + qkv_p_.bytes() + o_p_.bytes() + gate_up_p_.bytes() + down_p_.bytes() +
         lm_head_p_.bytes();
}

Eagle3Head::Cache Eagle3Head::NewCache(int64_t initial_capacity) const {
  const ModelConfig& c = config_.layer;
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(fc_.device());
  Cache cache;
  cache.keys = at::empty({initial_capacity, c.num_key_value_heads, c.head_dim}, opts);
  cache.values = at::empty_like(cache.keys);
  return cache;
}

at::Tensor Eagle3Head::Lin(const at::Tensor& x, const at::Tensor& w,
                           const PackedMatrix& packed) const {
  if (!packed_ || c10::GradMode::is_enabled()) return at::linear(x, w.to(x.scalar_type()));
  const at::Tensor in = x.contiguous();
  at::Tensor out = at::empty({in.size(0), packed.rows()}, in.options());
  PackedLinear(in.data_ptr<float>(), in.size(0), packed, out.data_ptr<float>(), false);
  return out;
}

at::Tensor Eagle3Head::RmsNorm(const at::Tensor& x, const at::Tensor& w) const {
  return x * at::rsqrt(x.square().mean(-1, true) + config_.layer.rms_norm_eps) *
         w.to(x.scalar_type());
}

at::Tensor Eagle3Head::Logits(const at::Tensor& hidden) const {
  return Lin(RmsNorm(hidden, final_norm_), lm_head_, lm_head_p_).to(at::kFloat);
}

template <typename AttendFn>
at::Tensor Eagle3Head::Layer(const at::Tensor& x, const at::Tensor& tokens,
                             const at::Tensor& positions, AttendFn attend) const {
  const ModelConfig& c = config_.layer;
  const int64_t n = x.size(0), H = c.num_attention_heads, KVH = c.num_key_value_heads,
                D = c.head_dim, F = c.intermediate_size;
  const at::Tensor e = embed_.index_select(0, tokens).to(x.scalar_type());
  const at::Tensor g = RmsNorm(x, hidden_norm_);
  const at::Tensor a = at::cat({RmsNorm(e, input_norm_), g}, 1);  // [n, 2h]
  const at::Tensor residual = config_.norm_before_residual ? g : x;
  const at::Tensor qkv = Lin(a, wqkv_, qkv_p_);
  const at::Tensor q =
      Rope(qkv.narrow(1, 0, H * D).reshape({n, H, D}), positions, rope_inv_freq_t_);
  const at::Tensor k =
      Rope(qkv.narrow(1, H * D, KVH * D).reshape({n, KVH, D}), positions, rope_inv_freq_t_);
  const at::Tensor v = qkv.narrow(1, (H + KVH) * D, KVH * D).reshape({n, KVH, D});
  const at::Tensor hs = residual + Lin(attend(q, k, v), wo_, o_p_);
  const at::Tensor gu = Lin(RmsNorm(hs, post_norm_), w_gate_up_, gate_up_p_);
  return hs + Lin(at::silu(gu.narrow(1, 0, F)) * gu.narrow(1, F, F), w_down_, down_p_);
}

at::Tensor Eagle3Head::Forward(const std::vector<Input>& batch, at::Tensor* last_hidden,
                               const at::Tensor& token_ids) const {
  TORCH_CHECK(!batch.empty(), "Eagle3Head::Forward of an empty batch");
  const at::Device device = fc_.device();
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  const double scale = 1.0 / std::sqrt(static_cast<double>(config_.layer.head_dim));
  // Every input's rows, fused where they are target features, in one block.
  std::vector<at::Tensor> xs;
  std::vector<int64_t> ids, positions, starts;
  for (const Input& in : batch) {
    const int64_t n = in.tokens.size();
    TORCH_CHECK(in.cache != nullptr && n > 0 && in.hidden.dim() == 2 && in.hidden.size(0) == n,
                "Eagle3Head::Forward: an input needs a cache, tokens and one hidden row each");
    TORCH_CHECK(in.cache->length + n <= config_.layer.max_model_len,
                "the head's cache would exceed the context limit ", config_.layer.max_model_len);
    const int64_t width = in.hidden.size(1);
    TORCH_CHECK(width == feature_width() || width == hidden_size(), "hidden rows of width ",
                width, ": the head reads ", feature_width(), " (features) or ", hidden_size());
    xs.push_back(width == feature_width() ? Lin(in.hidden.to(at::kFloat), fc_, fc_p_)
                                          : in.hidden.to(at::kFloat));
    starts.push_back(ids.size());
    for (int64_t i = 0; i < n; ++i) {
      TORCH_CHECK(in.tokens[i] >= 0 && in.tokens[i] < config_.layer.vocab_size, "token id ",
                  in.tokens[i], " outside the vocabulary");
      ids.push_back(in.tokens[i]);
      positions.push_back(in.cache->length + i);
    }
  }
  const int64_t N = ids.size();
  const at::Tensor x = xs.size() == 1 ? xs[0] : at::cat(xs, 0);
  if (token_ids.defined()) {
    TORCH_CHECK(token_ids.dim() == 1 && token_ids.scalar_type() == at::kLong &&
                    token_ids.numel() == N && token_ids.device() == device,
                "token_ids must be ", N, " int64 ids on ", device.str(), ", not ",
                token_ids.toString(), " ", token_ids.sizes());
  }
  const at::Tensor tok =
      token_ids.defined() ? token_ids : spec::ToDeviceAsync(at::tensor(ids, long_opts), device);
  if (token_ids.defined() && device.is_cpu()) {
    TORCH_CHECK(tok.min().item<int64_t>() >= 0 &&
                    tok.max().item<int64_t>() < config_.layer.vocab_size,
                "a token id outside the vocabulary");
  }
  const at::Tensor pos = spec::ToDeviceAsync(at::tensor(positions, long_opts), device);
  auto attend = [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    std::vector<at::Tensor> outs;
    for (size_t b = 0; b < batch.size(); ++b) {
      Cache& cache = *batch[b].cache;
      const int64_t off = starts[b], n = batch[b].tokens.size(), L0 = cache.length, T = L0 + n;
      if (T > cache.keys.size(0)) {  // grow by doubling
        const int64_t cap = std::max<int64_t>(T, 2 * cache.keys.size(0));
        at::Tensor keys = at::empty({cap, k.size(1), k.size(2)}, cache.keys.options());
        at::Tensor values = at::empty_like(keys);
        keys.narrow(0, 0, L0).copy_(cache.keys.narrow(0, 0, L0));
        values.narrow(0, 0, L0).copy_(cache.values.narrow(0, 0, L0));
        cache.keys = keys;
        cache.values = values;
      }
      cache.keys.narrow(0, L0, n).copy_(k.narrow(0, off, n));
      cache.values.narrow(0, L0, n).copy_(v.narrow(0, off, n));
      at::Tensor mask;
      if (n > 1) {
        mask = at::full({n, T}, -std::numeric_limits<float>::infinity(), q.options())
                   .triu(L0 + 1);
      }
      outs.push_back(Attend(q.narrow(0, off, n), cache.keys.narrow(0, 0, T),
                            cache.values.narrow(0, 0, T), mask, scale));
    }
    return outs.size() == 1 ? outs[0] : at::cat(outs, 0);
  };
  const at::Tensor out = Layer(x, tok, pos, attend);
  for (const Input& in : batch) in.cache->length += static_cast<int64_t>(in.tokens.size());
  std::vector<int64_t> last;
  for (size_t b = 0; b < batch.size(); ++b) {
    last.push_back(starts[b] + static_cast<int64_t>(batch[b].tokens.size()) - 1);
  }
  const at::Tensor rows = static_cast<int64_t>(last.size()) == N
                              ? out
                              : out.index_select(
                                    0, spec::ToDeviceAsync(at::tensor(last, long_opts), device));
  if (last_hidden != nullptr) *last_hidden = rows;
  return Logits(rows);
}

std::vector<at::Tensor> Eagle3Head::ForwardUnrolled(const at::Tensor& features,
                                                    const std::vector<int64_t>& tokens,
                                                    int steps) const {
  const int64_t T = features.size(0);
  TORCH_CHECK(steps >= 1 && static_cast<int64_t>(tokens.size()) == T + steps,
              "ForwardUnrolled: ", tokens.size(), " tokens for ", T, " positions and ", steps,
              " steps (want positions + steps)");
  TORCH_CHECK(features.size(1) == feature_width(), "features of width ", features.size(1),
              ", the head reads ", feature_width());
  const at::Device device = fc_.device();
  const double scale = 1.0 / std::sqrt(static_cast<double>(config_.layer.head_dim));
  const at::Tensor all = at::tensor(tokens, at::kLong).to(device);
  const at::Tensor base = at::arange(T, at::TensorOptions().dtype(at::kLong).device(device));
  const at::Tensor causal =
      at::full({T, T}, -std::numeric_limits<float>::infinity(),
               at::TensorOptions().dtype(at::kFloat).device(device))
          .triu(1);
  at::Tensor keys0, values0;          // step 0's, at positions 0..T-1
  std::vector<at::Tensor> own_k, own_v;  // steps 1..j's, row t at position t + j
  std::vector<at::Tensor> logits;
  at::Tensor x = Lin(features.to(device, at::kFloat), fc_, fc_p_);
  for (int j = 0; j < steps; ++j) {
    auto attend = [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
      if (j == 0) {
        keys0 = k;
        values0 = v;
        return Attend(q, k, v, causal, scale);
      }
      own_k.push_back(k);
      own_v.push_back(v);
      // Row t sees step 0's keys at positions <= t, then its own chain's (one per step).
      const int64_t H = q.size(1), D = q.size(2), KVH = k.size(1), G = H / KVH;
      const at::Tensor qg = q.view({T, KVH, G, D});
      at::Tensor prefix = at::einsum("tkgd,skd->tkgs", {qg, keys0}).mul(scale) +
                          causal.view({T, 1, 1, T});
      std::vector<at::Tensor> diag;
      for (const at::Tensor& ki : own_k) {
        diag.push_back(at::einsum("tkgd,tkd->tkg", {qg, ki}).mul(scale).unsqueeze(-1));
      }
      const at::Tensor p = at::softmax(at::cat({prefix, at::cat(diag, -1)}, -1), -1);
      at::Tensor o = at::einsum("tkgs,skd->tkgd", {p.narrow(-1, 0, T), values0});
      for (size_t i = 0; i < own_v.size(); ++i) {
        o = o + p.select(-1, T + i).unsqueeze(-1) * own_v[i].unsqueeze(2);
      }
      return o.reshape({T, H * D});
    };
    x = Layer(x, all.narrow(0, j + 1, T), base + j, attend);
    logits.push_back(Logits(x));
  }
  return logits;
}

}  // namespace specloop
