#include "common/engine/device_chain_verify.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <string>

#include "common/spec/tensor_sampling.h"
#include "common/spec/tensor_upload.h"
#include "common/spec/tensor_verify.h"

namespace specloop {
namespace {

// A group of chains verified by one call (the greedy ones, or the sampled ones): indices into
// the chains.
using Group = std::vector<size_t>;

// The group's one int64 upload, [B, 1 + (K + 1) + K]: k_b, then the logits rows its K + 1
// padded positions read (position i > k_b repeats row k_b), then its draft tokens (0-padded).
at::Tensor UploadIndex(const std::vector<DeviceChain>& chains, const Group& g, int64_t K,
                       const at::Device& device) {
  const int64_t B = g.size(), cols = 1 + (K + 1) + K;
  at::Tensor host = at::zeros({B, cols}, at::kLong);
  int64_t* h = host.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    const DeviceChain& c = chains[g[b]];
    const int64_t k = c.draft->tokens.size();
    int64_t* row = h + b * cols;
    row[0] = k;
    for (int64_t i = 0; i <= K; ++i) row[1 + i] = c.first_row + std::min(i, k);
    for (int64_t i = 0; i < k; ++i) row[2 + K + i] = c.draft->tokens[i];
  }
  return spec::ToDeviceAsync(host, device);
}

// [B, K + 1, V]: the group's rows of `logits`, gathered by the upload's indices.
at::Tensor Rows(const at::Tensor& logits, const at::Tensor& index, int64_t K) {
  const int64_t B = index.size(0), V = logits.size(1);
  return logits.index_select(0, index.narrow(1, 1, K + 1).reshape({-1})).view({B, K + 1, V});
}

std::vector<int> Counts(const std::vector<DeviceChain>& chains, const Group& g) {
  std::vector<int> k;
  for (size_t i : g) k.push_back(static_cast<int>(chains[i].draft->tokens.size()));
  return k;
}

// [B, R]: the rows (of [B, R, V], sums [B, R, 1]) with a negative or non-finite entry or no
// positive mass.
at::Tensor Bad(const at::Tensor& rows, const at::Tensor& sums) {
  return (~at::isfinite(rows) | (rows < 0)).any(2) | ~(sums.squeeze(2) > 0);
}

// Greedy chains: VerifyChainGreedyTensors over their raw logits; the extra column is 0 (their
// alpha* is num_accepted, known on the host).
Status VerifyGreedy(const at::Tensor& logits, const std::vector<DeviceChain>& chains,
                    const Group& g, int64_t K, at::Tensor* packed) {
  const at::Tensor index = UploadIndex(chains, g, K, logits.device());
  const at::Tensor control = spec::ChainControl(Counts(chains, g), K, {});
  SPECLOOP_RETURN_IF_ERROR(spec::VerifyChainGreedyTensors(
      Rows(logits, index, K), index.narrow(1, 2 + K, K), control, packed));
  *packed = at::cat({*packed, at::zeros({packed->size(0), 1}, packed->options())}, 1);
  return Status::OK();
}

// Sampled chains: processed p rows on the device, q uploaded once, uniforms from copies of
// their streams; the extra column carries alpha* (float64 bits).
Status VerifySampled(const at::Tensor& logits, const std::vector<DeviceChain>& chains,
                     const Group& g, int64_t K, ChainTensorVerifier verifier,
                     at::Tensor* packed) {
  const int64_t B = g.size(), V = logits.size(1);
  const at::Tensor index = UploadIndex(chains, g, K, logits.device());
  std::vector<SamplingParams> params;
  std::vector<Rng> streams;
  for (size_t i : g) {
    params.push_back(chains[i].sampling);
    streams.push_back(chains[i].rng);
  }
  std::vector<Rng*> rngs;
  for (Rng& r : streams) rngs.push_back(&r);
  at::Tensor p;
  SPECLOOP_RETURN_IF_ERROR(spec::ProcessedProbsTensor(Rows(logits, index, K), params, &p));
  // q: the host rows in one upload (none where every chain's q is on the device already), then
  // the rows drawn on the device in place.
  bool host_rows = false;
  for (size_t i : g) host_rows = host_rows || !chains[i].draft->probs.empty();
  at::Tensor q_dev;
  if (!host_rows) {
    q_dev = at::zeros({B, K, V}, logits.options().dtype(at::kFloat));
  } else {
    at::Tensor q_host = at::zeros({B, K, V}, at::kFloat);
    float* q = q_host.data_ptr<float>();
    for (int64_t b = 0; b < B; ++b) {
      const std::vector<float>& probs = chains[g[b]].draft->probs;
      std::memcpy(q + b * K * V, probs.data(), probs.size() * sizeof(float));
    }
    q_dev = spec::ToDeviceAsync(q_host, logits.device());
  }
  for (int64_t b = 0; b < B; ++b) {
    const at::Tensor& rows = chains[g[b]].draft_probs;
    if (rows.defined()) q_dev.select(0, b).narrow(0, 0, rows.size(0)).copy_(rows);
  }
  const at::Tensor control = spec::ChainControl(Counts(chains, g), K, rngs);
  SPECLOOP_RETURN_IF_ERROR(verifier(p, q_dev, index.narrow(1, 2 + K, K), control, packed));

  at::Tensor alpha = at::zeros({B}, packed->options().dtype(at::kDouble));
  if (K > 0) {
    // alpha* over the tested positions i < tested_b = a_b + (a_b < k_b) (a_b = -1: none).
    const at::Tensor pd = p.narrow(1, 0, K).to(at::kDouble), qd = q_dev.to(at::kDouble);
    const at::Tensor ps = pd.sum(2, /*keepdim=*/true), qs = qd.sum(2, /*keepdim=*/true);
    const at::Tensor overlap = at::minimum(pd / ps, qd / qs).sum(2);  // [B, K]
    const at::Tensor bad = Bad(pd, ps) | Bad(qd, qs);
    const at::Tensor k = index.select(1, 0), a = packed->select(1, 0);
    const at::Tensor tested = (a + (a < k).to(at::kLong)).clamp_min(0).unsqueeze(1);
    const at::Tensor pos = at::arange(K, k.options()).unsqueeze(0);
    alpha = at::where((pos < tested) & ~bad, overlap, at::zeros_like(overlap)).sum(1);
  }
  *packed = at::cat({*packed, alpha.view(at::kLong).unsqueeze(1)}, 1);
  return Status::OK();
}

}  // namespace

