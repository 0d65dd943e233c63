// ModelConfig: the architecture of a Llama-family model, read from a Hugging Face
// `config.json` (plus `tokenizer_config.json` for BOS/EOS handling). Pure; no LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/base/status.h"

namespace specloop {

struct ModelConfig {
  std::string model_type = "llama";
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
  bool tie_word_embeddings = false;
  int bos_token_id = 1;
  std::vector<int> eos_token_ids = {2};  // config.json may give one id or a list
  bool add_bos_token = true;  // tokenizer_config.json's, else tokenizer.json's post-processor
  std::string torch_dtype = "float32";

  // Parses config.json text. Rejects what this engine does not implement (rope_scaling,
  // attention or MLP biases, non-SiLU activations) with NotSupported, and inconsistent sizes
  // with InvalidArgument.
  static Status FromJson(const std::string& json_text, ModelConfig* out);
  // Reads DIR/config.json and, when present, DIR/tokenizer_config.json and tokenizer.json.
  static Status FromDir(const std::string& dir, ModelConfig* out);
  // The config.json a Hugging Face loader would accept for this config.
  std::string ToJson() const;

  bool IsEos(int token) const;
  // Number of query heads sharing one key/value head.
  int group_size() const { return num_attention_heads / num_key_value_heads; }
};

// OK when a draft can propose for the target: the same vocabulary size and special ids
// (speculative decoding compares their distributions token by token). InvalidArgument names
// the mismatch.
Status CheckDraftCompatible(const ModelConfig& target, const ModelConfig& draft);

// Reads a whole file into `out`.
Status ReadFileToString(const std::string& path, std::string* out);

}  // namespace specloop
