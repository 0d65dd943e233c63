// LlamaModel::ForwardSmallCpu: the float32 CPU inference forward for blocks of a few new tokens
// per sequence (decode and speculative verification). Four BLAS matmuls per layer; RMSNorm,
// RoPE, attention over the cache and SwiGLU are plain loops in the shape of llama2.c's run.c,
// because on small models LibTorch's per-operator overhead, not arithmetic, dominates.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/llama_model.h"
#include "common/cpu_kernels.h"

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

// in [M, K] times weight [O, K] transposed, into out [M, O] (accumulating when `add`): the
// small-block kernel for up to 16 rows, BLAS beyond (see cpu_kernels.h for the measurements).
void Linear(const at::Tensor& in, const at::Tensor& weight, at::Tensor& out, bool add) {
  const int64_t M = in.size(0);
  if (M <= 16) {
    SmallGemm(in.data_ptr<float>(), weight.data_ptr<float>(), out.data_ptr<float>(), M,
              in.size(1), weight.size(0), add);
  } else if (add) {
    out.addmm_(in, weight.t());
  } else {
    at::mm_out(out, in, weight.t());
  }
}

}  // namespace

at::Tensor LlamaModel::ForwardSmallCpu(const std::vector<ForwardInput>& batch) const {
  const auto& c = config_;
  const int64_t H = c.num_attention_heads, KVH = c.num_key_value_heads, D = c.head_dim;
  const int64_t G = H / KVH, F = c.intermediate_size, Dm = c.hidden_size, half = D / 2;
  const int64_t row = (H + 2 * KVH) * D;  // width of a qkv row: q heads, k heads, v heads
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  FlatBatch f = Flatten(batch);
  const int64_t N = f.ids.size();

  at::Tensor x = at::empty({N, Dm}, at::kFloat);     // residual stream
  at::Tensor h = at::empty({N, Dm}, at::kFloat);     // normalized input of each block
  at::Tensor attn = at::empty({N, H * D}, at::kFloat);
  at::Tensor act = at::empty({N, F}, at::kFloat);    // silu(gate) * up
  at::Tensor qkv = at::empty({N, row}, at::kFloat);
  at::Tensor gu = at::empty({N, 2 * F}, at::kFloat);  // gate, up
  float* xp = x.data_ptr<float>();
  float* hp = h.data_ptr<float>();
  float* ap = attn.data_ptr<float>();
  float* actp = act.data_ptr<float>();
  const float* emb = embed_.data_ptr<float>();
  for (int64_t r = 0; r < N; ++r) std::memcpy(xp + r * Dm, emb + f.ids[r] * Dm, Dm * sizeof(float));
  const float* cosp = rope_cos_.data_ptr<float>();  // [P, 2, half]: cos twice
  const float* sinp = rope_sin_.data_ptr<float>();  // [P, 2, half]: -sin, then sin
  int64_t max_new = 0;
  for (int64_t n : f.lengths) max_new = std::max(max_new, n);
  std::vector<float> qblock(G * max_new * D);                            // [G * n, D]
  std::vector<float> scores(G * max_new * c.max_position_embeddings);   // [G * n, T]

  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const Layer& L = layers_[l];
    RmsNormRows(xp, L.attn_norm.data_ptr<float>(), hp, N, Dm, c.rms_norm_eps);
    Linear(h, L.wqkv, qkv, false);
    float* qkvp = qkv.data_ptr<float>();

    // RoPE (rotate_half layout) on every q and k head of each row, at the row's position.
    for (int64_t r = 0; r < N; ++r) {
      const float* cs = cosp + f.positions[r] * D;
      const float* sn = sinp + f.positions[r] * D + half;
      for (int64_t head = 0; head < H + KVH; ++head) {
        float* v = qkvp + r * row + head * D;
        for (int64_t j = 0; j < half; ++j) {
          const float a = v[j], b = v[j + half];
          v[j] = a * cs[j] - b * sn[j];
          v[j + half] = b * cs[j] + a * sn[j];
        }
      }
    }

    for (size_t s = 0; s < batch.size(); ++s) {
      KVCache& cache = *batch[s].cache;
      const int64_t cap = cache.keys_.size(2);
      float* kc = cache.keys_.data_ptr<float>() + l * KVH * cap * D;    // [KVH, cap, D]
      float* vc = cache.values_.data_ptr<float>() + l * KVH * cap * D;  // [KVH, cap, D]
      for (int64_t i = 0; i < f.lengths[s]; ++i) {
        const float* qr = qkvp + (f.starts[s] + i) * row;
        const int64_t pos = f.past[s] + i;
        for (int64_t kv = 0; kv < KVH; ++kv) {
          std::memcpy(kc + (kv * cap + pos) * D, qr + (H + kv) * D, D * sizeof(float));
          std::memcpy(vc + (kv * cap + pos) * D, qr + (H + KVH + kv) * D, D * sizeof(float));
        }
      }
      // Causal attention: the query at position pos sees cache positions [0, pos]. The G query
      // heads of a key/value head and the sequence's n new positions form one [G * n, D]
      // block, scored against the cached keys in one SmallGemm.
      const int64_t n = f.lengths[s], T = f.past[s] + n;
      for (int64_t kv = 0; kv < KVH; ++kv) {
        for (int64_t g = 0; g < G; ++g) {
          for (int64_t i = 0; i < n; ++i) {
            std::memcpy(qblock.data() + (g * n + i) * D,
                        qkvp + (f.starts[s] + i) * row + (kv * G + g) * D, D * sizeof(float));
          }
        }
        SmallGemm(qblock.data(), kc + kv * cap * D, scores.data(), G * n, D, T, false);
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
            float sum = 0.0f;
            for (int64_t t = 0; t < Ti; ++t) sum += (sr[t] = std::exp(sr[t] - mx));
            const float inv = 1.0f / sum;
            for (int64_t t = 0; t < Ti; ++t) sr[t] *= inv;
            WeightedRowSum(sr, vc + kv * cap * D, Ti, D,
                           ap + (f.starts[s] + i) * H * D + (kv * G + g) * D);
          }
        }
      }
    }
    Linear(attn, L.wo, x, true);

    RmsNormRows(xp, L.ffn_norm.data_ptr<float>(), hp, N, Dm, c.rms_norm_eps);
    Linear(h, L.w_gate_up, gu, false);
    const float* gup = gu.data_ptr<float>();
    for (int64_t r = 0; r < N; ++r) {
      for (int64_t j = 0; j < F; ++j) {
        const float g = gup[r * 2 * F + j];
        actp[r * F + j] = g / (1.0f + std::exp(-g)) * gup[r * 2 * F + F + j];
      }
    }
    Linear(act, L.w_down, x, true);
  }
  for (size_t s = 0; s < batch.size(); ++s) {
    batch[s].cache->length_ = f.past[s] + f.lengths[s];
  }

  const int64_t R = f.out_rows.size();
  at::Tensor last = at::empty({R, Dm}, at::kFloat);
  float* lp = last.data_ptr<float>();
  for (int64_t r = 0; r < R; ++r) {
    RmsNormRows(xp + f.out_rows[r] * Dm, final_norm_.data_ptr<float>(), lp + r * Dm, 1, Dm,
                c.rms_norm_eps);
  }
  at::Tensor logits = at::empty({R, c.vocab_size}, at::kFloat);
  Linear(last, lm_head_, logits, false);
  return logits;
}

}  // namespace specloop
