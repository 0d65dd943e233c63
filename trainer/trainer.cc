#include "trainer/trainer.h"

#include <ATen/core/grad_mode.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <set>
#include <thread>

#include "buffer/record_codec.h"
#include "common/base/clock.h"
#include "common/channel/draft_channel.h"
#include "common/model/eagle3_config.h"
#include "trainer/training_examples.h"
#include "trainer/weight_blend.h"

namespace specloop {
namespace trainer {

namespace {

void Log(const std::string& line) { std::cerr << "specloop train: " << line << std::endl; }

}  // namespace

Trainer::~Trainer() = default;

Status Trainer::Open(const TrainerOptions& options, metrics::Registry* registry,
                     std::unique_ptr<Trainer>* out) {
  std::unique_ptr<Trainer> t(new Trainer());
  t->options_ = options;
  t->rng_.Seed(options.seed);
  t->train_reserve_ = std::make_unique<DomainReserve>(options.reserve_records_per_domain);
  t->heldout_reserve_ = std::make_unique<DomainReserve>(
      std::min(options.heldout_floor_per_domain, options.max_heldout_per_domain));
  t->training_.objective = options.objective;
  t->training_.context_gradient = options.context_gradient;
  t->training_.unroll_steps = options.unroll_steps;
  t->training_.step_decay = options.step_decay;
  SPECLOOP_RETURN_IF_ERROR(t->metrics_.Register(registry ? registry : &t->own_registry_));
  SPECLOOP_RETURN_IF_ERROR(
      CheckpointStore::Open(options.checkpoint_dir, options.keep_last, &t->store_));
  SPECLOOP_RETURN_IF_ERROR(t->LoadDrafts());
  t->state_.objective = options.objective.ToString();
  t->state_.draft_kind = t->candidate_->kind();
  t->state_.steps = t->steps_;
  t->state_.live_version = t->live_version_;
  ReaderOptions ro;
  SPECLOOP_RETURN_IF_ERROR(
      ReplayReader::Open(ro, options.buffer_dirs, &t->reader_).Annotate("opening buffers"));
  SPECLOOP_RETURN_IF_ERROR(t->CatchUp());
  *out = std::move(t);
  return Status::OK();
}

Status Trainer::LoadDrafts() {
  const uint64_t v = store_->Latest();
  const std::string dir = v ? store_->Dir(v) : options_.draft_dir;
  if (v) {
    CheckpointMeta m;
    SPECLOOP_RETURN_IF_ERROR(store_->ReadMeta(v, &m));
    steps_ = m.steps;
    samples_ = m.samples;
    Log("resuming from " + dir);
  }
  const bool head = IsEagle3Dir(dir);
  if (v && !options_.draft_dir.empty() && IsEagle3Dir(options_.draft_dir) != head) {
    return Status::InvalidArgument(
        "checkpoint " + dir + " is " + (head ? "an EAGLE-3 head" : "a draft model") + ", --draft " +
        options_.draft_dir + " " + (head ? "a draft model" : "an EAGLE-3 head"));
  }
  if (head && !target_) {
    if (options_.target_dir.empty()) {
      return Status::InvalidArgument(dir + " is an EAGLE-3 head: training it needs its target "
                                           "(--target DIR)");
    }
    LoadOptions lo;
    lo.device = options_.device;
    lo.dtype = "float32";
    SPECLOOP_RETURN_IF_ERROR(
        LlamaModel::Load(options_.target_dir, lo, &target_).Annotate("loading the target"));
  }
  SPECLOOP_RETURN_IF_ERROR(TrainableDraft::Load(dir, target_.get(), options_.device, &live_));
  SPECLOOP_RETURN_IF_ERROR(TrainableDraft::Load(dir, target_.get(), options_.device, &candidate_));
  if (v && !head && !options_.draft_dir.empty()) {
    ModelConfig initial;
    if (ModelConfig::FromDir(options_.draft_dir, &initial).ok()) {
      SPECLOOP_RETURN_IF_ERROR(CheckDraftCompatible(initial, candidate_->model()->config())
                                   .Annotate("checkpoint " + dir));
    }
  }
  std::vector<at::Tensor> params = candidate_->Parameters();
  for (at::Tensor& p : params) p.requires_grad_(true);
  optimizer_ = std::make_unique<AdamW>(params, options_.adamw);
  live_version_ = v;
  metrics_.draft_version->Set(static_cast<double>(v));
  return Status::OK();
}

Status Trainer::ForEachHeldOutPart(
    size_t part_size,
    const std::function<Status(const std::vector<Record>&, const std::vector<std::string>&)>&
        visit) {
  part_size = std::max<size_t>(1, part_size);
  std::vector<HeldOutRef> kept;
  std::vector<Record> part;
  std::vector<std::string> keys;
  part.reserve(std::min(part_size, heldout_.size()));
  for (const HeldOutRef& ref : heldout_) {
    Record r;
    std::string key = std::to_string(ref.dir) + "/" + ref.key;
    Status s = reader_->Read(ref.dir, ref.key, &r);
    // Retention removed it: kept when it is in the domain's held-out floor, else no longer
    // held out.
    if (s.IsNotFound()) s = heldout_reserve_->Get(key, &r);
    if (s.IsNotFound()) continue;
    SPECLOOP_RETURN_IF_ERROR(s);
    part.push_back(std::move(r));
    keys.push_back(std::move(key));
    kept.push_back(ref);
    if (part.size() == part_size) {
      SPECLOOP_RETURN_IF_ERROR(visit(part, keys));
      part.clear();
      keys.clear();
    }
  }
  if (!part.empty()) SPECLOOP_RETURN_IF_ERROR(visit(part, keys));
  heldout_ = std::move(kept);
  return Status::OK();
}

Status Trainer::LoadHeldOut(std::vector<Record>* records) {
  records->clear();
  return ForEachHeldOutPart(heldout_.size(), [&](const std::vector<Record>& part,
                                                  const std::vector<std::string>&) {
    records->insert(records->end(), part.begin(), part.end());
    return Status::OK();
  });
}

Status Trainer::ScanNew(std::vector<Record>* train) {
  uint64_t newest = last_scan_us_;
  const size_t before = heldout_.size();
  ScanOptions so;
  so.since_us = last_scan_us_;
  // Age-weighted traffic per domain: decay what was counted, add each new record at
  // 2^(-age / half-life).
  const double now_us = NowMicros();
  const double half_life_us = std::max(1.0, options_.traffic_half_life_seconds * 1e6);
  const double decay =
      recent_traffic_us_ == 0 ? 1.0 : std::exp2(-(now_us - recent_traffic_us_) / half_life_us);
  for (auto& [d, n] : recent_traffic_) n *= decay;
  recent_traffic_us_ = static_cast<uint64_t>(now_us);
  // The stored bytes are decoded once here and kept as they are in the reserves.
  Record r;
  Status s = reader_->ScanEncoded(so, [&](size_t dir, std::string_view key,
                                          std::string_view data) {
    if (!DecodeRecord(data, &r).ok()) {
      // Counted in records_skipped(); cannot fail for a key ScanEncoded() passed.
      (void)reader_->CountUndecodableRecord(dir, key);
      return true;
    }
    newest = std::max(newest, r.time_us + 1);
    recent_traffic_[r.domain] +=
        std::exp2(-std::max(0.0, now_us - static_cast<double>(r.time_us)) / half_life_us);
    const std::string reserve_key = std::to_string(dir) + "/" + std::string(key);
    if (IsHeldOut(r, options_.heldout_fraction)) {
      heldout_.push_back(HeldOutRef{r.time_us, dir, std::string(key), r.domain});
      heldout_reserve_->AddEncoded(reserve_key, r.domain, r.time_us, data);
    } else {
      ++training_records_;
      train_reserve_->AddEncoded(reserve_key, r.domain, r.time_us, data);
      if (train) train->push_back(r);
    }
    return true;
  });
  SPECLOOP_RETURN_IF_ERROR(s);
  last_scan_us_ = newest;
  if (heldout_.size() != before) {
    // Keep the newest max_heldout_per_domain records of each domain.
    std::stable_sort(
        heldout_.begin(), heldout_.end(),
        [](const HeldOutRef& a, const HeldOutRef& b) { return a.time_us > b.time_us; });
    std::map<std::string, size_t> kept;
    std::vector<HeldOutRef> keep;
    for (HeldOutRef& r : heldout_) {
      if (kept[r.domain]++ < options_.max_heldout_per_domain) keep.push_back(std::move(r));
    }
    heldout_ = std::move(keep);
  }
  return Status::OK();
}

Status Trainer::CatchUp() {
  SPECLOOP_RETURN_IF_ERROR(reader_->CatchUp());
  SPECLOOP_RETURN_IF_ERROR(ScanNew(nullptr));
  for (const auto& [d, n] : reader_->DomainCounts()) {
    metrics_.buffer_records->Add({{"domain", d}}).Set(static_cast<double>(n));
  }
  metrics_.heldout_records->Set(static_cast<double>(heldout_.size()));
  for (const auto& [reason, n] : reader_->records_skipped()) {  // damaged records stepped over
    metrics::Counter& c = metrics_.records_skipped->Add({{"reason", reason}});
    c.Increment(static_cast<double>(n) - c.Value());
  }
  if (last_scan_us_ > 0) {
    metrics_.buffer_lag->Set(std::max(0.0, (NowMicros() - static_cast<double>(last_scan_us_)) / 1e6));
  }
  return Status::OK();
}

Status Trainer::TrainStep(const std::vector<const Record*>& batch, double* loss_out) {
  *loss_out = 0;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> domains;  // one per position trained
  optimizer_->ZeroGrad();
  SPECLOOP_RETURN_IF_ERROR(candidate_->Backward(batch, training_, loss_out, &domains));
  if (domains.empty()) return Status::OK();
  try {
    const double warm = options_.warmup_steps > 0
                            ? std::min(1.0, double(steps_ + 1) / options_.warmup_steps)
                            : 1.0;
    optimizer_->Step(warm);
  } catch (const c10::Error& e) {
    return Status::IOError(std::string("training step: ") + e.what_without_backtrace());
  }
  ++steps_;
  samples_ += static_cast<int64_t>(batch.size());
  samples_since_open_ += static_cast<int64_t>(batch.size());
  metrics_.steps->Increment();
  metrics_.loss->Add({{"objective", options_.objective.ToString()}}).Set(*loss_out);
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    state_.steps = steps_;
    state_.loss = *loss_out;
  }
  for (const Record* r : batch) metrics_.samples->Add({{"domain", r->domain}}).Increment();
  for (const std::string& d : domains) metrics_.positions->Add({{"domain", d}}).Increment();
  metrics_.step_seconds->Observe(SecondsSince(t0));
  return Status::OK();
}

Status Trainer::Evaluate(EvalResult* r) {
  *r = EvalResult();
  // The held-out set is read in parts of one forward each: what evaluation keeps resident
  // does not grow with the set.
  const auto t0 = std::chrono::steady_clock::now();
  AlphaAccumulator live, candidate, best;
  std::map<std::string, RecordAlpha> live_values, candidate_values;
  const int batch = options_.eval_batch_records;
  SPECLOOP_RETURN_IF_ERROR(ForEachHeldOutPart(
      static_cast<size_t>(std::max(1, batch)),
      [&](const std::vector<Record>& part, const std::vector<std::string>& keys) {
        // The live draft on the records it has no values for yet.
        std::vector<Record> fresh;
        for (size_t i = 0; i < part.size(); ++i) {
          if (!live_values_.count(keys[i])) fresh.push_back(part[i]);
        }
        std::vector<RecordAlpha> fresh_values, values;
        SPECLOOP_RETURN_IF_ERROR(live_->Estimate(fresh, batch, &fresh_values));
        SPECLOOP_RETURN_IF_ERROR(candidate_->Estimate(part, batch, &values));
        metrics_.evaluated_records->Add({{"model", "live"}}).Increment(fresh.size());
        metrics_.evaluated_records->Add({{"model", "candidate"}}).Increment(part.size());
        size_t next_fresh = 0;
        for (size_t i = 0; i < part.size(); ++i) {  // in part order: paired values
          auto kept = live_values_.find(keys[i]);
          RecordAlpha& l = live_values[keys[i]];
          l = kept != live_values_.end() ? kept->second : std::move(fresh_values[next_fresh++]);
          live.Add(l);
          best.Add(BestValues(keys[i], l));
          candidate.Add(values[i]);
          candidate_values[keys[i]] = std::move(values[i]);
        }
        return Status::OK();
      }));
  live_values_ = std::move(live_values);  // records no longer held out are dropped
  candidate_values_ = std::move(candidate_values);
  r->seconds = SecondsSince(t0);
  metrics_.evaluation_seconds->Observe(r->seconds);
  r->live = live.Estimate();
  r->best = best.Estimate();
  r->candidate = candidate.Estimate();
  // While nothing is served (no checkpoint and an unserved initial draft) the candidate is
  // judged against plain decoding: there is no live draft to beat.
  if (!options_.initial_draft_served && live_version_ == 0) {
    GateOptions first = options_.gate;
    if (first.draft_cost < 0) {
      first.draft_cost =
          candidate_->head() != nullptr ? kHeadDraftCost : kModelDraftCost;
    }
    r->decision = DecideFirstDraft(first, r->candidate, recent_traffic_);
  } else {
    r->decision = DecideGate(options_.gate, r->live, r->candidate, recent_traffic_, &r->best);
  }
  below_best_ = std::set<std::string>(r->decision.below_best.begin(),
                                      r->decision.below_best.end());
  metrics_.evaluations->Increment();
  auto set = [&](const AlphaEstimate& e, const char* model) {
    for (const auto& [d, a] : e.domains) {
      metrics_.alpha->Add({{"domain", d}, {"model", model}}).Set(a.logged);
    }
    metrics_.alpha->Add({{"domain", "all"}, {"model", model}}).Set(e.overall.logged);
  };
  set(r->live, "live");
  set(r->candidate, "candidate");
  live_alpha_ = r->live.LoggedByDomain();
  candidate_alpha_ = r->candidate.LoggedByDomain();
  return Status::OK();
}

const RecordAlpha& Trainer::BestValues(const std::string& key, const RecordAlpha& live) const {
  const auto b = best_values_.find(key);
  return b != best_values_.end() && b->second.logged.size() == live.logged.size() ? b->second
                                                                                  : live;
}

void Trainer::UpdateBest() {
  // Nothing served yet (plain decoding): no draft's values to keep.
  if (!options_.initial_draft_served && live_version_ == 0) return;
  // Per domain, the live draft's sum against the best's over the same positions.
  std::map<std::string, std::pair<double, double>> sums;  // domain -> (live, best)
  std::map<std::string, int64_t> positions;
  for (const auto& [key, live] : live_values_) {
    const RecordAlpha& best = BestValues(key, live);
    auto& [l, b] = sums[live.domain];
    for (size_t i = 0; i < live.logged.size(); ++i) {
      l += live.logged[i];
      b += best.logged[i];
    }
    positions[live.domain] += static_cast<int64_t>(live.logged.size());
  }
  std::map<std::string, RecordAlpha> next;
  for (const auto& [key, live] : live_values_) {
    const auto& [l, b] = sums[live.domain];
    next[key] = l >= b ? live : BestValues(key, live);
  }
  best_values_ = std::move(next);  // records no longer held out are dropped
  best_alpha_.clear();
  for (const auto& [d, lb] : sums) {
    if (positions[d] > 0) best_alpha_[d] = std::max(lb.first, lb.second) / positions[d];
  }
}

namespace {
std::string EvaluationTime(const EvalResult& r) {
  char text[48];
  std::snprintf(text, sizeof(text), " (evaluated in %.2f s)", r.seconds);
  return text;
}
}  // namespace

TrainerState Trainer::state() const {
  std::lock_guard<std::mutex> lock(state_mu_);
  return state_;
}

Status Trainer::TryBlends(EvalResult* r) {
  if (options_.below_best_blends.empty() || r->decision.reason != "below_best") return Status::OK();
  std::vector<at::Tensor> weights = candidate_->Parameters();
  const std::vector<at::Tensor> live = live_->Parameters();
  std::vector<at::Tensor> refused;  // the candidate's own weights, restored when no blend passes
  {
    at::NoGradGuard no_grad;
    for (const at::Tensor& w : weights) refused.push_back(w.detach().clone());
  }
  const EvalResult first = *r;
  std::map<std::string, RecordAlpha> first_values = candidate_values_;
  const std::map<std::string, double> first_alpha = candidate_alpha_;
  const std::set<std::string> first_below = below_best_;
  double seconds = r->seconds;
  int tried = 0;
  std::string log;
  int chosen = -1;
  Status s = FirstAcceptedBlend(
      options_.below_best_blends,
      [&](double lambda, bool* accepted) {
        SPECLOOP_RETURN_IF_ERROR(BlendWeights(live, refused, lambda, &weights));
        ++tried;
        metrics_.blends->Add({{"outcome", "tried"}}).Increment();
        SPECLOOP_RETURN_IF_ERROR(Evaluate(r));  // same live values and best (no UpdateBest)
        seconds += r->seconds;
        char head[96];
        std::snprintf(head, sizeof(head), "%sblend %.3g: %s", log.empty() ? "" : "; ", lambda,
                      r->decision.reason.c_str());
        log += head;
        for (const std::string& d : r->decision.below_best) {  // the domains it still lost
          const auto a = r->candidate.domains.find(d);
          if (a == r->candidate.domains.end()) continue;
          std::snprintf(head, sizeof(head), ", %s %.4f", d.c_str(), a->second.logged);
          log += head;
        }
        *accepted = r->decision.publish;
        return Status::OK();
      },
      &chosen);
  if (s.ok() && chosen >= 0) {
    r->blends_tried = tried;
    r->blend_lambda = options_.below_best_blends[chosen];
    r->seconds = seconds;
    r->decision.detail = log + " (the candidate: " + first.decision.detail + "); " +
                         r->decision.detail;
    metrics_.blends->Add({{"outcome", "published"}}).Increment();
    return Status::OK();
  }
  // None accepted (or an error): the candidate as it was, and its refusal.
  {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < weights.size(); ++i) weights[i].detach().copy_(refused[i]);
  }
  *r = first;
  r->blends_tried = tried;
  r->seconds = seconds;
  if (tried > 0) r->decision.detail += "; " + log;
  candidate_values_ = std::move(first_values);
  candidate_alpha_ = first_alpha;
  below_best_ = first_below;
  for (const auto& [d, a] : r->candidate.domains) {
    metrics_.alpha->Add({{"domain", d}, {"model", "candidate"}}).Set(a.logged);
  }
  metrics_.alpha->Add({{"domain", "all"}, {"model", "candidate"}}).Set(r->candidate.overall.logged);
  return s.Annotate("evaluating blends");
}

