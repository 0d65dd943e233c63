// Trainer: distils the draft toward the target on replay-buffer records (DESIGN.md section 6).
// The draft is a draft model or an EAGLE-3 feature head (trainable_draft.h: the layout of the
// draft directory tells which); a head also needs the target (TrainerOptions::target_dir),
// which the trainer runs itself for the head's features and the target's full distributions
// (feature_draft_training.h). Everything else below is the same for both kinds.
//
// It holds two drafts: the LIVE one (the latest checkpoint, or the initial draft when there
// is none: what workers serve) and the CANDIDATE it trains with AdamW. Periodically it
// estimates both on the same held-out logged positions, each under its request's sampling
// (alpha_estimate.h), and asks the gate
// (publish_gate.h); a candidate that passes is saved as the next checkpoint (checkpoint_store.h),
// announced (common/channel/draft_channel.h) and becomes the live draft; one that fails is not
// published and training goes on (the reason goes to the log and to
// specloop_train_checkpoints_rejected_total{reason}). While no draft is served yet
// (initial_draft_served false and no checkpoint), there is no live draft to beat: the gate
// judges the candidate against plain decoding instead (DecideFirstDraft).
//
// Data. Records are held out by a hash of their prompt (heldout_split.h). Online, every
// domain the trainer has seen first gets replay_floor_records of each batch (its floor: an
// idle domain keeps being trained while new ones are learnt), and the rest of the batch comes
// from ReplayReader::Sample: a domain is drawn with weight
//   max(recent traffic share, min_domain_share) * (1 + alpha_gap_boost * gap)
// (recent traffic = records in the buffers, each weighted 2^(-age / traffic_half_life), so
// the mix follows a shift in traffic within seconds; the gap, from the last evaluation, is
// the largest of the live draft's and the candidate's falls below the best draft served on
// the domain (EvalResult::best) and the candidate's deficit below the live draft there, so a
// domain being forgotten, or one the gate refused a candidate for ("below_best"), is trained
// more until a candidate holds it again), then a
// record of it with recency half-life half_life_seconds, so older data and quieter domains
// keep being replayed. The newest training and held-out records of each domain are also kept
// in memory (domain_reserve.h), so that a domain's floor in replay and in the held-out set
// outlives the buffer's retention. Offline, epochs run over every training record in a
// seeded shuffled order (all records are read into memory).
//
// A restarted trainer resumes from `latest` (weights, version, steps and samples; the
// optimizer's moments start afresh).
//
// Thread safety: none; one thread drives a Trainer, except state(), which any thread may call.
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "buffer/replay_reader.h"
#include "common/base/rng.h"
#include "common/model/llama_model.h"
#include "common/observe/metrics.h"
#include "trainer/adamw.h"
#include "trainer/alpha_estimate.h"
#include "trainer/checkpoint_store.h"
#include "trainer/eval_cadence.h"
#include "trainer/distill_loss.h"
#include "trainer/domain_reserve.h"
#include "trainer/publish_gate.h"
#include "trainer/trainable_draft.h"
#include "trainer/trainer_metrics.h"

