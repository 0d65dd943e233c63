#include "trainer/alpha_estimate.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>

#include "trainer/distill_loss.h"
#include "trainer/training_examples.h"

namespace specloop {
namespace trainer {

std::map<std::string, double> AlphaEstimate::LoggedByDomain() const {
  std::map<std::string, double> m;
  for (const auto& [d, a] : domains) m[d] = a.logged;
  return m;
}

Status AlphaAccumulator::Add(const LlamaModel& model, const std::vector<Record>& records,
                             int batch_records) {
  const size_t step = static_cast<size_t>(std::max(1, batch_records));
  try {
    c10::InferenceMode guard;
    std::vector<const Record*> all;
    all.reserve(records.size());
    for (const Record& r : records) all.push_back(&r);
    for (const std::vector<const Record*>& ptrs : SplitForForward(all, step, kMaxForwardTokens)) {
      PositionBatch pb;
      BuildPositionBatch(ptrs, model.config().vocab_size, model.config().max_position_embeddings,
                         &pb);
      if (pb.size() == 0) continue;
      std::vector<KVCache> caches;
      caches.reserve(pb.inputs.size());
      std::vector<ForwardInput> in;
      for (auto& tokens : pb.inputs) {
        caches.push_back(model.NewCache(static_cast<int64_t>(tokens.size())));
        in.push_back(ForwardInput{&caches.back(), tokens, /*all_logits=*/true});
      }
      at::Tensor logits = model.Forward(in).index_select(0, pb.rows.to(model.device()));
      at::Tensor ids = pb.target_ids.to(logits.device());
      at::Tensor lps = pb.target_logprobs.to(logits.device());
      at::Tensor tail = pb.target_tail.to(logits.device());
      at::Tensor lo = LoggedAcceptance(logits, ids, lps, tail).to(at::kDouble).cpu();
      at::Tensor hi = CoarsenedAcceptance(logits, ids, lps, tail).to(at::kDouble).cpu();
      const double* l = lo.data_ptr<double>();
      const double* h = hi.data_ptr<double>();
      for (int64_t n = 0; n < pb.size(); ++n) {
        auto& s = sums_[pb.domains[n]];
        s.first += l[n];
        s.second += h[n];
        est_.logged_values[pb.domains[n]].push_back(l[n]);
        est_.domains[pb.domains[n]].positions++;
      }
    }
  } catch (const c10::Error& e) {
    return Status::IOError(std::string("estimating alpha: ") + e.what_without_backtrace());
  }
  return Status::OK();
}

AlphaEstimate AlphaAccumulator::Estimate() const {
  AlphaEstimate est = est_;
  double all_lo = 0, all_hi = 0;
  est.overall = DomainAlpha();
  for (auto& [d, a] : est.domains) {
    const auto& [lo, hi] = sums_.at(d);
    a.logged = lo / a.positions;
    a.coarsened = hi / a.positions;
    all_lo += lo;
    all_hi += hi;
    est.overall.positions += a.positions;
  }
  if (est.overall.positions > 0) {
    est.overall.logged = all_lo / est.overall.positions;
    est.overall.coarsened = all_hi / est.overall.positions;
  }
  return est;
}

Status EstimateAlpha(const LlamaModel& model, const std::vector<Record>& records,
                     int batch_records, AlphaEstimate* out) {
  AlphaAccumulator acc;
  SPECLOOP_RETURN_IF_ERROR(acc.Add(model, records, batch_records));
  *out = acc.Estimate();
  return Status::OK();
}

}  // namespace trainer
}  // namespace specloop
