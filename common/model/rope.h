// Rotary position embedding's frequencies, as Hugging Face's modeling code computes them for
// each rope_scaling type this engine implements (ModelConfig::rope_scaling). Pure C++.
#pragma once

#include <vector>

#include "common/tokenizer/model_config.h"

namespace specloop {

// The head_dim / 2 inverse frequencies: theta^(-2j / head_dim) in float32 arithmetic (as
// transformers computes them in float32), then scaled: divided by the factor ("linear"), or by
// Llama 3.1's rule ("llama3": wavelengths above original_max_position_embeddings /
// low_freq_factor divided by factor, those below original / high_freq_factor kept, a linear
// blend of the two between), computed in double and rounded to float once.
std::vector<float> RopeInverseFrequencies(const ModelConfig& config);

// The rotation of position `pos`: cos_out[j] = cos(pos * inv_freq[j]) and sin_out[j] likewise,
// the angle rounded to float first (the RoPE tables of Hugging Face and llama2.c).
void RopeAngles(const std::vector<float>& inv_freq, long pos, float* cos_out, float* sin_out);

}  // namespace specloop
