// Estimated acceptance (alpha-hat) of a draft on logged positions, per domain and per sampling
// regime: the quantity the publish gate compares between the live draft and a candidate.
//
// Each record is scored under its own request's sampling (Record::sampling), as serving
// verifies it (processed_acceptance.h): temperature, top-k and top-p applied to the logged
// target top-K and to the draft's full distribution; greedy records (temperature 0) by whether
// the two argmaxes agree. A draft that matches the target's raw distribution better can still
// lose on greedy traffic (a near-tie at the top resolved the other way); the gate sees that.
//
// The gate reads the LOWER bound (LowerAcceptance: sum over the K logged tokens of
// min(p_lower, q), the tail credited nothing). The upper bound also credits the tail, which a
// candidate could raise by moving mass onto tokens the target never ranks highly: it rewards
// matching the tail's total, not its tokens. The lower bound cannot be gamed that way, and on
// the same held-out positions the two estimates rank drafts alike when the tail is small
// (K = 64 leaves a tail of a few percent on the fixtures). At temperature 1 with no top-k or
// top-p they are distill_loss.h's LoggedAcceptance and CoarsenedAcceptance.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "buffer/record.h"
#include "common/base/status.h"
#include "common/model/llama_model.h"

namespace specloop {
namespace trainer {

struct DomainAlpha {
  double logged = 0;      // mean lower bound (LowerAcceptance; the gate's metric)
  double coarsened = 0;   // mean upper bound (UpperAcceptance)
  int64_t positions = 0;  // positions averaged
};

struct AlphaEstimate {
  std::map<std::string, DomainAlpha> domains;
  DomainAlpha overall;  // over every position (weighted by traffic, as speed is)
  // Per sampling regime ("greedy", "sampled": SamplingRegime), over every domain's positions
  // of that regime; a regime without positions is absent.
  std::map<std::string, DomainAlpha> regimes;
  // Per domain, the lower bound of each position in record order: two models estimated
  // on the same records have paired values (the gate's paired standard error).
  std::map<std::string, std::vector<double>> logged_values;
  // Per domain, where each record's values end in logged_values (exclusive, increasing): a
  // record's positions share its prompt and context, so the gate's standard error treats
  // records, not positions, as the independent draws.
  std::map<std::string, std::vector<size_t>> record_ends;

  // domain -> logged alpha, the form checkpoints and reports carry.
  std::map<std::string, double> LoggedByDomain() const;
};

// One record's estimates, per logged position in order (none when it has no usable one).
struct RecordAlpha {
  std::string domain;
  std::string regime;  // SamplingRegime(record.sampling)
  std::vector<double> logged, coarsened;  // lower and upper bounds
};

// Starts EstimateRecords' output: one RecordAlpha per record (its domain and regime), and the
// records that can be scored (a valid Record::sampling), in order, with their indices.
void ScorableRecords(const std::vector<Record>& records, std::vector<RecordAlpha>* out,
                     std::vector<const Record*>* scorable, std::vector<size_t>* index);

// Evaluates `model` on the positions of `records` (training_examples.h), in forwards of at
// most `batch_records` records and kMaxForwardTokens tokens, under inference mode; sets *out
// to one RecordAlpha per record, in order, each position scored under the record's sampling. A
// record whose sampling parameters are invalid (SamplingParams::Validate) gets no values.
// IOError wraps a LibTorch failure. A record's values do not depend on the records it shares a
// forward with, up to float rounding.
Status EstimateRecords(const LlamaModel& model, const std::vector<Record>& records,
                       int batch_records, std::vector<RecordAlpha>* out);

// Builds an AlphaEstimate from records given in parts, so that a large held-out set need not
// be resident at once. Parts added in the same order to two accumulators give paired
// logged_values.
class AlphaAccumulator {
 public:
  // EstimateRecords(), then adds every record's values (none when it fails).
  Status Add(const LlamaModel& model, const std::vector<Record>& records, int batch_records);
  // Adds one record's values (e.g. kept from an earlier evaluation of the same model).
  void Add(const RecordAlpha& record);
  // The estimate over every position added so far.
  AlphaEstimate Estimate() const;

 private:
  AlphaEstimate est_;  // positions and logged_values; the means are filled by Estimate()
  // domain (regime) -> (sum of lower bounds, sum of upper bounds)
  std::map<std::string, std::pair<double, double>> sums_, regime_sums_;
};

// AlphaAccumulator over `records` in one part.
Status EstimateAlpha(const LlamaModel& model, const std::vector<Record>& records,
                     int batch_records, AlphaEstimate* out);

}  // namespace trainer
}  // namespace specloop
