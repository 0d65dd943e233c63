// Helpers for the trainer tests.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "buffer/replay_logger.h"
#include "common/model/llama_model.h"
#include "tests/testing/temp_dir.h"
#include "trainer/synthetic_traffic.h"

namespace specloop {
namespace testing {

// Logs a small real buffer into `dir`: target-6m verifying draft-prose-1m (k = 4, 40 tokens)
// on 40 prompts (cut to 64 tokens) of each of python, c and legal, sampled at temperature 1;
// with greedy_every > 0, every greedy_every-th prompt of each domain (the first included) is
// decoded greedily instead. OK, or what failed.
inline Status MakeTrafficBuffer(const std::string& dir, int greedy_every = 0) {
  const std::string models = SharedDir() + "/models";
  std::unique_ptr<LlamaModel> target, draft;
  SPECLOOP_RETURN_IF_ERROR(LlamaModel::Load(models + "/target-6m", {}, &target));
  SPECLOOP_RETURN_IF_ERROR(LlamaModel::Load(models + "/draft-prose-1m", {}, &draft));
  std::unique_ptr<ReplayLogger> logger;
  SPECLOOP_RETURN_IF_ERROR(ReplayLogger::Open({}, {}, dir, &logger));
  trainer::TrafficOptions o;
  o.max_tokens = 40;
  o.max_prompt_tokens = 64;
  for (const char* domain : {"python", "c", "legal"}) {
    std::vector<std::vector<int>> prompts;
    SPECLOOP_RETURN_IF_ERROR(
        trainer::LoadDomainPrompts(SharedDir(), domain, models + "/target-6m", 40, 64, &prompts));
    for (size_t i = 0; i < prompts.size(); ++i) {
      Record r;
      o.seed = i;
      o.temperature = greedy_every > 0 && i % greedy_every == 0 ? 0.0f : 1.0f;
      SPECLOOP_RETURN_IF_ERROR(trainer::DecodeToRecord(
          *target, *draft, prompts[i], domain, std::string(domain) + "-" + std::to_string(i), o,
          &r));
      if (!logger->Log(&r)) return Status::IOError("replay logger dropped a record");
    }
  }
  return logger->Close();
}

}  // namespace testing
}  // namespace specloop
