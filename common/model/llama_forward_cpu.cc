// LlamaModel::ForwardCpu: the CPU inference forward, in the shape of llama2.c's run.c. The
// matrix products run LinearPacked (linear_kernels.h) over the packed weights in float32,
// float16 or bfloat16, split by output panels over the intra-op threads; attention over the
// cache is split by (sequence, key/value head) over the same threads; RMSNorm, RoPE, the
// families' q/k/v biases and per-head q/k norms, and SwiGLU are plain loops over float32
// activations.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <ATen/Parallel.h>

#include "common/kernels/cpu_kernels.h"
#include "common/kernels/linear_kernels.h"
#include "common/model/llama_model.h"
#include "common/model/packed_linear.h"
#include "common/model/rope.h"

namespace specloop {

namespace {

// out[r] = x[r] / rms(x[r]) * w, for `rows` rows of `dim`.
void RmsNormRows(const float* x, const float* w, float* out, int64_t rows, int64_t dim,
                 double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float ss = 0.0f;
    for (int64_t i = 0; i < dim; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss / dim + static_cast<float>(eps));
    float* o = out + r * dim;
    for (int64_t i = 0; i < dim; ++i) o[i] = xr[i] * inv * w[i];
  }
}

// Row `id` of the embedding table (of `type`), as float32.
void EmbeddingRow(const at::Tensor& table, WeightType type, int64_t id, float* out) {
  const int64_t dim = table.size(1);
  switch (type) {
    case WeightType::kFloat32:
      std::memcpy(out, table.data_ptr<float>() + id * dim, dim * sizeof(float));
      break;
    case WeightType::kFloat16: {
      const auto* h = static_cast<const uint16_t*>(table.data_ptr()) + id * dim;
      for (int64_t i = 0; i < dim; ++i) out[i] = HalfToFloat(h[i]);
      break;
    }
    case WeightType::kBFloat16: {
      const auto* h = static_cast<const uint16_t*>(table.data_ptr()) + id * dim;
      for (int64_t i = 0; i < dim; ++i) out[i] = BFloat16ToFloat(h[i]);
      break;
    }
  }
}

}  // namespace

