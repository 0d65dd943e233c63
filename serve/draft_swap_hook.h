// DraftSwapHook: the seam between the scheduler and the draft hot-swapper (DESIGN.md
// section 7). The swapper (ZeroMQ SUB/DEALER client, written separately) receives an
// announcement, fetches and verifies the checkpoint and loads it into a standby Draft on
// its own thread; the scheduler polls the hook between iterations and installs what it gets:
// every in-flight sequence's draft proposer is pointed at the new draft (its draft KV cache is
// rebuilt on next use), the old model is destroyed, and draft_version moves on.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/base/status.h"
#include "common/engine/draft.h"

namespace specloop {

struct DraftCandidate {
  Draft draft;           // loaded, on the target's device (a model or a head)
  uint64_t version = 0;  // > 0; 0 is the --draft given at startup
};

class DraftSwapHook {
 public:
  virtual ~DraftSwapHook() = default;

  // Called on the scheduler thread between iterations: every iteration while busy, and about
  // every 50 ms while idle. Must not block. Returns true and moves a ready standby model into
  // *out when one is waiting; false otherwise.
  virtual bool TakeReady(DraftCandidate* out) = 0;

  // Called on the scheduler thread once the candidate of TakeReady() was installed (OK) or
  // refused (InvalidArgument: its vocabulary or architecture does not fit the target; the old
  // draft keeps serving). Must not block.
  virtual void OnInstalled(uint64_t version, const Status& status) {}

  // Called on the scheduler thread after every verification step drafted by `version` for a
  // request of `domain` (the metrics' domain label): the live acceptance a swapper compares
  // versions by (rollback). Must be cheap and not block.
  virtual void ObserveAcceptance(uint64_t version, const std::string& domain, int drafted,
                                 int accepted) {}
};

}  // namespace specloop
