#include "common/model/rope.h"

#include <cmath>

namespace specloop {

std::vector<float> RopeInverseFrequencies(const ModelConfig& c) {
  const int half = c.head_dim / 2;
  std::vector<float> inv(half);
  for (int j = 0; j < half; ++j) {
    inv[j] = 1.0f / std::pow(static_cast<float>(c.rope_theta),
                             static_cast<float>(2 * j) / static_cast<float>(c.head_dim));
  }
  const RopeScaling& r = c.rope_scaling;
  if (r.type == "linear") {
    for (float& f : inv) f = static_cast<float>(f / r.factor);
  } else if (r.type == "llama3") {
    const double old_len = r.original_max_position_embeddings;
    const double low_wavelen = old_len / r.low_freq_factor;
    const double high_wavelen = old_len / r.high_freq_factor;
    for (float& f : inv) {
      const double wavelen = 2 * M_PI / f;
      if (wavelen > low_wavelen) {
        f = static_cast<float>(f / r.factor);
      } else if (wavelen >= high_wavelen) {  // between: blend
        const double smooth =
            (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
        f = static_cast<float>((1 - smooth) * f / r.factor + smooth * f);
      }
    }
  }
  return inv;
}

void RopeAngles(const std::vector<float>& inv_freq, long pos, float* cos_out, float* sin_out) {
  for (size_t j = 0; j < inv_freq.size(); ++j) {
    const float angle = static_cast<float>(pos) * inv_freq[j];
    cos_out[j] = std::cos(angle);
    sin_out[j] = std::sin(angle);
  }
}

}  // namespace specloop