at::Tensor LlamaModel::ForwardCpu(const std::vector<ForwardInput>& batch,
                                  const std::vector<int>& layers, at::Tensor* hidden) const {
  const auto& c = config_;
  const int64_t H = c.num_attention_heads, KVH = c.num_key_value_heads, D = c.head_dim;
  const int64_t G = H / KVH, F = c.intermediate_size, Dm = c.hidden_size, half = D / 2;
  const int64_t row = (H + 2 * KVH) * D;  // width of a qkv row: q heads, k heads, v heads
  constexpr int64_t B = KVBlockPool::kBlockTokens;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  FlatBatch f = Flatten(batch);
  const int64_t N = f.ids.size();

  std::vector<float> x(N * Dm);      // residual stream
  std::vector<float> h(N * Dm);      // normalized input of each block
  std::vector<float> attn(N * H * D);
  std::vector<float> act(N * F);     // silu(gate) * up
  std::vector<float> qkv(N * row);
  std::vector<float> gu(N * 2 * F);  // gate, up
  float* xp = x.data();
  float* hp = h.data();
  float* ap = attn.data();
  const WeightType embed_type = WeightTypeOf(embed_);
  for (int64_t r = 0; r < N; ++r) EmbeddingRow(embed_, embed_type, f.ids[r], xp + r * Dm);
  std::vector<float> rope_cos(N * half), rope_sin(N * half);  // each row's rotation
  for (int64_t r = 0; r < N; ++r) {
    RopeAngles(rope_inv_freq_, f.positions[r], rope_cos.data() + r * half,
               rope_sin.data() + r * half);
  }
  int64_t max_new = 0, max_seen = 0;
  for (size_t s = 0; s < batch.size(); ++s) {
    max_new = std::max(max_new, f.lengths[s]);
    max_seen = std::max(max_seen, f.past[s] + f.lengths[s]);
  }

  // The residual stream entering the asked layers, at every new token, side by side.
  const int64_t C = static_cast<int64_t>(layers.size());
  if (hidden != nullptr) *hidden = at::empty({N, C * Dm}, at::kFloat);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    for (int64_t i = 0; i < C; ++i) {
      if (layers[i] != l) continue;
      float* out = hidden->data_ptr<float>() + i * Dm;
      for (int64_t r = 0; r < N; ++r) {
        std::memcpy(out + r * C * Dm, xp + r * Dm, Dm * sizeof(float));
      }
    }
    const Layer& L = layers_[l];
    RmsNormRows(xp, L.attn_norm.data_ptr<float>(), hp, N, Dm, c.rms_norm_eps);
    PackedLinear(hp, N, L.qkv_packed, qkv.data(), false);
    float* qkvp = qkv.data();
    if (L.bqkv.defined()) {  // qwen2: q, k and v biases
      const float* bias = L.bqkv.data_ptr<float>();
      for (int64_t r = 0; r < N; ++r) {
        for (int64_t i = 0; i < row; ++i) qkvp[r * row + i] += bias[i];
      }
    }
    if (L.q_norm.defined()) {  // qwen3: each q and k head normalized over head_dim
      for (int64_t r = 0; r < N; ++r) {
        float* qr = qkvp + r * row;
        RmsNormRows(qr, L.q_norm.data_ptr<float>(), qr, H, D, c.rms_norm_eps);
        RmsNormRows(qr + H * D, L.k_norm.data_ptr<float>(), qr + H * D, KVH, D, c.rms_norm_eps);
      }
    }

    // RoPE (rotate_half layout) on every q and k head of each row, at the row's position.
    for (int64_t r = 0; r < N; ++r) {
      const float* cs = rope_cos.data() + r * half;
      const float* sn = rope_sin.data() + r * half;
      for (int64_t head = 0; head < H + KVH; ++head) {
        float* v = qkvp + r * row + head * D;
        for (int64_t j = 0; j < half; ++j) {
          const float a = v[j], b = v[j + half];
          v[j] = a * cs[j] - b * sn[j];
          v[j + half] = b * cs[j] + a * sn[j];
        }
      }
    }

    // The new keys and values into each sequence's cache blocks, then causal attention per
    // (sequence, key/value head), split over the intra-op threads: the query at position pos
    // sees cache positions [0, pos]. The G query heads of a key/value head and the
    // sequence's n new positions form one [G * n, D] block, scored against the cached keys
    // block by block (a product per block of the cache, where the keys lie), and the values
    // summed block by block in position order (the same bits as one contiguous sum).
    for (size_t s = 0; s < batch.size(); ++s) {
      const KVCache& cache = *batch[s].cache;
      for (int64_t i = 0; i < f.lengths[s]; ++i) {
        const float* qr = qkvp + (f.starts[s] + i) * row;
        const int64_t pos = f.past[s] + i;
        const int32_t block = cache.blocks()[pos / B];
        for (int64_t kv = 0; kv < KVH; ++kv) {
          std::memcpy(cache.pool()->Rows(block, l, 0, kv) + (pos % B) * D, qr + (H + kv) * D,
                      D * sizeof(float));
          std::memcpy(cache.pool()->Rows(block, l, 1, kv) + (pos % B) * D,
                      qr + (H + KVH + kv) * D, D * sizeof(float));
        }
      }
    }
    const int64_t items = static_cast<int64_t>(batch.size()) * KVH;
    const int64_t grain = std::max<int64_t>(1, 2048 / (G * max_new * max_seen));
    at::parallel_for(0, items, grain, [&](int64_t item_begin, int64_t item_end) {
      std::vector<float> qblock(G * max_new * D);         // [G * n, D]
      std::vector<float> scores(G * max_new * max_seen);  // [G * n, T]
      for (int64_t item = item_begin; item < item_end; ++item) {
        const size_t s = item / KVH;
        const int64_t kv = item % KVH;
        const KVCache& cache = *batch[s].cache;
        const KVBlockPool& pool = *cache.pool();
        const int64_t n = f.lengths[s], T = f.past[s] + n;
        for (int64_t g = 0; g < G; ++g) {
          for (int64_t i = 0; i < n; ++i) {
            std::memcpy(qblock.data() + (g * n + i) * D,
                        qkvp + (f.starts[s] + i) * row + (kv * G + g) * D, D * sizeof(float));
          }
        }
        for (int64_t t0 = 0; t0 < T; t0 += B) {  // scores against each block's keys
          LinearRows(qblock.data(), G * n, D, pool.Rows(cache.blocks()[t0 / B], l, 0, kv),
                     WeightType::kFloat32, scores.data() + t0, T, 0, std::min(B, T - t0), false);
        }
        for (int64_t g = 0; g < G; ++g) {
          for (int64_t i = 0; i < n; ++i) {
            float* sr = scores.data() + (g * n + i) * T;
            const int64_t Ti = f.past[s] + i + 1;  // visible positions (a tree masks more)
            if (!f.visible[s].empty()) {
              const char* seen = f.visible[s].data() + i * n;
              for (int64_t j = 0; j <= i; ++j) {
                if (!seen[j]) sr[f.past[s] + j] = -INFINITY;
              }
            }
            float mx = -INFINITY;
            for (int64_t t = 0; t < Ti; ++t) mx = std::max(mx, sr[t] *= scale);
            const float inv = 1.0f / ExpBelowInPlace(sr, Ti, mx);
            for (int64_t t = 0; t < Ti; ++t) sr[t] *= inv;
            float* out = ap + (f.starts[s] + i) * H * D + (kv * G + g) * D;
            for (int64_t t0 = 0; t0 < Ti; t0 += B) {  // each block's values, summed in order
              WeightedRowSum(sr + t0, pool.Rows(cache.blocks()[t0 / B], l, 1, kv),
                             std::min(B, Ti - t0), D, out, /*accumulate=*/t0 > 0);
            }
          }
        }
      }
    });
    PackedLinear(ap, N, L.o_packed, xp, true);

    RmsNormRows(xp, L.ffn_norm.data_ptr<float>(), hp, N, Dm, c.rms_norm_eps);
    PackedLinear(hp, N, L.gate_up_packed, gu.data(), false);
    for (int64_t r = 0; r < N; ++r) {
      SiluMul(gu.data() + r * 2 * F, gu.data() + r * 2 * F + F, act.data() + r * F, F);
    }
    PackedLinear(act.data(), N, L.down_packed, xp, true);
  }
  for (size_t s = 0; s < batch.size(); ++s) {
    batch[s].cache->length_ = f.past[s] + f.lengths[s];
  }

  const int64_t R = f.out_rows.size();
  std::vector<float> last(R * Dm);
  for (int64_t r = 0; r < R; ++r) {
    RmsNormRows(xp + f.out_rows[r] * Dm, final_norm_.data_ptr<float>(), last.data() + r * Dm, 1,
                Dm, c.rms_norm_eps);
  }
  at::Tensor logits = at::empty({R, c.vocab_size}, at::kFloat);
  PackedLinear(last.data(), R, lm_head_packed_, logits.data_ptr<float>(), false);
  return logits;
}

}  // namespace specloop
