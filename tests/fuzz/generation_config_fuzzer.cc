// generation_config.json (common/tokenizer/generation_config.h): a model directory's sampling
// defaults. A file that parses must resolve, in both modes, to defaults that a request may
// decode with (valid sampling, extra EOS ids inside the vocabulary and not the model's own), or
// to an InvalidArgument naming generation_config.json.
#include "common/tokenizer/generation_config.h"
#include "tests/fuzz/fuzz_util.h"

using namespace specloop;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  GenerationConfig config;
  const std::string text(reinterpret_cast<const char*>(data), size);
  const Status parsed = GenerationConfig::FromJson(text, "generation_config.json", &config);
  if (!parsed.ok()) {
    FUZZ_CHECK(parsed.IsInvalidArgument());
    FUZZ_CHECK(parsed.ToString().find("generation_config.json") != std::string::npos);
    return 0;
  }
  const std::vector<int> model_eos = {2};
  constexpr int kVocab = 4096;
  for (GenerationConfigMode mode : {GenerationConfigMode::kAuto, GenerationConfigMode::kIgnore}) {
    GenerationDefaults d;
    const Status s = ResolveGenerationDefaults(config, mode, model_eos, kVocab, &d);
    if (!s.ok()) {
      FUZZ_CHECK(s.IsInvalidArgument());
      FUZZ_CHECK(s.ToString().find("generation_config.json") != std::string::npos);
      continue;
    }
    FUZZ_CHECK(d.sampling.Validate().empty());
    FUZZ_CHECK(d.max_tokens >= 0);
    for (int id : d.eos_token_ids) FUZZ_CHECK(id >= 0 && id < kVocab && id != 2);
    FUZZ_CHECK(!d.Describe().empty());
  }
  return 0;
}