Status Trainer::EvaluateAndPublish(DraftPublisher* publisher, bool force, EvalResult* r) {
  SPECLOOP_RETURN_IF_ERROR(Evaluate(r));
  if (!force) SPECLOOP_RETURN_IF_ERROR(TryBlends(r));
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    state_.evaluations++;
    state_.evaluated_unix = NowMicros() / 1e6;
    state_.evaluated_step = steps_;
    state_.published = false;
    state_.reason = r->decision.reason;
    state_.detail = r->decision.detail;
    state_.live_alpha = r->live.overall.logged;
    state_.candidate_alpha = r->candidate.overall.logged;
    state_.published_version = 0;
  }
  if (!r->decision.publish && !force) {
    metrics_.rejected->Add({{"reason", r->decision.reason}}).Increment();
    Log("candidate not published (" + r->decision.reason + "): " + r->decision.detail +
        EvaluationTime(*r));
    UpdateBest();
    return Status::OK();
  }
  CheckpointMeta m;
  m.parent = live_version_;
  m.objective = options_.objective.ToString();
  m.steps = steps_;
  m.samples = samples_;
  m.alpha_before = r->live.LoggedByDomain();
  m.alpha_after = r->candidate.LoggedByDomain();
  Status s;
  {
    at::NoGradGuard no_grad;
    s = store_->Save([&](const std::string& dir) { return candidate_->Write(dir); }, &m);
  }
  if (!s.ok()) {
    metrics_.rejected->Add({{"reason", "save_error"}}).Increment();
    return s.Annotate("saving checkpoint");
  }
  r->version = m.version;
  SPECLOOP_RETURN_IF_ERROR(
      TrainableDraft::Load(store_->Dir(m.version), target_.get(), options_.device, &live_));
  live_version_ = m.version;
  live_values_ = std::move(candidate_values_);  // the published weights, saved and reloaded
  candidate_values_.clear();
  live_alpha_ = candidate_alpha_;
  UpdateBest();
  metrics_.published->Increment();
  metrics_.draft_version->Set(static_cast<double>(m.version));
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    state_.published = true;
    state_.published_version = m.version;
    state_.live_version = m.version;
  }
  Log("published " + VersionDirName(m.version) + (r->decision.publish ? "" : " (forced)") + ": " +
      r->decision.detail + EvaluationTime(*r));
  if (publisher) SPECLOOP_RETURN_IF_ERROR(publisher->Publish(m.version));
  return Status::OK();
}

