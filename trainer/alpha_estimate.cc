#include "trainer/alpha_estimate.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>

#include "trainer/processed_acceptance.h"
#include "trainer/training_examples.h"

namespace specloop {
namespace trainer {

std::map<std::string, double> AlphaEstimate::LoggedByDomain() const {
  std::map<std::string, double> m;
  for (const auto& [d, a] : domains) m[d] = a.logged;
  return m;
}

void ScorableRecords(const std::vector<Record>& records, std::vector<RecordAlpha>* out,
                     std::vector<const Record*>* scorable, std::vector<size_t>* index) {
  out->assign(records.size(), RecordAlpha());
  for (size_t i = 0; i < records.size(); ++i) {
    (*out)[i].domain = records[i].domain;
    (*out)[i].regime = SamplingRegime(records[i].sampling);
    if (!records[i].sampling.Validate().empty()) continue;
    scorable->push_back(&records[i]);
    index->push_back(i);
  }
}

Status EstimateRecords(const LlamaModel& model, const std::vector<Record>& records,
                       int batch_records, std::vector<RecordAlpha>* out) {
  std::vector<const Record*> all;  // the records that can be scored, in order
  std::vector<size_t> index;       // their indices in `records`
  ScorableRecords(records, out, &all, &index);
  const size_t step = static_cast<size_t>(std::max(1, batch_records));
  try {
    c10::InferenceMode guard;
    std::vector<float> scratch;
    size_t first = 0;  // index in `all` of the group's first record
    for (const std::vector<const Record*>& ptrs : SplitForForward(all, step, kMaxForwardTokens)) {
      PositionBatch pb;
      BuildPositionBatch(ptrs, model.config().vocab_size, model.config().max_model_len,
                         Positions::kGenerated, &pb);
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
      // Scored on the CPU, row by row, under each record's sampling (processed_acceptance.h:
      // ~20-27 us per sampled position at vocabulary 4096, about what one vectorised LibTorch
      // softmax of the row costs here; ~2 us per greedy one; a top-p cut deep into a flat row
      // sorts most of it, up to ~0.8 ms, as serving's own ProcessedDistribution does).
      const at::Tensor logits = model.Forward(in).to(at::kCPU, at::kFloat).contiguous();  // [N, V]
      const int V = static_cast<int>(logits.size(1));
      const int K = static_cast<int>(pb.target_ids.size(1));
      const at::Tensor ids = pb.target_ids.contiguous();       // [N, K] int64
      const at::Tensor lps = pb.target_logprobs.contiguous();  // [N, K] float32
      const at::Tensor tails = pb.target_tail.contiguous();    // [N] float32
      for (int64_t n = 0; n < pb.size(); ++n) {
        const Record& record = *ptrs[pb.record_index[n]];
        LoggedTarget target;
        target.ids = ids.data_ptr<int64_t>() + n * K;
        target.logprobs = lps.data_ptr<float>() + n * K;
        target.k = K;
        target.tail = tails.data_ptr<float>()[n];
        const AcceptanceBounds b = ProcessedAcceptance(logits.data_ptr<float>() + n * V, V,
                                                       target, record.sampling, &scratch);
        RecordAlpha& r = (*out)[index[group_first + pb.record_index[n]]];
        r.logged.push_back(b.lower);
        r.coarsened.push_back(b.upper);
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
  auto& g = regime_sums_[r.regime];
  for (size_t n = 0; n < r.logged.size(); ++n) {
    s.first += r.logged[n];
    s.second += r.coarsened[n];
    g.first += r.logged[n];
    g.second += r.coarsened[n];
  }
  est_.regimes[r.regime].positions += static_cast<int64_t>(r.logged.size());
  std::vector<double>& values = est_.logged_values[r.domain];
  values.insert(values.end(), r.logged.begin(), r.logged.end());
  est_.record_ends[r.domain].push_back(values.size());
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
  for (auto& [regime, a] : est.regimes) {
    const auto& [lo, hi] = regime_sums_.at(regime);
    a.logged = lo / a.positions;
    a.coarsened = hi / a.positions;
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