namespace specloop {

class DraftPublisher;

namespace trainer {

struct TrainerOptions {
  std::string draft_dir;                 // initial draft, used when no checkpoint exists
  // The target's directory: required when the draft is an EAGLE-3 head, unused otherwise.
  std::string target_dir;
  // Whether workers serve the initial draft (draft_dir) until the first checkpoint. False
  // (`specloop up` with no --draft: the workers decode plainly): until a checkpoint exists the
  // gate judges candidates against plain decoding (DecideFirstDraft). Default: true.
  bool initial_draft_served = true;
  std::vector<std::string> buffer_dirs;  // replay buffers, opened as RocksDB secondaries
  std::string checkpoint_dir;
  // Default: jsd:0.5, the best of the objective comparison in trainer/README.md.
  ObjectiveSpec objective{Objective::kJsd, 0.5};
  AdamWOptions adamw;
  int batch_records = 8;              // records per optimizer step. Default: 8.
  int warmup_steps = 20;              // linear learning-rate warm-up. Default: 20.
  // Backpropagate into a record's context before its first trained position too. Off: that
  // context runs forward only, its keys and values entering the step as constants. Serving
  // logs prompt rows from position 1, so only a record whose prompt was partly served from the
  // prefix cache (its cached rows not logged) has such a context. Default: off.
  bool context_gradient = false;
  // EAGLE-3 heads: unrolled steps of training-time test and their loss weight decay
  // (feature_draft_training.h). Defaults: 3 and 0.8.
  int unroll_steps = 3;
  double step_decay = 0.8;
  double half_life_seconds = 3600.0;  // recency half-life of online sampling. Default: 1 h.
  // Age weighting of the domain mix (sampling and the gate's overall alpha): a shift in traffic
  // moves the mix within seconds, so a new domain is trained from the start of its phase
  // (bench/faster_over_time). With sparse traffic the mix follows the last few records.
  // Default: 10 s, ~70 records at the domain-shift benchmark's rate.
  double traffic_half_life_seconds = 10.0;
  double min_domain_share = 0.05;     // domain weight floor (replay). Default: 0.05.
  double alpha_gap_boost = 20.0;      // domain weight boost per unit of alpha gap. Default: 20.
  // Replay floor (online): every domain the trainer has seen gets this many records of each
  // batch, times (1 + alpha_gap_boost * its alpha gap), drawn from its own training records
  // (recency half_life_seconds; from the reserve below once retention has removed them all
  // from the buffers); the rest of the batch is drawn by the domain weights above. Floors take
  // at most half of a batch (scaled down to fit, fractions drawn at random). 0: no floor.
  // Default: 2 (trainer/README.md, "No forgetting").
  int replay_floor_records = 2;
  // The replay floor of each domain the gate last refused a candidate for ("below_best",
  // publish_gate.h) is multiplied by this (before the half-batch cap): the gap alone (a few
  // hundredths, x1.5) left it too few records against the new domain's to be trained back
  // within an evaluation interval (bench/faster_over_time --forgetting). Until the next
  // evaluation. 1: no boost. Default: 4.
  double below_best_floor_boost = 4.0;
  // A candidate the gate refused for "below_best" alone is blended with the live draft
  // (weight_blend.h: live + lambda * (candidate - live)) at each of these lambdas in order, each
  // blend judged by the same gate against the same live estimate and best (one evaluation pass
  // over the held-out records each); the first accepted is published, and training goes on
  // from it (the AdamW moments are kept: they follow the gradients near the weights, which the
  // blend moves by a fraction of the candidate's recent steps). When none is accepted the
  // candidate is left as it was. Each lambda in (0, 1). Empty: no blends. Default: {0.5, 0.25}.
  std::vector<double> below_best_blends = {0.5, 0.25};
  // Newest training records of each domain kept in memory (encoded, domain_reserve.h) for the
  // floor after retention. 0: none. Default: 32.
  size_t reserve_records_per_domain = 32;
  double heldout_fraction = 0.1;      // records held out for evaluation. Default: 0.1.
  size_t max_heldout_per_domain = 256;  // newest held-out records kept per domain.
  // Held-out floor: the newest this many held-out records of each domain (at most
  // max_heldout_per_domain) stay in the evaluation set after retention removed them from the
  // buffers (copies, domain_reserve.h), so the gate keeps judging a domain that went idle.
  // 0: none. Default: 32.
  size_t heldout_floor_per_domain = 32;
  // Online: when to evaluate (and maybe publish) the candidate. eval_every_steps > 0: every
  // that many steps; 0: the adaptive cadence of eval_cadence.h (25 steps after a publish or a
  // shift of the traffic, doubling after each refusal up to 200, at most 25% of the time).
  // Default: 0.
  int eval_every_steps = 0;
  EvalCadenceOptions eval_cadence;
  // Online: at most this many samples trained (since this trainer opened) per training record
  // in the buffers; beyond it the trainer waits for new traffic instead of overfitting a young
  // buffer (held-out alpha fell while training alpha rose). 0: no limit. Default: 4.
  double max_replay = 4.0;
  int eval_batch_records = 16;        // records per evaluation forward. Default: 16.
  GateOptions gate;
  int keep_last = 5;                  // checkpoints kept. Default: 5.
  uint32_t catch_up_interval_ms = 5000;  // online: buffer catch-up period. Default: 5 s.
  uint64_t seed = 1;
  std::string device = "cpu";
};

struct EvalResult {
  AlphaEstimate live, candidate;
  // Per domain, the best draft served there so far on the same records (what the gate's
  // "below_best" rule compares the candidate with): each record's values are those of the
  // served draft with the highest alpha on its domain over an evaluation's records since the
  // record joined the set (the live draft's for a record new to the set).
  AlphaEstimate best;
  GateDecision decision;
  uint64_t version = 0;  // the checkpoint written, when the candidate was published
  double seconds = 0;    // how long the evaluation took (blends' passes included)
  // Blends of a candidate refused for "below_best" (TrainerOptions::below_best_blends): how
  // many were evaluated, and the lambda of the one the gate accepted (then `candidate` and
  // `decision` are the blend's), else 1 (the candidate itself, and the candidate's refusal).
  int blends_tried = 0;
  double blend_lambda = 1;
};

// What the trainer is doing and what its gate last decided: `specloop train`'s /status.json,
// shown on the server's status page.
struct TrainerState {
  std::string objective;            // TrainerOptions::objective, e.g. "reverse_kl"
  std::string draft_kind;           // TrainableDraft::kind(): "model" or "eagle3"
  std::string activity = "starting";  // "training", "waiting for traffic" or "starting"
  int64_t steps = 0;
  double loss = NAN;  // the last step's
  uint64_t live_version = 0;
  // The last evaluation (evaluations == 0: none yet): when (unix seconds), after which step,
  // the gate's decision, its reason ("ok" when published) and the numbers behind it, the
  // overall held-out alpha of both drafts, and the version written when it was published.
  int64_t evaluations = 0;
  double evaluated_unix = 0;
  int64_t evaluated_step = 0;
  bool published = false;
  std::string reason, detail;
  double live_alpha = NAN, candidate_alpha = NAN;
  uint64_t published_version = 0;
};

struct OfflineProgress {
  int epoch = 0, epochs = 0;
  int64_t step = 0, steps = 0;  // within the whole run
  double loss = 0;
};

class Trainer {
 public:
  // Loads the target when the draft is a head, the live and candidate drafts (from
  // checkpoint_dir's latest, else draft_dir), opens the buffers and reads the held-out set. `registry` (may be null) receives the metrics and
  // must outlive the trainer.
  static Status Open(const TrainerOptions& options, metrics::Registry* registry,
                     std::unique_ptr<Trainer>* out);
  ~Trainer();

