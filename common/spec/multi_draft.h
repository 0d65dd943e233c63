// The outcome of one multi-draft verification step: n candidate tokens proposed for the same
// position, one token emitted. Shared by the verifiers in rrs.h and greedy_multi_draft.h.
#pragma once

namespace specloop {
namespace spec {

struct MultiDraftOutcome {
  // The emitted token; distributed exactly as the target's processed distribution p.
  int token = -1;
  // Index into the drafts of the accepted candidate (token == drafts[accepted_index]), or -1
  // when every candidate was rejected and `token` was recovered from the final residual. The
  // acceptance rate of a verifier is P(accepted_index >= 0).
  int accepted_index = -1;
};

}  // namespace spec
}  // namespace specloop
