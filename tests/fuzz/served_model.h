// What the HTTP fuzz targets parse requests for: target-6m's config and tokenizer from
// ../shared, as `specloop serve` loads them, and the CompletionLimits over them.
#pragma once

#include <memory>
#include <string>

#include "common/tokenizer/model_config.h"
#include "common/tokenizer/tokenizer.h"
#include "serve/completion_params.h"
#include "tests/fuzz/fuzz_util.h"

namespace specloop {
namespace fuzz {

struct ServedModel {
  ModelConfig config;
  std::unique_ptr<Tokenizer> tokenizer;
  CompletionLimits limits;

  ServedModel() {
    const std::string dir = SharedDir() + "/models/target-6m";
    FUZZ_CHECK(ModelConfig::FromDir(dir, &config).ok());
    FUZZ_CHECK(Tokenizer::Load(dir, &tokenizer).ok());
    limits.model_name = "target-6m";
    limits.config = &config;
    limits.tokenizer = tokenizer.get();
    limits.max_prompt_tokens = 600;  // below the context (1024), so both limits are reachable
    limits.max_tokens_limit = 700;
  }
};

}  // namespace fuzz
}  // namespace specloop