  // Catches the buffers up and adds new held-out records to the evaluation set.
  Status CatchUp();
  // One AdamW step of the objective on the logged positions of `batch`. *loss: its value
  // (0 and no step when the batch has no usable position).
  Status TrainStep(const std::vector<const Record*>& batch, double* loss);
  // Estimates live and candidate on the held-out set and applies the gate.
  Status Evaluate(EvalResult* result);
  // Evaluate(); when the gate passes (or `force`), saves the candidate as the next
  // checkpoint, makes it live and announces it on `publisher` (may be null).
  Status EvaluateAndPublish(DraftPublisher* publisher, bool force, EvalResult* result);

  // Draws an online batch (batch_records): each domain seen gets its floor,
  // replay_floor_records * (1 + alpha_gap_boost * its alpha gap) records (times
  // below_best_floor_boost for a domain the last gate named "below_best"; the buffers', or the
  // reserve's once retention removed the domain there; all floors together at most half the
  // batch, scaled down to fit, a fractional part drawn at random), then the rest by the domain
  // weights (recent traffic, min_domain_share, alpha gaps). The batch may hold held-out records
  // (RunOnline leaves them out). NotFound when there is no record to draw.
  Status SampleBatch(std::vector<Record>* batch);
  // The long-running loop of `specloop train`, until `stop` becomes true.
  Status RunOnline(const std::atomic<bool>& stop, DraftPublisher* publisher);
  // `specloop train --offline`: `epochs` passes over the training records, then
  // EvaluateAndPublish(nullptr, force, result). `progress` (may be empty) is called after
  // every step.
  Status RunOffline(int epochs, bool force,
                    const std::function<void(const OfflineProgress&)>& progress,
                    EvalResult* result);

  // The drafts when they are draft models (else null); candidate_draft() / live_draft() for
  // either kind.
  LlamaModel* candidate() { return candidate_->model(); }
  const LlamaModel* live() const { return live_->model(); }
  TrainableDraft* candidate_draft() { return candidate_.get(); }
  const TrainableDraft* live_draft() const { return live_.get(); }
  // The target, when the draft is a head (else null).
  const LlamaModel* target() const { return target_.get(); }
  uint64_t live_version() const { return live_version_; }
  // The held-out records (evaluation's), read from the buffers; those retention removed
  // are dropped from the set.
  Status LoadHeldOut(std::vector<Record>* records);
  size_t heldout_size() const { return heldout_.size(); }
  // Damaged records the buffers' reads stepped over, by reason (ReplayReader::records_skipped).
  std::map<std::string, uint64_t> records_skipped() const { return reader_->records_skipped(); }
  const CheckpointStore& checkpoints() const { return *store_; }
  int64_t steps() const { return steps_; }
  // A copy of the state (thread-safe).
  TrainerState state() const;

