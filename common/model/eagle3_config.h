// Eagle3Config: the config.json of an EAGLE-3 draft head (architecture
// LlamaForCausalLMEagle3, as vLLM and SGLang read it). Pure; no LibTorch.
//
// Keys: the decoder layer's shape as a Llama config's (hidden_size, intermediate_size,
// num_attention_heads, num_key_value_heads, head_dim, rms_norm_eps, rope_theta, rope_scaling,
// max_position_embeddings, vocab_size = the target's) with num_hidden_layers 1; and
//   draft_vocab_size                   the head's output vocabulary (default: vocab_size; when
//                                      absent SGLang takes the lm_head from the target)
//   target_hidden_size                 the target's width (default: hidden_size)
//   eagle_aux_hidden_state_layer_ids   top level, vLLM's form: the target layers whose INPUTS
//                                      are the features (id k = Hugging Face hidden_states[k])
//   eagle_config: {eagle_aux_hidden_state_layer_ids, use_aux_hidden_state}
//                                      SGLang's (and SpecForge's) form: the layers whose OUTPUTS
//                                      are the features, so id k there is id k + 1 in vLLM's form.
//                                      Either or both are read (both must then name the same
//                                      layers); use_aux_hidden_state must be true
//   norm_before_residual               the residual is hidden_norm(g) instead of g (vLLM reads
//                                      it; SGLang does not, and always uses g)
// Also accepted, as published heads carry them: sliding_window null, use_sliding_window false,
// max_window_layers (no layer slides). Any other key must be one ModelConfig knows not to change
// a Llama forward; anything else is NotSupported.
#pragma once

#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/tokenizer/model_config.h"

namespace specloop {

struct Eagle3Config {
  // The decoder layer: its shape, norms' eps and RoPE (num_hidden_layers 1; vocab_size is the
  // target's; tie_word_embeddings false).
  ModelConfig layer;
  int draft_vocab_size = 0;
  int target_hidden_size = 0;
  // The target layers (0-based) whose inputs (the residual stream entering them) are the
  // features, ascending, each >= 1; empty when the file names none (the loader then takes
  // DefaultAuxLayers of its target). Both servers concatenate the features in layer order.
  std::vector<int> aux_layers;
  bool norm_before_residual = false;

  // Parses config.json text. NotSupported names what a head of this layout cannot be (another
  // architecture or model_type, more than one layer, tied embeddings, a head narrower or wider
  // than its target, aux ids not 3, use_aux_hidden_state false, a sliding window, any unknown
  // key); InvalidArgument names what is malformed (types, sizes, draft_vocab_size outside
  // 1..vocab_size, aux ids duplicate, negative, 0, out of order, or disagreeing between the
  // two forms). Whether the aux layers fit the target is checked when the head loads.
  static Status FromJson(const std::string& json_text, Eagle3Config* out);
  // Reads DIR/config.json; errors are prefixed with its path.
  static Status FromDir(const std::string& dir, Eagle3Config* out);
  // The config.json vLLM and SGLang load: architectures ["LlamaForCausalLMEagle3"], the
  // layer's Llama keys (ModelConfig::ToJson), draft_vocab_size, target_hidden_size,
  // norm_before_residual, and the aux ids in both forms (vLLM's top level, SGLang's in
  // eagle_config, with use_aux_hidden_state true), so both servers read the same layers.
  // FromJson(ToJson()) gives this config back. REQUIRES: a config FromJson accepts
  // (layer.model_type "llama", one layer, aux ids as above or empty).
  std::string ToJson() const;
};

// Whether DIR/config.json names the architecture LlamaForCausalLMEagle3 (or vLLM's spelling
// Eagle3LlamaForCausalLM): a feature draft rather than a model (`--draft DIR` takes either).
// False when unreadable. Only the architecture is looked at: FromDir gives the full verdict.
bool IsEagle3Dir(const std::string& dir);

// The features a head reads by default for a target of `num_layers` layers: vLLM's and SGLang's
// default (2, L / 2, L - 3) when those increase (L >= 7; (2, 16, 29) for 32 layers, the layers
// EAGLE's own code reads), else (1, L / 2, L - 1) (L 4 to 6); empty below 4 layers, which have
// no three distinct layers 1..L-1. Note: for L < 7 the servers' default is not this, so a head
// for such a target must name its layers (ToJson does whenever aux_layers is set).
std::vector<int> DefaultAuxLayers(int num_layers);

}  // namespace specloop
