// aten_forward_timing [MODEL_DIR] [--seqs 16] [--block 5] [--past 128] [--rounds 9]
//   [--reps 10] [--threads 1]
// The ATen forward (LlamaModel's GPU and training forward) on the CPU: the time of a batched
// verification forward (every sequence `block` new tokens after `past` cached ones, all
// logits) in three arms run in rotating order within each round of one run:
//   new:     LlamaModel::Forward's batched attention (common/model/batched_attention.h);
//   old:     the per-sequence forward it replaced (below: a host loop per sequence and layer,
//            the new keys and values copied block by block, each sequence's cache gathered with
//            index_select, its own bmm / softmax / bmm);
//   kernels: the CPU kernels' forward (llama_forward_cpu.cc) on the same caches, the reference
//            arm: the ATen arms' times over it compare across builds and runs.
// Prints one JSON line per round and a summary per ratio (median, min and max over rounds);
// times are the thread's CPU time at --threads 1, else wall time. Also checks that the three
// give the same log-probs (1e-4). Not a ctest test: a timing on a shared machine is not a
// pass / fail.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include "common/base/clock.h"
#include "common/model/llama_model.h"
#include "common/model/rope.h"
#include "tests/testing/temp_dir.h"

namespace specloop {
namespace {

// The forward before batching (git show 7b6c453:common/model/llama_model.cc, ForwardAten),
// for float32 CPU models without trees, hidden states or logit_rows, over the model's named
// weights. Writes the new keys and values into each cache's blocks but leaves its length to
// the caller (`past`).
class PerSequenceForward {
 public:
  explicit PerSequenceForward(const LlamaModel& m) : c_(m.config()) {
    std::map<std::string, at::Tensor> w;
    for (auto& [name, t] : m.NamedWeights()) w[name] = t;
    embed_ = w["model.embed_tokens.weight"];
    for (int l = 0; l < c_.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      layers_.push_back({w[p + "input_layernorm.weight"],
                         at::cat({w[p + "self_attn.q_proj.weight"],
                                  w[p + "self_attn.k_proj.weight"],
                                  w[p + "self_attn.v_proj.weight"]}),
                         w[p + "self_attn.o_proj.weight"], w[p + "post_attention_layernorm.weight"],
                         at::cat({w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]}),
                         w[p + "mlp.down_proj.weight"]});
    }
    norm_ = w["model.norm.weight"];
    head_ = w.count("lm_head.weight") ? w["lm_head.weight"] : embed_;
    inv_freq_ = RopeInverseFrequencies(c_);
  }

