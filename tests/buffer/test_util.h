// Helpers for the buffer tests: temporary directories and random records of every shape.
#pragma once

#include <limits>
#include <string>

#include "common/base/half.h"
#include "buffer/record.h"
#include "common/base/rng.h"
#include "tests/testing/temp_dir.h"

namespace specloop {
namespace testing {

inline uint64_t Below(Rng* rng, uint64_t n) { return n == 0 ? 0 : rng->Next() % n; }

struct Shape {
  uint32_t max_tokens = 64;
  uint32_t max_steps = 12;
  uint32_t max_k = 6;
  uint32_t max_top_k = 16;
  uint32_t vocab = 32000;
};

// A valid record with every field random; sizes drawn up to `shape` (zeros included), odd
// values included (negative ids, NaN/inf/subnormal fp16, NaN tails, empty strings).
inline Record RandomRecord(Rng* rng, const Shape& shape = Shape()) {
  static const char* kDomains[] = {"prose", "python", "c", "legal", "docs", ""};
  Record r;
  r.time_us = rng->Next() >> Below(rng, 64);
  r.domain = kDomains[Below(rng, 6)];
  r.request_id = "req-" + std::to_string(rng->Next());
  if (Below(rng, 4) == 0) r.request_id.clear();
  r.worker_id = static_cast<uint32_t>(rng->Next());
  r.draft_version = rng->Next() >> Below(rng, 64);
  r.target_id = Below(rng, 2) ? "target-6m" : std::string(Below(rng, 300), 'x');
  r.sampling.temperature = static_cast<float>(rng->Uniform() * 2);
  r.sampling.top_k = static_cast<int>(Below(rng, 100));
  r.sampling.top_p = static_cast<float>(rng->Uniform());
  r.sampling.seed = rng->Next();
  const uint32_t n_tokens = static_cast<uint32_t>(Below(rng, shape.max_tokens + 1));
  for (uint32_t i = 0; i < n_tokens; i++) {
    r.tokens.push_back(Below(rng, 50) == 0 ? -static_cast<int32_t>(Below(rng, 1000)) - 1
                                          : static_cast<int32_t>(Below(rng, shape.vocab)));
  }
  r.prompt_len = static_cast<uint32_t>(Below(rng, n_tokens + 1));
  r.top_k = static_cast<uint32_t>(Below(rng, shape.max_top_k + 1));
  const uint32_t n_steps = static_cast<uint32_t>(Below(rng, shape.max_steps + 1));
  for (uint32_t s = 0; s < n_steps; s++) {
    SpecStep st;
    st.start_pos = static_cast<uint32_t>(rng->Next());
    const uint32_t k = static_cast<uint32_t>(Below(rng, shape.max_k + 1));
    for (uint32_t i = 0; i < k; i++) {
      st.draft_tokens.push_back(static_cast<int32_t>(Below(rng, shape.vocab)));
    }
    st.num_accepted = static_cast<uint32_t>(Below(rng, k + 1));
    const size_t n = static_cast<size_t>(k + 1) * r.top_k;
    for (size_t i = 0; i < n; i++) {
      st.topk_ids.push_back(static_cast<int32_t>(Below(rng, shape.vocab)));
      st.topk_logprobs.push_back(Below(rng, 8) == 0 ? static_cast<uint16_t>(rng->Next())
                                                    : FloatToHalf(-20.0f * rng->Uniform()));
    }
    for (uint32_t j = 0; j <= k; j++) {
      st.tail_mass.push_back(Below(rng, 20) == 0 ? std::numeric_limits<float>::quiet_NaN()
                                                 : static_cast<float>(rng->Uniform()));
    }
    r.steps.push_back(std::move(st));
  }
  return r;
}

}  // namespace testing
}  // namespace specloop
