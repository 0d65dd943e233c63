// GenerationConfig: a model directory's `generation_config.json` (Hugging Face's
// GenerationConfig file), and the request defaults it implies (GenerationDefaults). Pure; no
// LibTorch.
//
// What the server and `specloop generate` take from it under --generation-config auto (the
// default; vLLM's `--generation-config auto`, read through its get_diff_sampling_param):
//   temperature, top_p, top_k   the defaults of a request that omits them, each on its own;
//   do_sample                   false: the default is greedy (temperature 0), and the file's
//                               temperature, top_p and top_k are not applied (transformers'
//                               generate does the same); true or absent: as above;
//   max_new_tokens              the default max_tokens of a request that gives none (within
//                               the room left in the context and the server's limit; a
//                               request's own max_tokens is not capped by it);
//   eos_token_id                an id or a list: ids that end generation beside config.json's;
//   repetition_penalty, min_p   not implemented: a non-neutral value (or one that cannot be
//                               read) is listed in GenerationDefaults::not_applied for the
//                               caller to log; never an error;
//   anything else               ignored (bos_token_id is read and checked, not used).
// --generation-config ignore restores the plain sampling defaults (temperature 1, top_p 1,
// top_k off, no default max_tokens); the file's eos_token_id ids still end generation, as with
// vLLM's `--generation-config vllm`, so a malformed file is an error in both modes.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/base/sampling.h"
#include "common/base/status.h"

namespace specloop {

struct GenerationConfig {
  bool present = false;  // the file exists (FromDir)
  std::optional<double> temperature, top_p;
  std::optional<int> top_k;  // -1 and 0: off
  std::optional<bool> do_sample;
  std::optional<int> max_new_tokens;
  std::optional<int> bos_token_id;
  std::vector<int> eos_token_ids;  // empty when the file gives none
  // Keys read but not implemented, with a non-neutral value, e.g. "repetition_penalty 1.05".
  std::vector<std::string> unsupported;

  // Parses the text of a generation_config.json; `path` names it in errors. InvalidArgument,
  // naming the file and the key, for text that is not a JSON object and for a value of the
  // wrong type or out of range: temperature (a number >= 0), top_p (in (0, 1]), top_k (an
  // integer >= -1), do_sample (a boolean), max_new_tokens (an integer >= 1), bos_token_id and
  // eos_token_id (ids >= 0; eos_token_id one or a list). Nulls count as absent.
  static Status FromJson(const std::string& text, const std::string& path, GenerationConfig* out);
  // Reads DIR/generation_config.json; a directory without one gives an empty config
  // (present false) and OK.
  static Status FromDir(const std::string& dir, GenerationConfig* out);
};

enum class GenerationConfigMode { kAuto, kIgnore };

// "auto" or "ignore"; InvalidArgument otherwise.
Status ParseGenerationConfigMode(const std::string& text, GenerationConfigMode* out);

// What a request that omits a field gets, and the extra stop ids.
struct GenerationDefaults {
  // temperature, top_k, top_p (seed unused). Default: the plain ones (1, off, 1).
  SamplingParams sampling;
  // Default max_tokens from max_new_tokens; 0: none (the API's own default).
  int max_tokens = 0;
  // Ids that end generation beside the model config's EOS ids (never one of those).
  std::vector<int> eos_token_ids;
  // Where the sampling defaults come from: "generation_config.json" or "plain".
  std::string source = "plain";
  // What the file asks for that is not applied, one sentence each (for start-up warnings).
  std::vector<std::string> not_applied;

  // One line for start-up logs: "temperature 0.6, top_p 0.95, top_k 20 (generation_config.json);
  // extra EOS ids 7".
  std::string Describe() const;
};

// The defaults `config` implies under `mode` (see the top of this file). `model_eos`: the model
// config's EOS ids (left out of eos_token_ids); `vocab_size`: an eos_token_id at or beyond it
// is InvalidArgument naming generation_config.json.
Status ResolveGenerationDefaults(const GenerationConfig& config, GenerationConfigMode mode,
                                 const std::vector<int>& model_eos, int vocab_size,
                                 GenerationDefaults* out);

}  // namespace specloop