  at::Tensor Forward(const std::vector<KVCache*>& caches, const std::vector<int64_t>& past,
                     const std::vector<std::vector<int64_t>>& tokens) const {
    const int64_t H = c_.num_attention_heads, KVH = c_.num_key_value_heads, D = c_.head_dim;
    const int64_t G = H / KVH, F = c_.intermediate_size;
    constexpr int64_t B = KVBlockPool::kBlockTokens;
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    std::vector<int64_t> ids, positions, starts, lengths;
    for (size_t b = 0; b < caches.size(); ++b) {
      starts.push_back(ids.size());
      lengths.push_back(tokens[b].size());
      caches[b]->Reserve(past[b] + tokens[b].size());
      for (size_t i = 0; i < tokens[b].size(); ++i) {
        ids.push_back(tokens[b][i]);
        positions.push_back(past[b] + i);
      }
    }
    const int64_t N = ids.size();
    const auto long_opts = at::TensorOptions().dtype(at::kLong);
    at::Tensor tok = at::from_blob(ids.data(), {N}, long_opts).clone();
    at::Tensor pos = at::from_blob(positions.data(), {N}, long_opts).clone();
    at::Tensor inv = at::from_blob(const_cast<float*>(inv_freq_.data()),
                                   {static_cast<int64_t>(inv_freq_.size())}, at::kFloat);
    const at::Tensor angle = pos.to(at::kFloat).unsqueeze(1) * inv;
    const at::Tensor cs = at::cos(angle), sn = at::sin(angle);
    const at::Tensor cos = at::stack({cs, cs}, 1).unsqueeze(1);
    const at::Tensor sin = at::stack({-sn, sn}, 1).unsqueeze(1);
    std::vector<at::Tensor> masks(caches.size());
    for (size_t b = 0; b < caches.size(); ++b) {
      if (lengths[b] == 1) continue;
      const int64_t n = lengths[b], T = past[b] + n;
      masks[b] = at::full({n, T}, -std::numeric_limits<float>::infinity(), embed_.options())
                     .triu(past[b] + 1)
                     .repeat({G, 1});
    }
    at::Tensor x = embed_.index_select(0, tok);
    for (int64_t l = 0; l < c_.num_hidden_layers; ++l) {
      const Layer& L = layers_[l];
      at::Tensor qkv = at::linear(RmsNorm(x, L.attn_norm), L.wqkv);
      at::Tensor qk = qkv.narrow(1, 0, (H + KVH) * D).view({N, H + KVH, 2, D / 2});
      qk = qk * cos + qk.flip(2) * sin;
      at::Tensor q = qk.narrow(1, 0, H).reshape({N, H, D});
      at::Tensor k = qk.narrow(1, H, KVH).reshape({N, KVH, D});
      at::Tensor v = qkv.narrow(1, (H + KVH) * D, KVH * D).view({N, KVH, D});
      at::Tensor attn = at::empty({N, H * D}, x.options());
      for (size_t b = 0; b < caches.size(); ++b) {
        const int64_t off = starts[b], n = lengths[b], L0 = past[b], T = L0 + n;
        at::Tensor kb = k.narrow(0, off, n).transpose(0, 1);
        at::Tensor vb = v.narrow(0, off, n).transpose(0, 1);
        KVCache& cache = *caches[b];
        const at::Tensor& store = cache.pool()->storage();
        for (int64_t i = 0; i < n;) {
          const int64_t p = L0 + i, len = std::min(n - i, B - p % B);
          at::Tensor slot = store[cache.blocks()[p / B]][l].narrow(2, p % B, len);
          slot[0].copy_(kb.narrow(1, i, len));
          slot[1].copy_(vb.narrow(1, i, len));
          i += len;
        }
        const int64_t nb = KVBlockPool::BlocksFor(T);
        at::Tensor bid = at::from_blob(const_cast<int32_t*>(cache.blocks().data()), {nb}, at::kInt)
                             .to(at::kLong);
        at::Tensor kv = store.select(1, l).index_select(0, bid);
        kv = kv.permute({1, 2, 0, 3, 4}).reshape({2, KVH, nb * B, D}).narrow(2, 0, T);
        at::Tensor keys = kv[0], values = kv[1];
        at::Tensor qb =
            q.narrow(0, off, n).view({n, KVH, G, D}).permute({1, 2, 0, 3}).reshape({KVH, G * n, D});
        at::Tensor scores = masks[b].defined()
                                ? at::baddbmm(masks[b], qb, keys.transpose(1, 2), 1.0, scale)
                                : at::bmm(qb, keys.transpose(1, 2)).mul_(scale);
        at::Tensor o = at::bmm(at::softmax(scores, -1), values);
        o = o.view({KVH, G, n, D}).permute({2, 0, 1, 3}).reshape({n, H * D});
        attn.narrow(0, off, n).copy_(o);
      }
      x = x + at::linear(attn, L.wo);
      at::Tensor gu = at::linear(RmsNorm(x, L.ffn_norm), L.w_gate_up);
      x = x + at::linear(at::silu(gu.narrow(1, 0, F)) * gu.narrow(1, F, F), L.w_down);
    }
    return at::linear(RmsNorm(x, norm_), head_);
  }

 private:
  struct Layer {
    at::Tensor attn_norm, wqkv, wo, ffn_norm, w_gate_up, w_down;
  };
  at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& w) const {
    return x * at::rsqrt(x.square().mean(-1, true) + c_.rms_norm_eps) * w;
  }
  ModelConfig c_;
  at::Tensor embed_, norm_, head_;
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_;
};

