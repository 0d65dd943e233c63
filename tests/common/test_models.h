// Tiny random Llama models and fixture paths for tests.
#pragma once

#include <cmath>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>

#include <ATen/ATen.h>

#include "common/model/llama_model.h"
#include "common/tokenizer/model_config.h"
#include "tests/testing/temp_dir.h"

namespace specloop::testing {

// A small grouped-query config: 4 query heads over 2 key/value heads.
inline ModelConfig TinyConfig(bool tied = false) {
  ModelConfig c;
  c.vocab_size = 97;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 128;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = tied;
  return c;
}

// TinyConfig with 4 layers: enough for an EAGLE-3 head, which reads layers 1, 2, 3.
inline ModelConfig TinyFourLayerConfig() {
  ModelConfig c = TinyConfig();
  c.num_hidden_layers = 4;
  return c;
}

// TinyConfig as a Qwen3 model (q/k norms; 4 heads of 12 over hidden 32), or a Qwen2 one
// (q/k/v biases).
inline ModelConfig TinyQwen3Config() {
  ModelConfig c = TinyConfig();
  c.model_type = "qwen3";
  c.qk_norm = true;
  c.head_dim = 12;
  return c;
}
inline ModelConfig TinyQwen2Config() {
  ModelConfig c = TinyConfig();
  c.model_type = "qwen2";
  c.qkv_bias = true;
  return c;
}

// Hugging Face-named random weights for `c` (normal, std 0.1; norms around 1), with the
// family's biases and q/k norms.
inline TensorMap RandomLlamaWeights(const ModelConfig& c, uint64_t seed) {
  at::manual_seed(seed);
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim;
  const int64_t kv = c.num_key_value_heads * c.head_dim, f = c.intermediate_size;
  auto rnd = [](std::vector<int64_t> shape) { return at::randn(shape) * 0.1; };
  auto norm = [](int64_t n) { return 1.0 + at::randn({n}) * 0.1; };
  TensorMap w;
  w["model.embed_tokens.weight"] = at::randn({c.vocab_size, h});
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    w[p + "input_layernorm.weight"] = norm(h);
    w[p + "self_attn.q_proj.weight"] = rnd({q, h});
    w[p + "self_attn.k_proj.weight"] = rnd({kv, h});
    w[p + "self_attn.v_proj.weight"] = rnd({kv, h});
    if (c.qkv_bias) {  // qwen2
      w[p + "self_attn.q_proj.bias"] = rnd({q});
      w[p + "self_attn.k_proj.bias"] = rnd({kv});
      w[p + "self_attn.v_proj.bias"] = rnd({kv});
    }
    if (c.qk_norm) {  // qwen3
      w[p + "self_attn.q_norm.weight"] = norm(c.head_dim);
      w[p + "self_attn.k_norm.weight"] = norm(c.head_dim);
    }
    w[p + "self_attn.o_proj.weight"] = rnd({h, q});
    w[p + "post_attention_layernorm.weight"] = norm(h);
    w[p + "mlp.gate_proj.weight"] = rnd({f, h});
    w[p + "mlp.up_proj.weight"] = rnd({f, h});
    w[p + "mlp.down_proj.weight"] = rnd({h, f});
  }
  w["model.norm.weight"] = norm(h);
  if (!c.tie_word_embeddings) w["lm_head.weight"] = rnd({c.vocab_size, h});
  return w;
}

inline std::unique_ptr<LlamaModel> RandomModel(const ModelConfig& c, uint64_t seed) {
  std::unique_ptr<LlamaModel> m;
  Status s = LlamaModel::FromTensors(c, RandomLlamaWeights(c, seed), LoadOptions(), &m);
  if (!s.ok()) throw std::runtime_error(s.ToString());
  return m;
}

// Whether tests can run the ATen forward on a GPU: LibTorch built with CUDA and a device present.
// Tests of the CUDA path skip without one (CI has none; run them on a GPU machine).
// A one-layer Llama whose logits after token t are table[t] (table: [V, V]), whatever came
// before: one-hot embeddings (hidden size V), zero attention and MLP weights (the residual
// passes through), a final RMSNorm that scales a one-hot vector to sqrt(V) and an lm_head that
// undoes it. Its rows are known exactly, which law and parity tests need.
inline std::unique_ptr<LlamaModel> BigramModel(const at::Tensor& table) {
  const int64_t V = table.size(0), H = V, ff = 8;
  ModelConfig c;
  c.vocab_size = static_cast<int>(V);
  c.hidden_size = static_cast<int>(H);
  c.intermediate_size = static_cast<int>(ff);
  c.num_hidden_layers = 1;
  c.num_attention_heads = c.num_key_value_heads = 2;
  c.head_dim = static_cast<int>(H / 2);
  c.max_position_embeddings = 512;
  c.rms_norm_eps = 1e-12;
  c.bos_token_id = 0;
  c.eos_token_ids = {};  // never stops early
  const auto f = at::TensorOptions().dtype(at::kFloat);
  TensorMap w;
  w["model.embed_tokens.weight"] = at::eye(V, f);
  const std::string p = "model.layers.0.";
  w[p + "input_layernorm.weight"] = at::ones({H}, f);
  for (const char* m : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
    w[p + "self_attn." + m + ".weight"] = at::zeros({H, H}, f);
  }
  w[p + "post_attention_layernorm.weight"] = at::ones({H}, f);
  w[p + "mlp.gate_proj.weight"] = at::zeros({ff, H}, f);
  w[p + "mlp.up_proj.weight"] = at::zeros({ff, H}, f);
  w[p + "mlp.down_proj.weight"] = at::zeros({H, ff}, f);
  w["model.norm.weight"] = at::ones({H}, f);
  w["lm_head.weight"] = (table.t() / std::sqrt(static_cast<double>(H))).to(at::kFloat).contiguous();
  std::unique_ptr<LlamaModel> m;
  const Status s = LlamaModel::FromTensors(c, w, LoadOptions(), &m);
  if (!s.ok()) throw std::runtime_error("BigramModel: " + s.ToString());
  return m;
}

inline bool CudaAvailable() { return at::hasCUDA() && at::getNumGPUs() > 0; }

}  // namespace specloop::testing
