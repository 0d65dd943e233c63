// `specloop generate`: decoding from the command line.
#include <algorithm>
#include <chrono>
#include <iostream>
#include <sstream>

#include "common/model/threads.h"
#include <nlohmann/json.hpp>

#include "common/engine/decode_step.h"
#include "common/engine/draft.h"
#include "common/engine/draft_model_proposer.h"
#include "common/engine/feature_draft_proposer.h"
#include "common/engine/generate.h"
#include "common/engine/speculative_decoder.h"
#include "common/spec/prompt_lookup_proposer.h"
#include "common/tokenizer/generation_config.h"
#include "common/tokenizer/tokenizer.h"
#include "cli/commands.h"
#include "serve/completion_params.h"
#include "serve/logprobs_json.h"
#include "serve/step_logprobs.h"

namespace specloop {

namespace {

struct GenerateArgs {
  std::string model, prompt, device = "cpu", dtype = "auto";
  std::string draft, k = "auto", draft_mode = "chain", tree = "2,2,1,1";
  bool prompt_lookup = false, no_cuda_graphs = false;
  float min_confidence = 0.0f;
  int max_tokens = 128, top_k = 0, threads = 0, max_model_len = 0;
  float temperature = 1.0f, top_p = 1.0f;
  uint64_t seed = 0;
  bool json = false, ignore_eos = false;
  std::string generation_config = "auto";
  int logprobs = -1;  // -1: none
  // Set: given on the command line (else the model's generation_config.json default).
  CLI::Option *temperature_option = nullptr, *top_p_option = nullptr, *top_k_option = nullptr,
              *max_tokens_option = nullptr;
};

// Whether `token` is one of `stop_ids`.
bool IsStopId(const std::vector<int>& stop_ids, int token) {
  return std::find(stop_ids.begin(), stop_ids.end(), token) != stop_ids.end();
}

// GeneratePlain token by token: ends at the first of `stop_ids` too (*stop_id set, the id
// kept, hit_eos), and with top_n >= 0 fills *entries with each token's log-probs.
GenerateResult DecodePlain(const LlamaModel& model, const std::vector<int>& prompt,
                           const GenerateOptions& options, int top_n,
                           const std::vector<int>& stop_ids, std::vector<TokenLogprob>* entries,
                           bool* stop_id) {
  std::vector<float> scratch;
  TokenObserver observer;
  if (top_n >= 0) {
    observer = [&](int token, const float* logits, int vocab) {
      entries->emplace_back();
      ComputeTokenLogprob(logits, vocab, options.sampling, token, top_n, &scratch,
                          &entries->back());
    };
  }
  PlainGeneration g(model, prompt, options, observer);
  const auto ended = [&] {
    return !g.result().tokens.empty() && IsStopId(stop_ids, g.result().tokens.back());
  };
  *stop_id = ended();
  while (!*stop_id && !g.finished()) {
    g.Step();
    *stop_id = ended();
  }
  GenerateResult r = g.result();
  r.hit_eos = r.hit_eos || *stop_id;
  return r;
}

// GenerateSpeculative's loop (SpeculativeGeneration: DecodeStep over a batch of one), with the
// slot's on_commit reading each step's target rows for the log-probs (top_n >= 0) and the
// output cut after the first of `stop_ids` (as DecodePlain).
GenerateResult DecodeSpeculative(const LlamaModel& target, Proposer* proposer,
                                 const std::vector<int>& prompt, const SpeculativeOptions& options,
                                 int top_n, const std::vector<int>& stop_ids,
                                 SpeculativeStats* stats, std::vector<TokenLogprob>* entries,
                                 bool* stop_id) {
  using Clock = std::chrono::steady_clock;
  TORCH_CHECK(!options.policy || options.costs, "a policy needs costs");
  GenerateResult r;
  auto t0 = Clock::now();
  SpeculativeDecoder decoder(&target, proposer, prompt, options.generate);
  r.prefill_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  DecodeSlot slot;
  slot.decoder = &decoder;
  slot.proposer = proposer;
  slot.draft_proposer = dynamic_cast<DraftModelProposer*>(proposer);
  slot.feature_proposer = dynamic_cast<FeatureDraftProposer*>(proposer);
  slot.policy = options.policy;
  if (options.policy != nullptr && slot.draft_proposer != nullptr) slot.tree = options.tree;
  slot.fixed_k = options.k;
  std::vector<float> scratch;
  std::vector<TokenLogprob> step;
  if (top_n >= 0) {
    slot.on_commit = [&](const DecodeSlot& done, const at::Tensor& rows) {
      StepLogprobs(done, rows, options.generate.sampling, top_n, &scratch, &step);
    };
  }
  *stop_id = false;
  size_t kept = 0;  // generated tokens of the output
  while (!decoder.finished() && !*stop_id) {
    t0 = Clock::now();
    DecodeStep(target, options.costs, {&slot});
    TORCH_CHECK(slot.error.empty(), slot.error);
    r.decode_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    size_t n = 0;
    while (n < slot.emitted.size() && !*stop_id) *stop_id = IsStopId(stop_ids, slot.emitted[n++]);
    if (top_n >= 0) entries->insert(entries->end(), step.begin(), step.begin() + n);
    kept += n;
  }
  *stats = decoder.stats();
  r.tokens = decoder.generated();
  r.tokens.resize(kept);
  r.hit_eos = decoder.hit_eos() || *stop_id;
  return r;
}

int RunGenerate(const GenerateArgs& a) {
  LoadOptions load;
  load.device = a.device;
  load.dtype = a.dtype;
  load.max_model_len = a.max_model_len;
  load.cuda_graphs = !a.no_cuda_graphs;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<Tokenizer> tokenizer;
  Status s = LlamaModel::Load(a.model, load, &model);
  if (s.ok()) s = Tokenizer::Load(a.model, &tokenizer);
  if (!s.ok()) {
    std::cerr << "specloop generate: " << s.ToString() << "\n";
    return 1;
  }
  const ModelConfig& c = model->config();
  // Defaults from the model's generation_config.json (--generation-config), where the command
  // line gives none.
  GenerationConfigMode mode = GenerationConfigMode::kAuto;
  GenerationConfig generation_config;
  GenerationDefaults defaults;
  s = ParseGenerationConfigMode(a.generation_config, &mode);
  if (s.ok()) s = GenerationConfig::FromDir(a.model, &generation_config);
  if (s.ok()) {
    s = ResolveGenerationDefaults(generation_config, mode, c.eos_token_ids, c.vocab_size,
                                  &defaults);
  }
  if (!s.ok()) {
    std::cerr << "specloop generate: " << s.ToString() << "\n";
    return 1;
  }
  for (const std::string& w : defaults.not_applied) {
    std::cerr << "specloop generate: warning: " << a.model << "/generation_config.json: " << w
              << "\n";
  }
  const auto given = [](const CLI::Option* o) { return o != nullptr && o->count() > 0; };
  GenerateOptions opt;
  opt.max_tokens = given(a.max_tokens_option) || defaults.max_tokens <= 0
                       ? a.max_tokens
                       : std::min(a.max_tokens, defaults.max_tokens);
  opt.sampling = {given(a.temperature_option) ? a.temperature : defaults.sampling.temperature,
                  given(a.top_k_option) ? a.top_k : defaults.sampling.top_k,
                  given(a.top_p_option) ? a.top_p : defaults.sampling.top_p, a.seed};
  if (opt.sampling.top_k < 0) opt.sampling.top_k = 0;  // -1: off, as requests
  opt.stop_at_eos = !a.ignore_eos;
  const std::vector<int> stop_ids = a.ignore_eos ? std::vector<int>() : defaults.eos_token_ids;
  if (!a.json) std::cerr << "specloop generate: defaults: " << defaults.Describe() << "\n";
  if (std::string err = opt.sampling.Validate(); !err.empty()) {
    std::cerr << "specloop generate: " << err << "\n";
    return 2;
  }
  std::vector<int> prompt = tokenizer->Encode(a.prompt);
  if (c.add_bos_token) prompt.insert(prompt.begin(), c.bos_token_id);
  if (prompt.empty() || static_cast<int>(prompt.size()) >= c.max_model_len) {
    std::cerr << "specloop generate: prompt of " << prompt.size()
              << " tokens does not fit the context of " << c.max_model_len << "\n";
    return 2;
  }

  // On CUDA the caches lie in bounded pools sized for this request, over which decode steps
  // replay CUDA graphs (LlamaModel::Forward; --no-cuda-graphs: eager forwards).
  const int64_t request_blocks = KVBlockPool::BlocksFor(prompt.size() + opt.max_tokens + 32) + 1;
  if (model->device().is_cuda()) opt.pool = model->NewBlockPool(request_blocks, false);

  // Speculative decoding when a draft model or prompt lookup is asked for.
  const bool speculative = !a.draft.empty() || a.prompt_lookup;
  Draft draft;
  std::unique_ptr<Proposer> draft_proposer;
  DraftModelProposer* model_proposer = nullptr;  // draft_proposer, when a draft model's
  std::unique_ptr<Proposer> lookup_proposer, fallback;
  std::unique_ptr<TreeAcceptance> tree;
  Proposer* proposer = nullptr;
  SpeculationPolicy policy;
  StepCostTable costs;
  SpeculativeOptions spec_opt;
  if (!a.draft.empty()) {
    LoadOptions draft_load = load;
    draft_load.dtype = "auto";  // --dtype is the target's; a draft model's weights stay in cache
    Status ds = LoadDraft(a.draft, *model, draft_load, &draft);
    if (ds.ok() && draft.head && a.draft_mode == "tree") {
      ds = Status::NotSupported("--draft-mode tree with an EAGLE-3 head (it drafts chains)");
    }
    if (ds.ok() && draft.head && a.prompt_lookup) {
      ds = Status::NotSupported(
          "--prompt-lookup with an EAGLE-3 head in generate (serve has both)");
    }
    if (!ds.ok()) {
      std::cerr << "specloop generate: --draft: " << ds.ToString() << "\n";
      return 1;
    }
    std::shared_ptr<KVBlockPool> draft_pool;
    if (draft.model && model->device().is_cuda()) {
      draft_pool = draft.model->NewBlockPool(request_blocks, false);
    }
    draft_proposer = NewDraftProposer(draft, opt.sampling, a.min_confidence, draft_pool);
    model_proposer = dynamic_cast<DraftModelProposer*>(draft_proposer.get());
    if (a.draft_mode == "tree") {
      std::vector<int> branching;
      if (!ParseTreeBranching(a.tree, &branching)) {
        std::cerr << "specloop generate: --tree takes branching factors in [1, 16], e.g. 2,2,1,1\n";
        return 2;
      }
      // --k auto offers trees beside chains, step by step, where they pay; a fixed k drafts
      // trees of depth k.
      if (a.k == "auto") {
        tree = std::make_unique<TreeAcceptance>(branching);
      } else {
        model_proposer->set_tree_branching(branching);
      }
    }
    proposer = draft_proposer.get();
  }
  if (a.prompt_lookup) {
    lookup_proposer = std::make_unique<PromptLookupProposer>(c.vocab_size, opt.sampling.greedy());
    proposer = lookup_proposer.get();
  }
  if (draft_proposer && lookup_proposer) {
    fallback = std::make_unique<FallbackProposer>(lookup_proposer.get(), draft_proposer.get());
    proposer = fallback.get();
  }
  if (speculative) {
    spec_opt.generate = opt;
    if (a.k == "auto") {
      spec_opt.policy = &policy;
      spec_opt.costs = &costs;
      spec_opt.tree = tree.get();
      CalibrationOptions co;
      co.context = std::min<int>(256, prompt.size() + opt.max_tokens / 2);
      co.sampling = opt.sampling;
      co.head = draft.head.get();
      CalibrateStepCosts(*model, draft.model.get(), policy.options().k_max, &costs, co);
    } else {
      try {
        spec_opt.k = std::stoi(a.k);
      } catch (const std::exception&) {
        spec_opt.k = -1;
      }
      if (spec_opt.k < 0) {
        std::cerr << "specloop generate: --k takes a number >= 0 or auto\n";
        return 2;
      }
    }
  }
  SpeculativeStats stats;
  std::vector<TokenLogprob> entries;  // --logprobs: one per generated token
  GenerateResult r;
  bool stop_id = false;
  try {
    r = speculative ? DecodeSpeculative(*model, proposer, prompt, spec_opt, a.logprobs,
                                        stop_ids, &stats, &entries, &stop_id)
                    : DecodePlain(*model, prompt, opt, a.logprobs, stop_ids, &entries, &stop_id);
  } catch (const std::exception& e) {
    std::cerr << "specloop generate: " << e.what() << "\n";
    return 1;
  }
  std::vector<int> shown = r.tokens;
  if (r.hit_eos && !stop_id) shown.pop_back();  // the model's EOS (an extra stop id is shown)
  const std::string text = tokenizer->Decode(shown, prompt.back());
  const double seconds = r.prefill_seconds + r.decode_seconds;
  const double tps = seconds > 0 ? r.tokens.size() / seconds : 0.0;
  if (a.json) {
    nlohmann::json j = {
        {"text", text},
        {"prompt_tokens", prompt},
        {"tokens", r.tokens},
        {"finish_reason", r.hit_eos ? "stop" : "length"},
        {"tokens_per_second", tps},
        {"prefill_seconds", r.prefill_seconds},
        {"decode_seconds", r.decode_seconds},
        {"sampling", SamplingJson(opt.sampling)},
        {"generation_defaults", GenerationDefaultsJson(defaults)},
    };
    if (a.logprobs >= 0) {
      LogprobsJson format(tokenizer.get(), prompt.back(), LogprobsJson::Format::kGenerate,
                          /*tokens_as_ids=*/false);
      j["logprobs"] = format.Chunk(entries);
    }
    if (speculative) {
      j["drafted"] = stats.drafted;
      j["accepted"] = stats.accepted;
      j["tested"] = stats.tested;
      j["acceptance_rate"] = stats.acceptance_rate();
      j["tokens_per_step"] = stats.tokens_per_step();
      j["drafts"] = stats.drafts;
      j["mean_acceptance_length"] = stats.mean_acceptance_length();
      j["k_mean"] = stats.k_mean();
      j["steps"] = stats.steps;
      j["accepted_per_position"] = stats.accepted_at;
    }
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::cout << a.prompt << text << "\n";
    std::cerr << r.tokens.size() << " tokens, " << tps << " tokens/s\n";
  }
  return 0;
}

}  // namespace

bool ParseTreeBranching(const std::string& text, std::vector<int>* out) {
  std::vector<int> branching;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    size_t used = 0;
    int b = 0;
    try {
      b = std::stoi(item, &used);
    } catch (const std::exception&) {
      return false;
    }
    if (used != item.size() || b < 1 || b > 16) return false;
    branching.push_back(b);
  }
  if (branching.empty() || branching.size() > 16) return false;
  *out = std::move(branching);
  return true;
}

void AddGenerateCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("generate", "decode a prompt from the command line");
  auto a = std::make_shared<GenerateArgs>();
  cmd->add_option("--model", a->model, "model directory (Hugging Face layout)")->required();
  cmd->add_option("--prompt", a->prompt, "prompt text")->required();
  a->max_tokens_option =
      cmd->add_option("--max-tokens", a->max_tokens,
                      "most tokens to generate (default: 128, or the model's max_new_tokens "
                      "where lower)")
          ->capture_default_str();
  a->temperature_option =
      cmd->add_option("--temperature", a->temperature,
                      "0 = greedy (default: the model's generation_config.json, else 1)");
  a->top_p_option = cmd->add_option("--top-p", a->top_p,
                                    "nucleus mass (default: generation_config.json's, else 1)");
  a->top_k_option = cmd->add_option("--top-k", a->top_k,
                                    "0 = off (default: generation_config.json's, else off)");
  cmd->add_option("--generation-config", a->generation_config,
                  "auto: the defaults of --temperature, --top-p, --top-k and --max-tokens from "
                  "the model's generation_config.json (do_sample false: greedy); ignore: 1, 1, "
                  "off, 128. Its eos_token_id ids end generation in both")
      ->check(CLI::IsMember({"auto", "ignore"}))
      ->capture_default_str();
  cmd->add_option("--logprobs", a->logprobs,
                  "with --json: each token's log-probability under the sampling, and this many "
                  "alternatives (0 to 20)")
      ->check(CLI::Range(0, kMaxTopLogprobs));
  cmd->add_option("--seed", a->seed, "sampling seed")->capture_default_str();
  cmd->add_option("--device", a->device, "cpu or cuda")->capture_default_str();
  cmd->add_flag("--no-cuda-graphs", a->no_cuda_graphs,
                "on cuda, run every forward eagerly instead of replaying CUDA graphs");
  cmd->add_option("--dtype", a->dtype,
                  "target weights: auto (float32 on cpu), float32, float16 or bfloat16 (on cpu: "
                  "16-bit weights, float32 arithmetic; half the bytes per decode step)")
      ->capture_default_str();
  cmd->add_option("--max-model-len", a->max_model_len,
                  "context limit in positions (0: the model's own)")
      ->check(CLI::Range(0, 1 << 30))
      ->capture_default_str();
  cmd->add_option("--threads", a->threads, "compute threads (0: every core)")
      ->capture_default_str();
  cmd->add_option("--draft", a->draft, "draft model directory: speculative decoding");
  cmd->add_option("--k", a->k, "draft tokens per step: a number, or auto")->capture_default_str();
  cmd->add_option("--draft-mode", a->draft_mode,
                  "chain, or tree: token trees of --tree's shape (with --k auto, step by step "
                  "where they promise more tokens/s than a chain)")
      ->check(CLI::IsMember({"chain", "tree"}))
      ->capture_default_str();
  cmd->add_option("--tree", a->tree,
                  "tree mode: children per node at each depth; --k caps the depth")
      ->capture_default_str();
  cmd->add_flag("--prompt-lookup", a->prompt_lookup,
                "draft by n-gram match against the context (with --draft: the draft model where no n-gram matches)");
  cmd->add_option("--min-confidence", a->min_confidence,
                  "stop a draft block where the draft's most likely token has less probability (chains)")
      ->capture_default_str();
  cmd->add_flag("--ignore-eos", a->ignore_eos, "keep generating past EOS");
  cmd->add_flag("--json", a->json, "print one JSON object");
  cmd->callback([a, exit_code] {
    SetComputeThreads(a->threads);
    *exit_code = RunGenerate(*a);
  });
}

}  // namespace specloop
