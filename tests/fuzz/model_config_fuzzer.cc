// config.json (common/tokenizer/model_config.h): the architecture a user's model directory
// declares. A config that parses must be one the engine can build: positive sizes, whole heads and
// groups, an even head_dim, a context limit within max_position_embeddings; and its ToJson() must
// parse back to the same sizes, family, biases, q/k norms, rope scaling and context limit.
#include "common/tokenizer/model_config.h"
#include "tests/fuzz/fuzz_util.h"

using namespace specloop;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ModelConfig c;
  if (!ModelConfig::FromJson(std::string(reinterpret_cast<const char*>(data), size), &c).ok()) {
    return 0;
  }
  FUZZ_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0);
  FUZZ_CHECK(c.num_hidden_layers > 0 && c.max_position_embeddings > 0);
  FUZZ_CHECK(c.num_attention_heads > 0 && c.num_key_value_heads > 0);
  FUZZ_CHECK(c.num_attention_heads % c.num_key_value_heads == 0 && c.group_size() >= 1);
  FUZZ_CHECK(c.head_dim > 0 && c.head_dim % 2 == 0);
  ModelConfig back;
  FUZZ_CHECK(ModelConfig::FromJson(c.ToJson(), &back).ok());
  FUZZ_CHECK(back.vocab_size == c.vocab_size && back.hidden_size == c.hidden_size &&
             back.head_dim == c.head_dim && back.eos_token_ids == c.eos_token_ids);
  FUZZ_CHECK(back.model_type == c.model_type && back.qkv_bias == c.qkv_bias &&
             back.qk_norm == c.qk_norm && back.rope_scaling.type == c.rope_scaling.type &&
             back.rope_theta == c.rope_theta && back.max_model_len == c.max_model_len);
  FUZZ_CHECK(c.max_model_len > 0 && c.max_model_len <= c.max_position_embeddings);
  return 0;
}