std::map<std::string, double> Trainer::AlphaGaps() const {
  std::map<std::string, double> gaps;
  for (const auto& [d, live] : live_alpha_) {
    // How far the live draft or the candidate lies below the best draft served on d (what
    // makes the gate refuse a candidate for d: "below_best"), or the candidate below the live
    // draft, whichever is largest.
    double gap = 0;
    auto best = best_alpha_.find(d);
    auto candidate = candidate_alpha_.find(d);
    if (best != best_alpha_.end()) gap = std::max(gap, best->second - live);
    if (candidate != candidate_alpha_.end()) {
      gap = std::max(gap, live - candidate->second);
      if (best != best_alpha_.end()) gap = std::max(gap, best->second - candidate->second);
    }
    gaps[d] = gap;
  }
  return gaps;
}

std::map<std::string, double> Trainer::DomainWeights() const {
  std::map<std::string, double> w;
  double total = 0;
  for (const auto& [d, n] : recent_traffic_) total += n;
  const std::map<std::string, double> gaps = AlphaGaps();
  for (const auto& [d, n] : recent_traffic_) {
    double x = std::max(total > 0 ? n / total : 0.0, options_.min_domain_share);
    auto gap = gaps.find(d);
    x *= 1 + options_.alpha_gap_boost * (gap != gaps.end() ? gap->second : 0.0);
    w[d] = x;
  }
  return w;
}

