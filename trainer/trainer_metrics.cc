#include "trainer/trainer_metrics.h"

namespace specloop {
namespace trainer {

Status TrainerMetrics::Register(metrics::Registry* r) {
  metrics::Family<metrics::Counter>* c;
  metrics::Family<metrics::Gauge>* g;
  metrics::Family<metrics::Histogram>* h;
  SPECLOOP_RETURN_IF_ERROR(r->AddCounter({"specloop_train_steps_total", "Optimizer steps.", {}}, &c));
  steps = &c->Add({});
  SPECLOOP_RETURN_IF_ERROR(r->AddGauge(
      {"specloop_train_loss", "Distillation loss of the last step, by objective.", {"objective"}},
      &loss));
  SPECLOOP_RETURN_IF_ERROR(r->AddCounter(
      {"specloop_train_samples_total", "Replay records trained on, by domain.", {"domain"}},
      &samples));
  SPECLOOP_RETURN_IF_ERROR(r->AddCounter(
      {"specloop_train_positions_total", "Logged positions trained on, by domain.", {"domain"}},
      &positions));
  SPECLOOP_RETURN_IF_ERROR(r->AddGauge(
      {"specloop_train_estimated_alpha",
       "Estimated acceptance (lower bound) on held-out logged positions, each under its "
       "request's sampling, by domain and model (live or candidate).",
       {"domain", "model"}},
      &alpha));
  SPECLOOP_RETURN_IF_ERROR(
      r->AddCounter({"specloop_train_evaluations_total", "Candidate evaluations.", {}}, &c));
  evaluations = &c->Add({});
  SPECLOOP_RETURN_IF_ERROR(r->AddCounter(
      {"specloop_train_evaluated_records_total",
       "Held-out records run through a draft in evaluations, by model (live or candidate).",
       {"model"}},
      &evaluated_records));
  SPECLOOP_RETURN_IF_ERROR(r->AddHistogram(
      {"specloop_train_evaluation_duration_seconds", "Duration of a candidate evaluation.", {}},
      metrics::ExponentialBuckets(0.01, 2, 14), &h));
  evaluation_seconds = &h->Add({});
  SPECLOOP_RETURN_IF_ERROR(r->AddCounter(
      {"specloop_train_checkpoints_published_total", "Candidates that passed the gate.", {}}, &c));
  published = &c->Add({});
  SPECLOOP_RETURN_IF_ERROR(r->AddCounter(
      {"specloop_train_checkpoints_rejected_total", "Candidates refused, by reason.", {"reason"}},
      &rejected));
  SPECLOOP_RETURN_IF_ERROR(r->AddCounter(
      {"specloop_train_blends_total",
       "Blends of the live draft and a candidate refused for below_best, by outcome (tried, "
       "published).",
       {"outcome"}},
      &blends));
  SPECLOOP_RETURN_IF_ERROR(
      r->AddGauge({"specloop_train_draft_version", "Version of the live draft.", {}}, &g));
  draft_version = &g->Add({});
  SPECLOOP_RETURN_IF_ERROR(r->AddGauge(
      {"specloop_train_buffer_records", "Records in the replay buffers, by domain.", {"domain"}},
      &buffer_records));
  SPECLOOP_RETURN_IF_ERROR(r->AddGauge(
      {"specloop_train_heldout_records", "Records held out for evaluation.", {}}, &g));
  heldout_records = &g->Add({});
  SPECLOOP_RETURN_IF_ERROR(r->AddGauge(
      {"specloop_train_buffer_lag_seconds", "Age of the newest record the trainer has seen.", {}},
      &g));
  buffer_lag = &g->Add({});
  SPECLOOP_RETURN_IF_ERROR(r->AddCounter(
      {"specloop_train_records_skipped_total",
       "Damaged records the trainer's reads stepped over, by reason.", {"reason"}},
      &records_skipped));
  SPECLOOP_RETURN_IF_ERROR(r->AddHistogram(
      {"specloop_train_step_duration_seconds", "Duration of an optimizer step.", {}},
      metrics::ExponentialBuckets(0.001, 2, 16), &h));
  step_seconds = &h->Add({});
  return Status::OK();
}

}  // namespace trainer
}  // namespace specloop
