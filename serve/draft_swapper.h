// DraftSwapper: the worker's side of draft hot-swap (DESIGN.md section 7), behind the
// scheduler's DraftSwapHook. A background thread asks the trainer for its latest version at
// start (a worker started later catches up), then follows the announcements: it fetches each
// newer version in chunks (size and sha256 checked by DraftFetcher), checks architecture and
// vocabulary against the target, and loads it (a model or an EAGLE-3 head) into a standby
// Draft, all off the decoding
// thread; the scheduler takes it between iterations. A refused checkpoint is counted by reason
// (`announcement`, `transfer`, `incompatible`, `load`) and never retried; the old draft keeps
// serving.
//
// Rollback: the scheduler reports live acceptance per version and domain
// (ObserveAcceptance). Versions are compared on the domains where both have at least
// `rollback_min_steps` steps (alpha differs between domains far more than between versions,
// so a version that went live as traffic shifted to a harder domain is not judged worse for
// it): when the current version's alpha, averaged over those domains weighted by its steps,
// is below the predecessor's by more than `rollback_margin`, the predecessor is reinstalled
// (counted, and said on stderr); the rolled-back version is never installed again.
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "common/channel/draft_channel.h"
#include "common/engine/draft.h"
#include "common/spec/acceptance_estimator.h"
#include "serve/draft_swap_hook.h"
#include "serve/serving_metrics.h"

namespace zmq {
class context_t;
}

namespace specloop {

struct DraftSwapperOptions {
  FetcherOptions fetcher;
  // Where fetched checkpoints are unpacked (vNNNNNN subdirectories). Required.
  std::string staging_dir;
  // Device and dtype of loaded drafts: those of the target. Default: cpu, auto.
  LoadOptions load;
  // The directory of version 0 (the --draft served at start), for rollback to it.
  std::string initial_draft_dir;
  // How long one wait for an announcement lasts before the thread checks for rollback and
  // stop. Default: 200.
  int poll_ms = 200;
  // Steps (verifications that drafted) each version needs before they are compared.
  // Default: 200.
  int rollback_min_steps = 200;
  // How much lower (absolute, per-token acceptance) the new version's alpha must be to roll
  // back. Default: 0.1.
  double rollback_margin = 0.1;
};

class DraftSwapper : public DraftSwapHook {
 public:
  // Connects to the trainer and starts the thread. `context`, `metrics` must outlive it.
  // `target` (the drafts' target: heads read its embedding) must outlive it too.
  static Status Start(zmq::context_t* context, const DraftSwapperOptions& options,
                      const LlamaModel& target, ServingMetrics* metrics,
                      std::unique_ptr<DraftSwapper>* out);
  ~DraftSwapper() override;
  void Stop();

  // Versions whose live acceptance or checkpoint directory the swapper keeps: at most the
  // installed one, its predecessor (what a rollback compares with and reinstalls) and a fetched
  // one not yet installed; older versions' state goes when a version is installed.
  size_t versions_kept() const;

  bool TakeReady(DraftCandidate* out) override;
  void OnInstalled(uint64_t version, const Status& status) override;
  void ObserveAcceptance(uint64_t version, const std::string& domain, int drafted,
                         int accepted) override;

 private:
  DraftSwapper(const DraftSwapperOptions& options, const LlamaModel& target,
               ServingMetrics* metrics)
      : options_(options), target_(target), metrics_(metrics) {}
  void Run();
  // Fetches, checks and loads `a`; on success it becomes the ready candidate.
  void Consider(const DraftAnnouncement& a);
  // Compares the installed version's live alpha with its predecessor's.
  void MaybeRollBack();
  void Refuse(uint64_t version, const std::string& reason, const Status& why);

  // Live acceptance of one version on one domain: the per-token estimator (no prior, no
  // decay: the version's whole traffic since it was installed), and its steps.
  struct Live {
    spec::AcceptanceEstimator alpha{0.0, 0.0, std::numeric_limits<double>::infinity()};
    int64_t steps = 0;
  };

  const DraftSwapperOptions options_;
  const LlamaModel& target_;
  ServingMetrics* metrics_;
  std::unique_ptr<DraftFetcher> fetcher_;  // used by the thread only
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> installed_{0};

  mutable std::mutex mu_;
  DraftCandidate ready_;                        // GUARDED_BY(mu_)
  uint64_t newest_ = 0;                         // GUARDED_BY(mu_): newest fetched or installed
  uint64_t previous_ = 0;                       // GUARDED_BY(mu_): installed before the current
  bool has_previous_ = false;                   // GUARDED_BY(mu_)
  std::set<uint64_t> refused_;                  // GUARDED_BY(mu_)
  std::map<uint64_t, std::string> dirs_;        // GUARDED_BY(mu_): version -> checkpoint dir
  std::map<uint64_t, std::map<std::string, Live>> live_;  // by version, domain; GUARDED_BY(mu_)
};

}  // namespace specloop
