// An EAGLE-3 head's config.json (common/model/eagle3_config.h). A config that parses must be a
// head the loader can build: one layer the ModelConfig checks accept, untied, as wide as its
// target, 1 <= draft_vocab_size <= vocab_size, aux ids none or 3 ascending from 1; and its
// ToJson() must name a head (IsEagle3 architecture) and parse back to the same config.
#include "common/model/eagle3_config.h"
#include "tests/fuzz/fuzz_util.h"

using namespace specloop;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Eagle3Config c;
  if (!Eagle3Config::FromJson(std::string(reinterpret_cast<const char*>(data), size), &c).ok()) {
    return 0;
  }
  const ModelConfig& l = c.layer;
  FUZZ_CHECK(l.model_type == "llama" && l.num_hidden_layers == 1 && !l.tie_word_embeddings);
  FUZZ_CHECK(l.hidden_size > 0 && l.intermediate_size > 0 && l.head_dim > 0 &&
             l.head_dim % 2 == 0 && l.num_attention_heads % l.num_key_value_heads == 0);
  FUZZ_CHECK(c.target_hidden_size == l.hidden_size);
  FUZZ_CHECK(c.draft_vocab_size >= 1 && c.draft_vocab_size <= l.vocab_size);
  FUZZ_CHECK(c.aux_layers.empty() || c.aux_layers.size() == 3);
  for (size_t i = 0; i < c.aux_layers.size(); ++i) {
    FUZZ_CHECK(c.aux_layers[i] >= 1 && (i == 0 || c.aux_layers[i] > c.aux_layers[i - 1]));
  }
  Eagle3Config back;
  FUZZ_CHECK(Eagle3Config::FromJson(c.ToJson(), &back).ok());
  FUZZ_CHECK(back.aux_layers == c.aux_layers && back.draft_vocab_size == c.draft_vocab_size &&
             back.target_hidden_size == c.target_hidden_size &&
             back.norm_before_residual == c.norm_before_residual);
  FUZZ_CHECK(back.layer.vocab_size == l.vocab_size && back.layer.hidden_size == l.hidden_size &&
             back.layer.head_dim == l.head_dim && back.layer.rope_theta == l.rope_theta &&
             back.layer.rope_scaling.type == l.rope_scaling.type &&
             back.layer.max_model_len == l.max_model_len &&
             back.layer.eos_token_ids == l.eos_token_ids);
  return 0;
}
