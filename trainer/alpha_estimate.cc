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

Status EstimateRecords(const LlamaModel& model, const std::vector<Record>& records,
                       int batch_records, std::vector<RecordAlpha>* out) {
  out->assign(records.size(), RecordAlpha());
  for (size_t i = 0; i < records.size(); ++i) (*out)[i].domain = records[i].domain;
  const size_t step = static_cast<size_t>(std::max(1, batch_records));
  try {
    c10::InferenceMode guard;
    std::vector<const Record*> all;
    all.reserve(records.size());
    for (const Record& r : records) all.push_back(&r);
    size_t first = 0;  // index in `records` of the group's first record
    for (const std::vector<const Record*>& ptrs : SplitForForward(all, step, kMaxForwardTokens)) {
      PositionBatch pb;
      BuildPositionBatch(ptrs, model.config().vocab_size, model.config().max_position_embeddings,
                         &pb);
      const size_t group_first = first;
      first += ptrs.size();
      if (pb.size() == 0) continue;
      std::vector<KVCache> caches;
      caches.reserve(pb.inputs.size());
      std::vector<ForwardInput> in;
      for (size_t i = 0; i < pb.inputs.size(); ++i) {
        caches.push_back(model.NewCache(static_cast<int64_t>(pb.inputs[i].size())));
        in.push_back(ForwardInput{&caches.back(), pb.inputs[i], false, {}, pb.logit_rows[i]});
      }
      at::Tensor logits = model.Forward(in);
      at::Tensor ids = pb.target_ids.to(logits.device());
      at::Tensor lps = pb.target_logprobs.to(logits.device());
      at::Tensor tail = pb.target_tail.to(logits.device());
      at::Tensor lo = LoggedAcceptance(logits, ids, lps, tail).to(at::kDouble).cpu();
      at::Tensor hi = CoarsenedAcceptance(logits, ids, lps, tail).to(at::kDouble).cpu();
      const double* l = lo.data_ptr<double>();
      const double* h = hi.data_ptr<double>();
      for (int64_t n = 0; n < pb.size(); ++n) {
        RecordAlpha& r = (*out)[group_first + pb.record_index[n]];
        r.logged.push_back(l[n]);
        r.coarsened.push_back(h[n]);
      }
    }
  } catch (const c10::Error& e) {
    return Status::IOError(std::string("estimating alpha: ") + e.what_without_backtrace());
  }
  return Status::OK();
}

Status AlphaAccumulator::Add(const LlamaModel& model, const std::vector<Record>& records,
                             int batch_records) {
  std::vector<RecordAlpha> values;
  SPECLOOP_RETURN_IF_ERROR(EstimateRecords(model, records, batch_records, &values));
  for (const RecordAlpha& r : values) Add(r);
  return Status::OK();
}

void AlphaAccumulator::Add(const RecordAlpha& r) {
  if (r.logged.empty()) return;
  auto& s = sums_[r.domain];
  for (size_t n = 0; n < r.logged.size(); ++n) {
    s.first += r.logged[n];
    s.second += r.coarsened[n];
  }
  std::vector<double>& values = est_.logged_values[r.domain];
  values.insert(values.end(), r.logged.begin(), r.logged.end());
  est_.domains[r.domain].positions += static_cast<int64_t>(r.logged.size());
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
