#include "common/model/llama2c_convert.h"

#include <sys/stat.h>

#include <fstream>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "common/model/safetensors.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "common/tokenizer/model_config.h"

namespace specloop {

namespace {

// Meta's RoPE pairs (2i, 2i+1) within each head become Hugging Face's (i, i + head_dim/2):
// the permute() of transformers' convert_llama_weights_to_hf.py.
at::Tensor PermuteRope(const at::Tensor& w, int64_t heads) {
  const int64_t rows = w.size(0), cols = w.size(1);
  return w.view({heads, rows / heads / 2, 2, cols}).transpose(1, 2).reshape({rows, cols});
}

Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  return f ? Status::OK() : Status::IOError("cannot write " + path);
}

}  // namespace

Status ConvertLlama2c(const std::string& checkpoint, const std::string& tokenizer,
                      const std::string& out_dir) {
  std::string bytes;
  SPECLOOP_RETURN_IF_ERROR(ReadFileToString(checkpoint, &bytes));
  if (bytes.size() < 28) return Status::Corruption(checkpoint + ": shorter than its header");
  int32_t h[7];
  std::memcpy(h, bytes.data(), sizeof(h));
  const int64_t dim = h[0], hidden = h[1], layers = h[2], heads = h[3], kv_heads = h[4];
  const bool shared_classifier = h[5] > 0;
  const int64_t vocab = std::abs(h[5]), seq_len = h[6];
  if (dim <= 0 || hidden <= 0 || layers <= 0 || heads <= 0 || kv_heads <= 0 || vocab <= 0 ||
      seq_len <= 0 || dim % heads != 0 || heads % kv_heads != 0) {
    return Status::Corruption(checkpoint + ": implausible llama2.c header");
  }
  const int64_t head_dim = dim / heads, kv_dim = kv_heads * head_dim;

  // Weight blocks in file order; freq_cis tables are skipped (recomputed from rope_theta).
  const int64_t L = layers;
  std::vector<std::pair<std::string, std::vector<int64_t>>> blocks = {
      {"embed", {vocab, dim}},       {"rms_att", {L, dim}},        {"wq", {L, dim, dim}},
      {"wk", {L, kv_dim, dim}},      {"wv", {L, kv_dim, dim}},     {"wo", {L, dim, dim}},
      {"rms_ffn", {L, dim}},         {"w1", {L, hidden, dim}},     {"w2", {L, dim, hidden}},
      {"w3", {L, hidden, dim}},      {"rms_final", {dim}},         {"freq_cis", {seq_len, head_dim}},
  };
  if (!shared_classifier) blocks.push_back({"wcls", {vocab, dim}});
  at::Tensor all = at::from_blob(bytes.data() + 28, {int64_t(bytes.size() - 28) / 4}, at::kFloat);
  std::map<std::string, at::Tensor> w;
  int64_t offset = 0;
  for (const auto& [name, shape] : blocks) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    if (offset + n > all.numel()) {
      return Status::Corruption(checkpoint + ": truncated in block " + name);
    }
    w[name] = all.narrow(0, offset, n).view(shape).clone();
    offset += n;
  }
  if (offset != all.numel()) {
    return Status::Corruption(checkpoint + ": " + std::to_string((all.numel() - offset) * 4) +
                              " bytes left over after the weights");
  }

  int pieces = 0;
  SPECLOOP_RETURN_IF_ERROR(CountLlama2cPieces(tokenizer, &pieces));
  if (pieces != vocab) {
    return Status::InvalidArgument(tokenizer + " has " + std::to_string(pieces) +
                                   " pieces, the checkpoint's vocabulary " + std::to_string(vocab));
  }

  std::vector<std::pair<std::string, at::Tensor>> out;
  out.emplace_back("model.embed_tokens.weight", w["embed"]);
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    out.emplace_back(p + "input_layernorm.weight", w["rms_att"][l]);
    out.emplace_back(p + "self_attn.q_proj.weight", PermuteRope(w["wq"][l], heads));
    out.emplace_back(p + "self_attn.k_proj.weight", PermuteRope(w["wk"][l], kv_heads));
    out.emplace_back(p + "self_attn.v_proj.weight", w["wv"][l]);
    out.emplace_back(p + "self_attn.o_proj.weight", w["wo"][l]);
    out.emplace_back(p + "post_attention_layernorm.weight", w["rms_ffn"][l]);
    out.emplace_back(p + "mlp.gate_proj.weight", w["w1"][l]);
    out.emplace_back(p + "mlp.down_proj.weight", w["w2"][l]);
    out.emplace_back(p + "mlp.up_proj.weight", w["w3"][l]);
  }
  out.emplace_back("model.norm.weight", w["rms_final"]);
  if (!shared_classifier) out.emplace_back("lm_head.weight", w["wcls"]);

  ModelConfig c;
  c.vocab_size = vocab;
  c.hidden_size = dim;
  c.intermediate_size = hidden;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = head_dim;
  c.max_position_embeddings = seq_len;
  c.rms_norm_eps = 1e-5;  // llama2.c's run.c
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = shared_classifier;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};

  if (mkdir(out_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return Status::IOError("cannot create " + out_dir);
  }
  SPECLOOP_RETURN_IF_ERROR(WriteSafetensors(out_dir + "/model.safetensors", out,
                                            {{"format", "pt"}, {"source", "llama2.c"}}));
  SPECLOOP_RETURN_IF_ERROR(WriteText(out_dir + "/config.json", c.ToJson()));
  SPECLOOP_RETURN_IF_ERROR(WriteText(
      out_dir + "/tokenizer_config.json",
      nlohmann::json{{"add_bos_token", true}, {"add_eos_token", false}}.dump(2) + "\n"));
  std::string tok;
  SPECLOOP_RETURN_IF_ERROR(ReadFileToString(tokenizer, &tok));
  return WriteText(out_dir + "/tokenizer.bin", tok);
}

}  // namespace specloop