 private:
  Trainer() = default;
  Status LoadDrafts();
  Status ScanNew(std::vector<Record>* train);  // reads records newer than last_scan_us_
  // Reads the held-out records in order and calls `visit` on parts of at most `part_size`,
  // stopping at the first error. Records retention removed are skipped, and dropped from the
  // set when every part was visited.
  // `keys` names each record of a part (one entry per record, unique within the set).
  Status ForEachHeldOutPart(
      size_t part_size,
      const std::function<Status(const std::vector<Record>& part,
                                 const std::vector<std::string>& keys)>& visit);
  std::map<std::string, double> DomainWeights() const;
  // Per domain evaluated: the largest of the live draft's and the candidate's falls below
  // best_alpha_ and the candidate's deficit below the live draft, at the last evaluation (0
  // when none).
  std::map<std::string, double> AlphaGaps() const;

  TrainerOptions options_;
  std::unique_ptr<ReplayReader> reader_;
  std::unique_ptr<CheckpointStore> store_;
  std::unique_ptr<LlamaModel> target_;  // heads only
  std::unique_ptr<TrainableDraft> live_, candidate_;
  DraftTrainingOptions training_;
  std::unique_ptr<AdamW> optimizer_;
  uint64_t live_version_ = 0;
  int64_t steps_ = 0, samples_ = 0;
  int64_t training_records_ = 0;    // records scanned since opening that are not held out
  int64_t samples_since_open_ = 0;  // samples_ counts from the first checkpoint on
  // The held-out set, by reference: evaluation reads the records from the buffers one
  // forward's worth at a time (a copy of the set held ~15 KB per record).
  struct HeldOutRef {
    uint64_t time_us;
    size_t dir;
    std::string key;
    std::string domain;
  };
  std::vector<HeldOutRef> heldout_;
  uint64_t last_scan_us_ = 0;  // records with time_us < this were scanned
  // Copies that outlive retention (keys as ForEachHeldOutPart's): the newest training records
  // and held-out records of each domain.
  std::unique_ptr<DomainReserve> train_reserve_, heldout_reserve_;
  std::map<std::string, double> live_alpha_, best_alpha_, candidate_alpha_;
  // Per held-out record (by key), the values of the best draft served on its domain (see
  // EvalResult::best), and best_alpha_ their mean per domain; updated after each evaluation's
  // decision by UpdateBest(): a domain whose live alpha (over its records now) reaches the
  // best's takes the live draft's values, else records new to the set take the live draft's.
  std::map<std::string, RecordAlpha> best_values_;
  // The domains the last evaluation's gate named "below_best" (their floors are boosted).
  std::set<std::string> below_best_;
  const RecordAlpha& BestValues(const std::string& key, const RecordAlpha& live) const;
  // After a "below_best" refusal: the first blend of the live draft and the candidate (at
  // below_best_blends' lambdas) the gate accepts becomes the candidate and *r its evaluation;
  // when none (or on an error) the candidate, *r's decision and the candidate's values are
  // restored. Either way *r counts the blends tried and their seconds.
  Status TryBlends(EvalResult* r);
  void UpdateBest();
  // Per held-out record (by ForEachHeldOutPart's key), the live draft's values at the last
  // evaluation, and the candidate's: the live draft only changes when a candidate is
  // published, which then brings its values along. So an evaluation runs the live draft on
  // the records that joined the set since the last one only, not on the whole set again.
  std::map<std::string, RecordAlpha> live_values_, candidate_values_;
  std::map<std::string, double> recent_traffic_;  // records per domain, age-weighted
  uint64_t recent_traffic_us_ = 0;                // when recent_traffic_ was last decayed
  Rng rng_;
  mutable std::mutex state_mu_;
  TrainerState state_;  // GUARDED_BY(state_mu_)
  TrainerMetrics metrics_;
  metrics::Registry own_registry_;  // used when no registry is given
};

}  // namespace trainer
}  // namespace specloop
