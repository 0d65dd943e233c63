#include "serve/draft_swapper.h"

#include <iostream>

namespace specloop {

Status DraftSwapper::Start(zmq::context_t* context, const DraftSwapperOptions& options,
                           const LlamaModel& target, ServingMetrics* metrics,
                           std::unique_ptr<DraftSwapper>* out) {
  if (options.staging_dir.empty()) return Status::InvalidArgument("no staging directory");
  std::unique_ptr<DraftSwapper> s(new DraftSwapper(options, target, metrics));
  SPECLOOP_RETURN_IF_ERROR(DraftFetcher::Open(context, options.fetcher, &s->fetcher_));
  if (!options.initial_draft_dir.empty()) s->dirs_[0] = options.initial_draft_dir;
  s->thread_ = std::thread([p = s.get()] { p->Run(); });
  *out = std::move(s);
  return Status::OK();
}

DraftSwapper::~DraftSwapper() { Stop(); }

void DraftSwapper::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void DraftSwapper::Run() {
  DraftAnnouncement a;
  if (fetcher_->Latest(&a).ok()) Consider(a);  // a worker started after the trainer published
  while (!stop_) {
    Status s = fetcher_->WaitAnnouncement(options_.poll_ms, &a);
    if (s.ok()) {
      Consider(a);
    } else if (s.IsCorruption()) {
      metrics_->ObserveSwapFailure("announcement");
      std::cerr << "specloop serve: bad draft announcement: " << s.ToString() << "\n";
    }
    MaybeRollBack();
  }
}

void DraftSwapper::Refuse(uint64_t version, const std::string& reason, const Status& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    refused_.insert(version);
  }
  metrics_->ObserveSwapFailure(reason);
  std::cerr << "specloop serve: draft v" << version << " refused (" << reason
            << "): " << why.ToString() << "; the current draft keeps serving\n";
}

void DraftSwapper::Consider(const DraftAnnouncement& a) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (a.version <= newest_ || refused_.count(a.version)) return;
  }
  std::cerr << "specloop serve: fetching draft v" << a.version << " (" << a.bytes << " bytes)\n";
  std::string dir;
  Status s = fetcher_->Fetch(a, options_.staging_dir, &dir);
  if (!s.ok()) {
    if (s.IsCorruption()) {
      Refuse(a.version, "transfer", s);
    } else {  // a timeout or file error: the next announcement of it retries
      metrics_->ObserveSwapFailure("fetch");
      std::cerr << "specloop serve: fetching draft v" << a.version << ": " << s.ToString() << "\n";
    }
    return;
  }
  if (!IsEagle3Dir(dir)) {  // a draft model: its architecture and vocabulary first
    ModelConfig config;
    s = ModelConfig::FromDir(dir, &config);
    if (s.ok()) s = CheckDraftCompatible(target_.config(), config);
    if (!s.ok()) return Refuse(a.version, "incompatible", s);
  }
  Draft draft;
  s = LoadDraft(dir, target_, options_.load, &draft);
  if (!s.ok()) return Refuse(a.version, "load", s);

  std::lock_guard<std::mutex> lock(mu_);
  dirs_[a.version] = dir;
  newest_ = a.version;
  ready_ = DraftCandidate{std::move(draft), a.version};  // replaces an older, untaken one
}

bool DraftSwapper::TakeReady(DraftCandidate* out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!ready_.draft) return false;
  *out = std::move(ready_);
  ready_ = DraftCandidate();
  return true;
}

void DraftSwapper::OnInstalled(uint64_t version, const Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!status.ok()) {  // the scheduler refused it (and counted it)
    refused_.insert(version);
    return;
  }
  previous_ = installed_.load();
  has_previous_ = true;
  installed_ = version;
  live_[version].clear();  // judge a (re)installed version on its own traffic from now on
  // Only the installed version, its predecessor and the newest fetched one are ever read again
  // (MaybeRollBack, a pending candidate): the others' state would grow with every publish.
  auto stale = [&](uint64_t v) { return v != version && v != previous_ && v != newest_; };
  for (auto it = live_.begin(); it != live_.end();) it = stale(it->first) ? live_.erase(it) : ++it;
  for (auto it = dirs_.begin(); it != dirs_.end();) it = stale(it->first) ? dirs_.erase(it) : ++it;
}

size_t DraftSwapper::versions_kept() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::set<uint64_t> versions;
  for (const auto& [v, domains] : live_) versions.insert(v);
  for (const auto& [v, dir] : dirs_) versions.insert(v);
  return versions.size();
}

void DraftSwapper::ObserveAcceptance(uint64_t version, const std::string& domain, int drafted,
                                     int accepted) {
  std::lock_guard<std::mutex> lock(mu_);
  Live& l = live_[version][domain];
  l.alpha.Observe(drafted, accepted);
  l.steps++;
}

void DraftSwapper::MaybeRollBack() {
  uint64_t current, back;
  std::string dir;
  {
    std::lock_guard<std::mutex> lock(mu_);
    current = installed_;
    back = previous_;
    if (!has_previous_ || ready_.draft || refused_.count(current) || refused_.count(back)) return;
    // Step-weighted alphas of both versions over the domains both have enough steps on.
    double now_alpha = 0, before_alpha = 0, weight = 0;
    const auto& before_domains = live_[back];
    for (const auto& [domain, now] : live_[current]) {
      auto it = before_domains.find(domain);
      if (it == before_domains.end() || now.steps < options_.rollback_min_steps ||
          it->second.steps < options_.rollback_min_steps) {
        continue;
      }
      now_alpha += now.steps * now.alpha.alpha();
      before_alpha += now.steps * it->second.alpha.alpha();
      weight += now.steps;
    }
    if (weight == 0) return;
    now_alpha /= weight;
    before_alpha /= weight;
    if (now_alpha >= before_alpha - options_.rollback_margin) return;
    auto it = dirs_.find(back);
    if (it == dirs_.end()) return;
    dir = it->second;
    std::cerr << "specloop serve: draft v" << current << " live alpha " << now_alpha
              << " is below v" << back << "'s " << before_alpha
              << " on the same domains: rolling back to v" << back << "\n";
    refused_.insert(current);
  }
  Draft draft;
  Status s = LoadDraft(dir, target_, options_.load, &draft);
  if (!s.ok()) {
    std::cerr << "specloop serve: rollback to v" << back << " failed: " << s.ToString() << "\n";
    return;
  }
  metrics_->ObserveRollback();
  std::lock_guard<std::mutex> lock(mu_);
  ready_ = DraftCandidate{std::move(draft), back};
}

}  // namespace specloop