// This thread's CPU time (the forwards run on it alone: --threads 1), so that a shared machine's
// descheduling does not count; wall time with more threads.
double Seconds(bool cpu) {
  if (cpu) return ThreadCpuSeconds();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int Main(int argc, char** argv) {
  std::string dir = testing::SharedDir() + "/models/target-6m";
  int seqs = 16, block = 5, past = 128, rounds = 9, reps = 10, threads = 1;
  for (int i = 1; i < argc; ++i) {
    auto next = [&](int* v) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", argv[i]);
        std::exit(2);
      }
      *v = std::atoi(argv[++i]);
    };
    if (!std::strcmp(argv[i], "--seqs")) next(&seqs);
    else if (!std::strcmp(argv[i], "--block")) next(&block);
    else if (!std::strcmp(argv[i], "--past")) next(&past);
    else if (!std::strcmp(argv[i], "--rounds")) next(&rounds);
    else if (!std::strcmp(argv[i], "--reps")) next(&reps);
    else if (!std::strcmp(argv[i], "--threads")) next(&threads);
    else if (argv[i][0] == '-') {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    } else dir = argv[i];
  }
  if (seqs < 1 || block < 1 || past < 1 || rounds < 1 || reps < 1 || threads < 1) {
    std::fprintf(stderr, "every count must be at least 1\n");
    return 2;
  }
  at::set_num_threads(threads);
  c10::InferenceMode guard;
  std::unique_ptr<LlamaModel> m;
  const Status s = LlamaModel::Load(dir, LoadOptions(), &m);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  if (past + block > m->config().max_model_len) {
    std::fprintf(stderr, "--past + --block exceeds the model's %d positions\n",
                 m->config().max_model_len);
    return 2;
  }
  m->set_use_small_cpu_path(false);
  const PerSequenceForward old(*m);
  const int V = m->config().vocab_size;
  at::manual_seed(1);
  auto pool = m->NewBlockPool(0, false);
  std::vector<KVCache> caches;
  std::vector<KVCache*> ptrs;
  std::vector<ForwardInput> prefill, verify;
  std::vector<std::vector<int64_t>> blocks;
  for (int i = 0; i < seqs; ++i) caches.push_back(m->NewCache(pool));
  for (int i = 0; i < seqs; ++i) {
    const at::Tensor t = at::randint(V, {past + block}, at::kLong);
    std::vector<int64_t> ids(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + past + block);
    ptrs.push_back(&caches[i]);
    prefill.push_back({&caches[i], {ids.begin(), ids.begin() + past}, false, {}, {}});
    blocks.emplace_back(ids.begin() + past, ids.end());
    verify.push_back({&caches[i], blocks.back(), true, {}, {}});
  }
  m->Forward(prefill);  // the shared prefix every arm reads
  const std::vector<int64_t> pasts(seqs, past);
  auto run_model = [&](bool kernels) {
    m->set_use_small_cpu_path(kernels);
    at::Tensor out = m->Forward(verify);
    for (KVCache& c : caches) c.Truncate(past);
    return out;
  };
  enum Arm { kOld, kNew, kKernels, kArms };
  const char* names[kArms] = {"old", "new", "kernels"};
  auto run = [&](int arm) {
    return arm == kOld ? old.Forward(ptrs, pasts, blocks) : run_model(arm == kKernels);
  };
  const at::Tensor want = at::log_softmax(run(kKernels), -1);
  double diff = 0;
  for (int arm : {kOld, kNew}) {
    diff = std::max(diff, (at::log_softmax(run(arm), -1) - want).abs().max().item<double>());
  }
  std::printf("{\"name\": \"aten_forward_agreement\", \"value\": %.3g, \"unit\": "
              "\"max |log-prob diff| against the kernels\"}\n",
              diff);
  if (!(diff < 1e-4)) {
    std::fprintf(stderr, "the forwards disagree: %g\n", diff);
    return 1;
  }
  // Ratios per round: old / new, new / kernels, old / kernels.
  const int ratio_arms[3][2] = {{kOld, kNew}, {kNew, kKernels}, {kOld, kKernels}};
  const char* ratio_names[3] = {"old_over_new", "new_over_kernels", "old_over_kernels"};
  std::vector<double> ratios[3];
  for (int r = 0; r < rounds; ++r) {
    double t[kArms];
    for (int i = 0; i < kArms; ++i) {  // rotate which arm goes first
      const int arm = (i + r) % kArms;
      const double t0 = Seconds(threads == 1);
      for (int j = 0; j < reps; ++j) run(arm);
      t[arm] = (Seconds(threads == 1) - t0) / reps;
    }
    std::printf("{\"name\": \"aten_verify_forward\", \"params\": {\"round\": %d, \"seqs\": %d, "
                "\"block\": %d, \"past\": %d, \"threads\": %d}",
                r, seqs, block, past, threads);
    for (int arm = 0; arm < kArms; ++arm) std::printf(", \"%s_ms\": %.3f", names[arm], 1e3 * t[arm]);
    for (int k = 0; k < 3; ++k) {
      ratios[k].push_back(t[ratio_arms[k][0]] / t[ratio_arms[k][1]]);
      std::printf(", \"%s\": %.3f", ratio_names[k], ratios[k].back());
    }
    std::printf("}\n");
  }
  for (int k = 0; k < 3; ++k) {
    std::vector<double>& v = ratios[k];
    std::sort(v.begin(), v.end());
    std::printf("{\"name\": \"aten_verify_forward_%s\", \"params\": {\"seqs\": %d, \"block\": "
                "%d, \"past\": %d, \"threads\": %d, \"rounds\": %d}, \"median\": %.3f, \"min\": "
                "%.3f, \"max\": %.3f, \"unit\": \"time / time\"}\n",
                ratio_names[k], seqs, block, past, threads, rounds, v[v.size() / 2], v.front(),
                v.back());
  }
  return 0;
}

}  // namespace
}  // namespace specloop

int main(int argc, char** argv) { return specloop::Main(argc, argv); }