Status Trainer::SampleBatch(std::vector<Record>* batch) {
  batch->clear();
  const size_t size = static_cast<size_t>(std::max(1, options_.batch_records));
  // Every domain seen: in the buffers, or in the reserve after retention emptied it there.
  std::set<std::string> seen;
  for (const auto& [d, n] : reader_->DomainCounts()) {
    if (n > 0) seen.insert(d);
  }
  for (const std::string& d : train_reserve_->Domains()) seen.insert(d);
  const std::vector<std::string> domains(seen.begin(), seen.end());
  // Each domain's floor grows with its alpha gap (as its weight does: a domain being forgotten
  // is replayed more); all floors together take at most half the batch, scaled down to fit,
  // and a fractional share is drawn (a share of 0.4 is one record in 40% of the batches).
  const std::map<std::string, double> gaps = AlphaGaps();
  std::vector<double> want(domains.size(), 0);
  double total = 0;
  for (size_t i = 0; i < domains.size(); ++i) {
    const auto g = gaps.find(domains[i]);
    want[i] = std::max(0, options_.replay_floor_records) *
              (1 + options_.alpha_gap_boost * (g != gaps.end() ? g->second : 0.0)) *
              (below_best_.count(domains[i]) ? std::max(1.0, options_.below_best_floor_boost)
                                             : 1.0);
    total += want[i];
  }
  const double cap = static_cast<double>(size / 2);
  std::vector<std::string> floor_domains;
  for (size_t i = 0; i < domains.size(); ++i) {
    const double n = total > cap ? want[i] * cap / total : want[i];
    const double whole = std::floor(n + 1e-9);
    size_t count = static_cast<size_t>(whole);
    if (n - whole > 1e-9 && rng_.Uniform() < n - whole) ++count;
    floor_domains.insert(floor_domains.end(), count, domains[i]);
  }
  if (floor_domains.size() > size / 2) floor_domains.resize(size / 2);
  for (const std::string& d : floor_domains) {
    SampleOptions so;
    so.batch_size = 1;
    so.domain_weights = {{d, 1.0}};
    so.default_domain_weight = 0;
    so.half_life_seconds = options_.half_life_seconds;
    Status s;
    std::vector<Record> one;
    // A held-out record is redrawn (a few times): the slot is for training.
    for (int tries = 0; tries < 4; ++tries) {
      s = reader_->Sample(so, &rng_, &one);
      if (!s.ok() || !IsHeldOut(one[0], options_.heldout_fraction)) break;
    }
    if (s.IsNotFound()) {  // retention removed the domain from the buffers
      one.assign(1, Record());
      s = train_reserve_->Sample(d, &rng_, &one[0]);
    }
    if (s.IsNotFound()) continue;
    SPECLOOP_RETURN_IF_ERROR(s);
    batch->push_back(std::move(one[0]));
  }
  SampleOptions so;
  so.batch_size = size - batch->size();
  so.domain_weights = DomainWeights();
  so.half_life_seconds = options_.half_life_seconds;
  std::vector<Record> rest;
  Status s = reader_->Sample(so, &rng_, &rest);
  if (s.IsNotFound() && !batch->empty()) return Status::OK();
  SPECLOOP_RETURN_IF_ERROR(s);
  for (Record& r : rest) batch->push_back(std::move(r));
  return Status::OK();
}

