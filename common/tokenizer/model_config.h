// ModelConfig: the architecture of a decoder-only model of the Llama, Qwen2, Qwen3 or Mistral
// family, read from a Hugging Face `config.json` (plus `tokenizer_config.json` for BOS/EOS
// handling). Pure; no LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/base/status.h"

namespace specloop {

// RoPE frequency scaling (config.json's `rope_scaling`, or `rope_parameters` in newer files).
struct RopeScaling {
  // "" (none, also for "default"), "linear" (every frequency divided by factor) or "llama3"
  // (Llama 3.1's: long wavelengths divided by factor, short ones kept, a smooth blend between).
  std::string type;
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3 only
  int original_max_position_embeddings = 8192;            // llama3 only
};

// The families this engine implements, each as Hugging Face's modeling code defines it:
//   llama    LlamaForCausalLM (Llama 2 / 3 / 3.1 / 3.2 / 3.3, TinyLlama, SmolLM): rope_scaling
//            llama3 or linear; no attention or MLP biases.
//   qwen2    Qwen2ForCausalLM (Qwen2, Qwen2.5): biases on q_proj, k_proj and v_proj, implied by
//            the architecture (its config has no attention_bias key).
//   qwen3    Qwen3ForCausalLM: RMSNorm of each query and key head over head_dim (q_norm,
//            k_norm) before RoPE; head_dim given, heads * head_dim may differ from hidden_size.
//   mistral  MistralForCausalLM (Mistral 7B v0.1-v0.3, Mistral-Nemo): Llama's forward, with
//            sliding-window attention when sliding_window is set.
// Sliding-window attention is not implemented: a model whose layers slide gets a context
// limit (max_model_len) of at most its window, within which sliding and full attention agree.
struct ModelConfig {
  std::string model_type = "llama";  // the family (above)
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;  // Default: num_attention_heads (no grouping).
  int head_dim = 0;             // Default: hidden_size / num_attention_heads.
  int max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool qkv_bias = false;        // qwen2: q_proj, k_proj, v_proj have biases
  bool qk_norm = false;         // qwen3: q_norm, k_norm over head_dim before RoPE
  int sliding_window = 0;       // > 0: some layer attends to at most this many positions
  bool tie_word_embeddings = false;
  int bos_token_id = 1;
  std::vector<int> eos_token_ids = {2};  // config.json may give one id or a list
  bool add_bos_token = true;  // tokenizer_config.json's, else tokenizer.json's post-processor
  std::string torch_dtype = "float32";
  // The context limit the engine serves, in positions: PositionLimit() when parsed; a loaded
  // model's is LoadOptions::max_model_len's (vLLM's --max-model-len) or PositionLimit().
  int max_model_len = 0;

  // Parses config.json text. The family comes from `architectures` and `model_type` (which
  // must agree); every key must be one the family's loader understands, so a config that
  // asks for what the forward does not implement (an unknown architecture or rope_scaling
  // type, attention or MLP biases where the family has none, quantization, any key not
  // known to leave the forward unchanged) is refused with NotSupported naming it; inconsistent
  // sizes are InvalidArgument.
  static Status FromJson(const std::string& json_text, ModelConfig* out);
  // Reads DIR/config.json and, when present, DIR/tokenizer_config.json and tokenizer.json.
  static Status FromDir(const std::string& dir, ModelConfig* out);
  // The config.json a Hugging Face loader would accept for this config (the family's
  // architecture and keys).
  std::string ToJson() const;

  // The most positions the forward computes exactly: max_position_embeddings, or the sliding
  // window where that is smaller.
  int PositionLimit() const;
  bool IsEos(int token) const;
  // Number of query heads sharing one key/value head.
  int group_size() const { return num_attention_heads / num_key_value_heads; }
};

// OK when a draft can propose for the target: the same vocabulary size and special ids
// (speculative decoding compares their distributions token by token), whatever the two
// families. InvalidArgument names the mismatch.
Status CheckDraftCompatible(const ModelConfig& target, const ModelConfig& draft);

// Reads a whole file into `out`.
Status ReadFileToString(const std::string& path, std::string* out);

}  // namespace specloop