Status VerifyChainsOnDevice(const at::Tensor& logits, const std::vector<DeviceChain>& chains,
                            std::vector<DeviceChainResult>* results,
                            ChainTensorVerifier verifier) {
  if (verifier == nullptr) verifier = &spec::VerifyChainTensors;
  results->assign(chains.size(), DeviceChainResult());
  if (!logits.defined() || logits.dim() != 2 || logits.size(1) < 1 ||
      !at::isFloatingType(logits.scalar_type())) {
    return Status::InvalidArgument("logits must be [rows, vocab >= 1] floating");
  }
  const int64_t R = logits.size(0), V = logits.size(1);
  Group greedy, sampled;
  int64_t K = 0;
  for (size_t i = 0; i < chains.size(); ++i) {
    const DeviceChain& c = chains[i];
    std::string bad;
    if (c.draft == nullptr || c.draft->is_tree()) {
      bad = "not a chain";
    } else {
      const int64_t k = c.draft->tokens.size();
      if (c.first_row < 0 || c.first_row + k + 1 > R) {
        bad = "rows [" + std::to_string(c.first_row) + ", " + std::to_string(c.first_row + k + 1) +
              ") outside the " + std::to_string(R) + " logits rows";
      } else if (!c.sampling.greedy() && c.draft_probs.defined() &&
                 (c.draft_probs.dim() != 2 || c.draft_probs.size(0) != k ||
                  c.draft_probs.size(1) != V || !at::isFloatingType(c.draft_probs.scalar_type()))) {
        std::ostringstream shape;
        shape << c.draft_probs.sizes() << " " << c.draft_probs.scalar_type();
        bad = "draft probs on the device are " + shape.str() + ", need [" + std::to_string(k) +
              ", " + std::to_string(V) + "] floating";
      } else if (!c.sampling.greedy() && !c.draft_probs.defined() &&
                 c.draft->probs.size() != static_cast<size_t>(k * V)) {
        bad = "draft probs hold " + std::to_string(c.draft->probs.size()) + " values, need " +
              std::to_string(k) + " x " + std::to_string(V);
      } else if (const std::string p = c.sampling.Validate(); !p.empty()) {
        bad = p;
      }
    }
    if (!bad.empty()) {
      (*results)[i].status = Status::InvalidArgument("chain " + std::to_string(i) + ": " + bad);
      continue;
    }
    K = std::max<int64_t>(K, c.draft->tokens.size());
    (c.sampling.greedy() ? greedy : sampled).push_back(i);
  }
  std::vector<at::Tensor> parts;
  std::vector<size_t> order;  // the packed rows' chains
  for (Group* g : {&greedy, &sampled}) {
    if (g->empty()) continue;
    at::Tensor packed;
    const Status s = g == &greedy ? VerifyGreedy(logits, chains, *g, K, &packed)
                                  : VerifySampled(logits, chains, *g, K, verifier, &packed);
    if (!s.ok()) {  // the call refused the group's shapes: its chains fail
      for (size_t i : *g) (*results)[i].status = s;
      continue;
    }
    parts.push_back(packed);
    order.insert(order.end(), g->begin(), g->end());
  }
  if (parts.empty()) return Status::OK();
  const at::Tensor host = at::cat(parts, 0).to(at::kCPU).contiguous();  // the one copy back
  spec::ChainBatchOutcome unpacked;
  SPECLOOP_RETURN_IF_ERROR(spec::UnpackChainOutcomes(host.narrow(1, 0, K + 2), &unpacked));
  const int64_t* h = host.data_ptr<int64_t>();
  for (size_t j = 0; j < order.size(); ++j) {
    DeviceChainResult& r = (*results)[order[j]];
    r.status = unpacked.status[j];
    if (!r.status.ok()) continue;
    r.outcome = std::move(unpacked.outcomes[j]);
    if (chains[order[j]].sampling.greedy()) {
      r.optimal = r.outcome.num_accepted;
    } else {
      std::memcpy(&r.optimal, h + j * (K + 3) + K + 2, sizeof(double));
    }
  }
  return Status::OK();
}

}  // namespace specloop
