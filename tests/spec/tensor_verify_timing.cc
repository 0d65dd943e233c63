// Informational timing (not a ctest test): the tensor chain verifier on the CPU's ATen against
// the host path, at B sequences of k drafts over V tokens. One ATen thread, thread CPU time,
// arms interleaved round by round; a twin of the host arm states the noise. Prints per-round
// medians and the ratios' median, min and max over rounds.
//   tensor_verify_timing [B=16] [k=4] [V=512] [rounds=11] [iters=200]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "buffer/record_builder.h"
#include "common/base/clock.h"
#include "common/base/rng.h"
#include "common/base/sampling.h"
#include "common/spec/chain_verify.h"
#include "common/spec/tensor_topk.h"
#include "common/spec/tensor_verify.h"

namespace {

using namespace specloop;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int B = argc > 1 ? std::atoi(argv[1]) : 16;
  const int K = argc > 2 ? std::atoi(argv[2]) : 4;
  const int V = argc > 3 ? std::atoi(argv[3]) : 512;
  const int rounds = argc > 4 ? std::atoi(argv[4]) : 11;
  const int iters = argc > 5 ? std::atoi(argv[5]) : 200;
  at::set_num_threads(1);
  c10::InferenceMode guard;
  Rng rng(1);
  // Logits of a peaked-ish distribution; p and q their softmaxes at temperature 1.
  std::vector<float> p(static_cast<size_t>(B) * (K + 1) * V), q(static_cast<size_t>(B) * K * V);
  std::vector<float> logits(p.size()), row;
  for (float& x : logits) x = static_cast<float>(6 * rng.Uniform());
  for (size_t r = 0; r < p.size() / V; ++r) {
    Softmax(logits.data() + r * V, V, &row);
    std::copy(row.begin(), row.end(), p.begin() + r * V);
  }
  for (size_t r = 0; r < q.size() / V; ++r) {
    std::vector<float> l(V);
    for (float& x : l) x = static_cast<float>(6 * rng.Uniform());
    Softmax(l.data(), V, &row);
    std::copy(row.begin(), row.end(), q.begin() + r * V);
  }
  std::vector<int> tokens(static_cast<size_t>(B) * K);
  for (int r = 0; r < B * K; ++r) tokens[r] = SampleFrom(q.data() + static_cast<size_t>(r) * V, V, &rng);
  const at::Tensor P = at::from_blob(p.data(), {B, K + 1, V}, at::kFloat);
  const at::Tensor Q = at::from_blob(q.data(), {B, K, V}, at::kFloat);
  const at::Tensor L = at::from_blob(logits.data(), {B, K + 1, V}, at::kFloat);
  const at::Tensor T = at::from_blob(tokens.data(), {B, K}, at::kInt).to(at::kLong);
  std::vector<Rng> rngs(B);
  std::vector<Rng*> ptrs;
  for (Rng& r : rngs) ptrs.push_back(&r);
  const std::vector<int> ks(B, K);
  int64_t sink = 0;

  struct Arm {
    std::string name;
    std::function<void()> run;
    std::vector<double> per_round = {};  // microseconds per step
  };
  std::vector<Arm> arms = {
      {"host_chain", [&] {
         for (int b = 0; b < B; ++b) {
           spec::ChainOutcome o;
           (void)spec::VerifyChain(K, V, tokens.data() + b * K, q.data() + static_cast<size_t>(b) * K * V,
                                   p.data() + static_cast<size_t>(b) * (K + 1) * V, &rngs[b], &o);
           sink += o.num_accepted;
         }
       }},
      {"host_chain_twin", nullptr},
      {"tensor_chain", [&] {
         at::Tensor packed;
         (void)spec::VerifyChainTensors(P, Q, T, spec::ChainControl(ks, K, ptrs), &packed);
         spec::ChainBatchOutcome out;
         (void)spec::UnpackChainOutcomes(packed, &out);
         sink += out.outcomes[0].num_accepted;
       }},
      {"host_greedy", [&] {
         for (int b = 0; b < B; ++b) {
           spec::ChainOutcome o;
           (void)spec::VerifyChainGreedy(K, V, tokens.data() + b * K,
                                         logits.data() + static_cast<size_t>(b) * (K + 1) * V, &o);
           sink += o.num_accepted;
         }
       }},
      {"tensor_greedy", [&] {
         at::Tensor packed;
         (void)spec::VerifyChainGreedyTensors(L, T, spec::ChainControl(ks, K, {}), &packed);
         spec::ChainBatchOutcome out;
         (void)spec::UnpackChainOutcomes(packed, &out);
         sink += out.outcomes[0].num_accepted;
       }},
      {"host_topk64", [&] {
         SpecStep step;
         FillTopK(logits.data(), B * (K + 1), V, 64, &step);
         sink += step.topk_ids[0];
       }},
      {"tensor_topk64", [&] {
         spec::TopKTensors t;
         (void)spec::TopKLogProbs(L.view({B * (K + 1), V}), 64, &t);
         sink += t.ids.to(at::kCPU)[0][0].item<int64_t>();
       }},
  };
  arms[1].run = arms[0].run;
  for (int r = 0; r < rounds; ++r) {
    for (Arm& arm : arms) {
      arm.run();  // warm
      const double t0 = ThreadCpuSeconds();
      for (int i = 0; i < iters; ++i) arm.run();
      arm.per_round.push_back((ThreadCpuSeconds() - t0) / iters * 1e6);
    }
  }
  std::printf("B=%d k=%d V=%d rounds=%d iters=%d (one ATen thread, thread CPU time; sink %lld)\n", B,
              K, V, rounds, iters, static_cast<long long>(sink));
  for (const Arm& arm : arms) {
    std::printf("%-16s median %9.1f us/step\n", arm.name.c_str(), Median(arm.per_round));
  }
  const auto ratio = [&](int a, int b) {
    std::vector<double> r;
    for (int i = 0; i < rounds; ++i) r.push_back(arms[a].per_round[i] / arms[b].per_round[i]);
    std::printf("%s / %s: median %.3f, min %.3f, max %.3f\n", arms[a].name.c_str(),
                arms[b].name.c_str(), Median(r), *std::min_element(r.begin(), r.end()),
                *std::max_element(r.begin(), r.end()));
  };
  ratio(1, 0);
  ratio(2, 0);
  ratio(4, 3);
  ratio(6, 5);
  return 0;
}
