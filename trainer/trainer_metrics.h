// The trainer's Prometheus metrics (DESIGN.md section 8), registered on a metrics::Registry
// that `specloop train` serves on /metrics.
//
//   specloop_train_steps_total                               optimizer steps
//   specloop_train_loss{objective}                           last step's loss
//   specloop_train_samples_total{domain}                     records trained on
//   specloop_train_positions_total{domain}                   logged positions trained on
//   specloop_train_estimated_alpha{domain,model}             held-out alpha-hat (lower bound,
//                                                            each record under its sampling),
//                                                            model = live | candidate;
//                                                            domain "all" for the overall mean
//   specloop_train_evaluations_total                         candidate evaluations (a blend's
//                                                            pass counts as one)
//   specloop_train_evaluated_records_total{model}            held-out records run through a
//                                                            draft (live: new ones only)
//   specloop_train_evaluation_duration_seconds               histogram of evaluations
//   specloop_train_checkpoints_published_total               candidates published
//   specloop_train_checkpoints_rejected_total{reason}        no_gain | domain_regression |
//                                                            below_best | slower_than_plain |
//                                                            no_data | save_error
//   specloop_train_blends_total{outcome}                     blends of a candidate refused for
//                                                            below_best (weight_blend.h):
//                                                            tried | published
//   specloop_train_draft_version                             the live draft's version
//   specloop_train_buffer_records{domain}                    records in the buffers' catalog
//   specloop_train_heldout_records                           records held out for evaluation
//   specloop_train_buffer_lag_seconds                        now minus the newest record's time
//   specloop_train_records_skipped_total{reason}             damaged records the reads stepped
//                                                            over: damaged_block | undecodable |
//                                                            damaged_index | damaged_wal
//                                                            (ReplayReader::records_skipped)
//   specloop_train_step_duration_seconds                     histogram of optimizer steps
#pragma once

#include <string>

#include "common/base/status.h"
#include "common/observe/metrics.h"

namespace specloop {
namespace trainer {

struct TrainerMetrics {
  metrics::Counter* steps = nullptr;
  metrics::Family<metrics::Gauge>* loss = nullptr;
  metrics::Family<metrics::Counter>* samples = nullptr;
  metrics::Family<metrics::Counter>* positions = nullptr;
  metrics::Family<metrics::Gauge>* alpha = nullptr;
  metrics::Counter* evaluations = nullptr;
  metrics::Family<metrics::Counter>* evaluated_records = nullptr;
  metrics::Histogram* evaluation_seconds = nullptr;
  metrics::Counter* published = nullptr;
  metrics::Family<metrics::Counter>* rejected = nullptr;
  metrics::Family<metrics::Counter>* blends = nullptr;
  metrics::Gauge* draft_version = nullptr;
  metrics::Family<metrics::Gauge>* buffer_records = nullptr;
  metrics::Gauge* heldout_records = nullptr;
  metrics::Gauge* buffer_lag = nullptr;
  metrics::Family<metrics::Counter>* records_skipped = nullptr;
  metrics::Histogram* step_seconds = nullptr;

  // Registers every family on `registry` (which must outlive this object).
  Status Register(metrics::Registry* registry);
};

}  // namespace trainer
}  // namespace specloop