Status Trainer::RunOnline(const std::atomic<bool>& stop, DraftPublisher* publisher) {
  using Clock = std::chrono::steady_clock;
  const auto interval = std::chrono::milliseconds(options_.catch_up_interval_ms);
  auto last_catch_up = Clock::now();
  EvalCadence cadence(options_.eval_cadence);
  const auto set_activity = [&](const char* activity) {
    std::lock_guard<std::mutex> lock(state_mu_);
    state_.activity = activity;
  };
  const auto wait_for_traffic = [&] {  // until the next catch-up, which then runs at once
    set_activity("waiting for traffic");
    for (int i = 0; i < 10 && !stop.load(); ++i) std::this_thread::sleep_for(interval / 10);
    last_catch_up = Clock::now() - interval;
  };
  while (!stop.load()) {
    if (Clock::now() - last_catch_up >= interval) {
      Status s = CatchUp();
      if (!s.ok()) Log("catch-up failed: " + s.ToString());
      last_catch_up = Clock::now();
    }
    if (options_.max_replay > 0 &&
        static_cast<double>(samples_since_open_) >= options_.max_replay * training_records_) {
      wait_for_traffic();
      continue;
    }
    std::vector<Record> batch;
    Status s = SampleBatch(&batch);
    if (s.IsNotFound()) {  // no records yet
      wait_for_traffic();
      continue;
    }
    SPECLOOP_RETURN_IF_ERROR(s);
    set_activity("training");
    std::vector<const Record*> ptrs;
    for (const Record& r : batch) {
      if (!IsHeldOut(r, options_.heldout_fraction)) ptrs.push_back(&r);
    }
    double loss = 0;
    const auto t0 = Clock::now();
    SPECLOOP_RETURN_IF_ERROR(TrainStep(ptrs, &loss));
    const double step_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    const bool evaluate = options_.eval_every_steps > 0
                              ? steps_ % options_.eval_every_steps == 0
                              : cadence.AfterStep(step_seconds, recent_traffic_);
    if (evaluate && loss != 0) {
      EvalResult r;
      Status es = EvaluateAndPublish(publisher, /*force=*/false, &r);
      if (!es.ok()) Log("evaluation failed: " + es.ToString());
      using Outcome = EvalCadence::Outcome;
      cadence.Evaluated(r.seconds, !es.ok()                      ? Outcome::kRefused
                                   : r.decision.publish           ? Outcome::kPublished
                                   : r.decision.reason == "no_data" ? Outcome::kNoData
                                   : r.decision.reason == "below_best" ? Outcome::kBelowBest
                                                                       : Outcome::kRefused);
    }
  }
  return Status::OK();
}

