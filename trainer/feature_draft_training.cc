#include "trainer/feature_draft_training.h"

#include <ATen/core/grad_mode.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "trainer/processed_acceptance.h"

namespace specloop {
namespace trainer {

namespace {

// The draft vocabulary's target ids as a long tensor on `device` (undefined when it is the
// target's whole vocabulary).
at::Tensor DraftIds(const Eagle3Head& head, at::Device device) {
  if (head.draft_vocab_size() == head.config().layer.vocab_size) return at::Tensor();
  const std::vector<int>& ids = head.draft_to_target();
  return at::tensor(std::vector<int64_t>(ids.begin(), ids.end()), at::kLong).to(device);
}

// Keeps the rows `keep` of `pb` (in order), for every per-position field.
void KeepRows(const std::vector<int64_t>& keep, PositionBatch* pb) {
  const at::Tensor idx = at::tensor(keep, at::kLong);
  pb->target_ids = pb->target_ids.index_select(0, idx);
  pb->target_logprobs = pb->target_logprobs.index_select(0, idx);
  pb->target_tail = pb->target_tail.index_select(0, idx);
  auto pick = [&](auto* v) {
    std::remove_reference_t<decltype(*v)> kept;
    for (int64_t i : keep) kept.push_back((*v)[i]);
    *v = std::move(kept);
  };
  pick(&pb->domains);
  pick(&pb->record_index);
  pick(&pb->predicted);
  pick(&pb->draft_index);
}

}  // namespace

Status BuildFeatureExamples(const LlamaModel& target, const Eagle3Head& head,
                            const std::vector<const Record*>& records, bool with_targets,
                            std::vector<FeatureExample>* out) {
  out->assign(records.size(), FeatureExample());
  const size_t limit = static_cast<size_t>(std::max(0, target.config().max_model_len));
  std::vector<const Record*> usable;
  std::vector<size_t> index;
  for (size_t i = 0; i < records.size(); ++i) {
    FeatureExample& ex = (*out)[i];
    ex.domain = records[i]->domain;
    const std::vector<int32_t>& t = records[i]->tokens;
    ex.tokens.assign(t.begin(), t.begin() + std::min(t.size(), limit));
    bool valid = ex.tokens.size() >= 3;
    for (int64_t id : ex.tokens) valid = valid && id >= 0 && id < target.config().vocab_size;
    if (!valid) continue;  // nothing to predict, or ids the target cannot read
    usable.push_back(records[i]);
    index.push_back(i);
  }
  try {
    // No gradient, but not InferenceMode: the tensors enter training graphs as constants.
    at::NoGradGuard no_grad;
    const at::Tensor draft_ids = DraftIds(head, target.device());
    size_t first = 0;
    for (const auto& group : SplitForForward(usable, 0, kMaxForwardTokens)) {
      std::vector<KVCache> caches;
      caches.reserve(group.size());
      std::vector<ForwardInput> in;
      for (size_t g = 0; g < group.size(); ++g) {
        const FeatureExample& ex = (*out)[index[first + g]];
        const int64_t n = static_cast<int64_t>(ex.tokens.size());
        caches.push_back(target.NewCache(n));
        ForwardInput fi{&caches.back(), ex.tokens, false, {}, {}};
        if (with_targets) {
          for (int64_t r = 1; r < n; ++r) fi.logit_rows.push_back(r);
        } else {
          fi.logit_rows = {n - 1};  // the forward returns some logits; take the fewest
        }
        in.push_back(std::move(fi));
      }
      at::Tensor hidden;
      const at::Tensor logits = target.Forward(in, head.config().aux_layers, &hidden);
      int64_t token_row = 0, logit_row = 0;
      for (size_t g = 0; g < group.size(); ++g) {
        FeatureExample& ex = (*out)[index[first + g]];
        const int64_t n = static_cast<int64_t>(ex.tokens.size());
        ex.features = hidden.narrow(0, token_row, n - 1).contiguous();
        token_row += n;
        if (with_targets) {
          at::Tensor rows = logits.narrow(0, logit_row, n - 1);
          if (draft_ids.defined()) rows = rows.index_select(1, draft_ids);
          ex.target_logprobs = at::log_softmax(rows.to(at::kFloat), 1);
          logit_row += n - 1;
        } else {
          logit_row += 1;
        }
      }
      first += group.size();
    }
  } catch (const c10::Error& e) {
    return Status::IOError(std::string("target features: ") + e.what_without_backtrace());
  }
  return Status::OK();
}

std::vector<at::Tensor> UnrollHead(const Eagle3Head& head, const FeatureExample& ex, int steps) {
  const int64_t T = ex.rows();
  TORCH_CHECK(T > 0 && steps >= 1, "UnrollHead: an example without rows, or steps < 1");
  std::vector<int64_t> tokens(ex.tokens.begin(), ex.tokens.end());
  tokens.resize(static_cast<size_t>(T + steps), 0);  // past the record: masked rows only
  return head.ForwardUnrolled(ex.features, tokens, steps);
}

std::vector<at::Tensor> StepLossSums(const Eagle3Head& head, const FeatureExample& ex,
                                     const UnrollOptions& o) {
  TORCH_CHECK(ex.target_logprobs.defined(), "StepLossSums: an example without targets");
  const int64_t T = ex.rows();
  const int steps = static_cast<int>(std::min<int64_t>(o.steps, T));
  const std::vector<at::Tensor> logits = UnrollHead(head, ex, steps);
  std::vector<at::Tensor> sums;
  for (int j = 0; j < steps; ++j) {
    // Rows t < T - j: target at position t + j + 1, i.e. target_logprobs row t + j.
    const int64_t valid = T - j;
    const at::Tensor target = ex.target_logprobs.narrow(0, j, valid).to(logits[j].device());
    sums.push_back(
        FullDistillLossPerPosition(o.objective, logits[j].narrow(0, 0, valid), target).sum());
  }
  return sums;
}

Status AccumulateHeadGradients(const LlamaModel& target, const Eagle3Head& head,
                               const std::vector<const Record*>& batch, const UnrollOptions& o,
                               double* loss, std::vector<std::string>* domains) {
  *loss = 0;
  if (o.steps < 1 || !(o.step_decay > 0)) {
    return Status::InvalidArgument("unrolled steps must be >= 1 and the step decay > 0");
  }
  std::vector<FeatureExample> examples;
  SPECLOOP_RETURN_IF_ERROR(BuildFeatureExamples(target, head, batch, true, &examples));
  return AccumulateExampleGradients(head, examples, o, loss, domains);
}

Status AccumulateExampleGradients(const Eagle3Head& head,
                                  const std::vector<FeatureExample>& examples,
                                  const UnrollOptions& o, double* loss,
                                  std::vector<std::string>* domains) {
  *loss = 0;
  if (o.steps < 1 || !(o.step_decay > 0)) {
    return Status::InvalidArgument("unrolled steps must be >= 1 and the step decay > 0");
  }
  // Valid rows per step over the batch, and the weights.
  std::vector<int64_t> rows(o.steps, 0);
  for (const FeatureExample& ex : examples) {
    for (int j = 0; j < o.steps; ++j) rows[j] += std::max<int64_t>(0, ex.rows() - j);
  }
  if (rows[0] == 0) return Status::OK();
  std::vector<double> w(o.steps);
  double w_total = 0;
  for (int j = 0; j < o.steps; ++j) {
    w[j] = rows[j] > 0 ? std::pow(o.step_decay, j) : 0.0;
    w_total += w[j];
  }
  try {
    c10::AutoGradMode grad(true);
    for (const FeatureExample& ex : examples) {
      if (ex.rows() == 0) continue;
      const std::vector<at::Tensor> sums = StepLossSums(head, ex, o);
      at::Tensor total;
      for (size_t j = 0; j < sums.size(); ++j) {
        const at::Tensor term = sums[j] * (w[j] / (w_total * static_cast<double>(rows[j])));
        total = total.defined() ? total + term : term;
      }
      total.backward();
      *loss += total.item<double>();
      if (domains) domains->insert(domains->end(), ex.rows(), ex.domain);
    }
  } catch (const c10::Error& e) {
    return Status::IOError(std::string("feature-draft training: ") + e.what_without_backtrace());
  }
  return Status::OK();
}

Status HeadTrainStep(const LlamaModel& target, const Eagle3Head& head, AdamW* optimizer,
                     const std::vector<const Record*>& batch, const UnrollOptions& o,
                     double lr_scale, double* loss) {
  optimizer->ZeroGrad();
  std::vector<std::string> rows;
  SPECLOOP_RETURN_IF_ERROR(AccumulateHeadGradients(target, head, batch, o, loss, &rows));
  if (!rows.empty()) optimizer->Step(lr_scale);
  return Status::OK();
}

Status HeadLogitsAtLoggedPositions(const LlamaModel& target, const Eagle3Head& head,
                                   const std::vector<const Record*>& records,
                                   PositionBatch* positions, at::Tensor* logits) {
  BuildPositionBatch(records, target.config().vocab_size, target.config().max_model_len,
                     Positions::kGenerated, positions);
  positions->inputs.clear();
  positions->logit_rows.clear();
  // The records with positions, and per record the steps its rows need.
  std::vector<const Record*> used;
  std::vector<int> steps;
  std::vector<int32_t> slot(records.size(), -1);
  for (int64_t n = 0; n < positions->size(); ++n) {
    const int32_t r = positions->record_index[n];
    if (slot[r] < 0) {
      slot[r] = static_cast<int32_t>(used.size());
      used.push_back(records[r]);
      steps.push_back(0);
    }
    steps[slot[r]] = std::max(steps[slot[r]], positions->draft_index[n] + 1);
  }
  std::vector<FeatureExample> examples;
  SPECLOOP_RETURN_IF_ERROR(BuildFeatureExamples(target, head, used, false, &examples));
  // Rows the head can draft: features at start_pos - 2 (so start_pos >= 2) of a record the
  // target could read. Each predicts a token of the record, so the row's step reads real tokens.
  std::vector<int64_t> keep;
  for (int64_t n = 0; n < positions->size(); ++n) {
    const int64_t t = positions->predicted[n] - positions->draft_index[n] - 2;
    if (t >= 0 && t < examples[slot[positions->record_index[n]]].rows()) keep.push_back(n);
  }
  if (static_cast<int64_t>(keep.size()) != positions->size()) KeepRows(keep, positions);
  const int64_t N = positions->size();
  *logits = at::empty({N, head.draft_vocab_size()}, at::kFloat);
  try {
    c10::InferenceMode guard;
    int64_t n = 0;
    while (n < N) {  // one record's rows at a time (they are contiguous)
      const int32_t r = positions->record_index[n];
      const FeatureExample& ex = examples[slot[r]];
      const std::vector<at::Tensor> step_logits = UnrollHead(head, ex, steps[slot[r]]);
      for (; n < N && positions->record_index[n] == r; ++n) {
        const int j = positions->draft_index[n];
        const int64_t t = positions->predicted[n] - j - 2;
        logits->select(0, n).copy_(step_logits[j].select(0, t));
      }
    }
  } catch (const c10::Error& e) {
    return Status::IOError(std::string("head logits: ") + e.what_without_backtrace());
  }
  return Status::OK();
}

Status EstimateHeadRecords(const LlamaModel& target, const Eagle3Head& head,
                           const std::vector<Record>& records, int batch_records,
                           std::vector<RecordAlpha>* out) {
  std::vector<const Record*> all;  // the records that can be scored, in order
  std::vector<size_t> index;       // their indices in `records`
  ScorableRecords(records, out, &all, &index);
  const size_t step = static_cast<size_t>(std::max(1, batch_records));
  const int V = target.config().vocab_size, Vd = head.draft_vocab_size();
  std::vector<float> scratch;
  size_t first = 0;
  for (const auto& group : SplitForForward(all, step, kMaxForwardTokens)) {
    PositionBatch pb;
    at::Tensor logits;
    SPECLOOP_RETURN_IF_ERROR(HeadLogitsAtLoggedPositions(target, head, group, &pb, &logits));
    logits = logits.contiguous();
    const int K = static_cast<int>(pb.target_ids.size(1));
    const at::Tensor ids = pb.target_ids.contiguous();
    const at::Tensor lps = pb.target_logprobs.contiguous();
    const at::Tensor tails = pb.target_tail.contiguous();
    for (int64_t n = 0; n < pb.size(); ++n) {
      const Record& record = *group[pb.record_index[n]];
      LoggedTarget t;
      t.ids = ids.data_ptr<int64_t>() + n * K;
      t.logprobs = lps.data_ptr<float>() + n * K;
      t.k = K;
      t.tail = tails.data_ptr<float>()[n];
      const AcceptanceBounds b =
          ProcessedAcceptance(logits.data_ptr<float>() + n * Vd, Vd, head.draft_to_target().data(),
                              V, t, record.sampling, &scratch);
      RecordAlpha& r = (*out)[index[first + pb.record_index[n]]];
      r.logged.push_back(b.lower);
      r.coarsened.push_back(b.upper);
    }
    first += group.size();
  }
  return Status::OK();
}

}  // namespace trainer
}  // namespace specloop
