// A replay record shaped like serving traffic, for the buffer and shipping benchmarks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/base/half.h"
#include "buffer/record.h"
#include "common/base/rng.h"

namespace specloop {
namespace bench {

// A request of `tokens` tokens (a quarter prompt), decoded in steps of k drafts with a random
// number accepted (acceptance ~0.7 per token), the target's top-K at the k+1 positions.
inline Record MakeRecord(Rng* rng, int k, int top_k, int tokens, uint64_t id) {
  Record r;
  r.domain = std::vector<std::string>{"prose", "python", "c", "legal", "docs"}[id % 5];
  r.request_id = "cmpl-" + std::to_string(id);
  r.worker_id = 1;
  r.draft_version = 7;
  r.target_id = "target-6m";
  r.sampling.temperature = 0.8f;
  r.prompt_len = tokens / 4;
  for (int i = 0; i < tokens; i++) r.tokens.push_back(static_cast<int32_t>(rng->Next() % 32000));
  r.top_k = top_k;
  uint32_t pos = r.prompt_len;
  while (pos < static_cast<uint32_t>(tokens)) {
    SpecStep s;
    s.start_pos = pos;
    for (int i = 0; i < k; i++) s.draft_tokens.push_back(static_cast<int32_t>(rng->Next() % 32000));
    uint32_t acc = 0;
    while (acc < static_cast<uint32_t>(k) && rng->Uniform() < 0.7) acc++;
    s.num_accepted = acc;
    for (int j = 0; j <= k; j++) {
      float lp = -0.05f;
      for (int i = 0; i < top_k; i++) {
        s.topk_ids.push_back(static_cast<int32_t>(rng->Next() % 32000));
        s.topk_logprobs.push_back(FloatToHalf(lp));
        lp -= static_cast<float>(rng->Uniform() * 0.3);
      }
      s.tail_mass.push_back(static_cast<float>(rng->Uniform() * 0.05));
    }
    pos += acc + 1;
    r.steps.push_back(std::move(s));
  }
  return r;
}

}  // namespace bench
}  // namespace specloop