Status Trainer::RunOffline(int epochs, bool force,
                           const std::function<void(const OfflineProgress&)>& progress,
                           EvalResult* result) {
  std::vector<Record> train;
  ScanOptions so;
  SPECLOOP_RETURN_IF_ERROR(reader_->Scan(so, [&](size_t, const Record& r) {
    if (!IsHeldOut(r, options_.heldout_fraction)) train.push_back(r);
    return true;
  }));
  const size_t B = static_cast<size_t>(std::max(1, options_.batch_records));
  OfflineProgress p;
  p.epochs = epochs;
  p.steps = static_cast<int64_t>(epochs) * static_cast<int64_t>((train.size() + B - 1) / B);
  std::vector<size_t> order(train.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  for (int e = 0; e < epochs; ++e) {
    for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng_.Next() % i]);
    for (size_t b = 0; b < order.size(); b += B) {
      std::vector<const Record*> batch;
      for (size_t i = b; i < std::min(order.size(), b + B); ++i) batch.push_back(&train[order[i]]);
      SPECLOOP_RETURN_IF_ERROR(TrainStep(batch, &p.loss));
      p.epoch = e + 1;
      ++p.step;
      if (progress) progress(p);
    }
  }
  return EvaluateAndPublish(nullptr, force, result);
}

}  // namespace trainer
}  // namespace specloop
