// `specloop generate`: decoding from the command line.
#include <iostream>
#include <sstream>

#include "common/model/threads.h"
#include <nlohmann/json.hpp>

#include "common/engine/decode_step.h"
#include "common/engine/draft_model_proposer.h"
#include "common/engine/generate.h"
#include "common/engine/speculative_decoder.h"
#include "common/spec/prompt_lookup_proposer.h"
#include "common/tokenizer/tokenizer.h"
#include "serve/commands.h"

namespace specloop {

namespace {

struct GenerateArgs {
  std::string model, prompt, device = "cpu", dtype = "auto";
  std::string draft, k = "auto", draft_mode = "chain", tree = "2,2,1,1";
  bool prompt_lookup = false;
  float min_confidence = 0.0f;
  int max_tokens = 128, top_k = 0, threads = 0;
  float temperature = 1.0f, top_p = 1.0f;
  uint64_t seed = 0;
  bool json = false, ignore_eos = false;
};

int RunGenerate(const GenerateArgs& a) {
  LoadOptions load;
  load.device = a.device;
  load.dtype = a.dtype;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<Tokenizer> tokenizer;
  Status s = LlamaModel::Load(a.model, load, &model);
  if (s.ok()) s = Tokenizer::Load(a.model, &tokenizer);
  if (!s.ok()) {
    std::cerr << "specloop generate: " << s.ToString() << "\n";
    return 1;
  }
  const ModelConfig& c = model->config();
  GenerateOptions opt;
  opt.max_tokens = a.max_tokens;
  opt.sampling = {a.temperature, a.top_k, a.top_p, a.seed};
  opt.stop_at_eos = !a.ignore_eos;
  if (std::string err = opt.sampling.Validate(); !err.empty()) {
    std::cerr << "specloop generate: " << err << "\n";
    return 2;
  }
  std::vector<int> prompt = tokenizer->Encode(a.prompt);
  if (c.add_bos_token) prompt.insert(prompt.begin(), c.bos_token_id);
  if (prompt.empty() || static_cast<int>(prompt.size()) >= c.max_position_embeddings) {
    std::cerr << "specloop generate: prompt of " << prompt.size()
              << " tokens does not fit the context of " << c.max_position_embeddings << "\n";
    return 2;
  }

  // Speculative decoding when a draft model or prompt lookup is asked for.
  const bool speculative = !a.draft.empty() || a.prompt_lookup;
  std::unique_ptr<LlamaModel> draft;
  std::unique_ptr<DraftModelProposer> model_proposer;
  std::unique_ptr<Proposer> lookup_proposer, fallback;
  std::unique_ptr<TreeAcceptance> tree;
  Proposer* proposer = nullptr;
  SpeculationPolicy policy;
  StepCostTable costs;
  SpeculativeOptions spec_opt;
  if (!a.draft.empty()) {
    LoadOptions draft_load = load;
    draft_load.dtype = "auto";  // --dtype is the target's; a draft's weights stay in cache
    Status ds = LlamaModel::Load(a.draft, draft_load, &draft);
    if (ds.ok()) ds = CheckDraftCompatible(c, draft->config());
    if (!ds.ok()) {
      std::cerr << "specloop generate: --draft: " << ds.ToString() << "\n";
      return 1;
    }
    model_proposer =
        std::make_unique<DraftModelProposer>(draft.get(), opt.sampling, a.min_confidence);
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
    proposer = model_proposer.get();
  }
  if (a.prompt_lookup) {
    lookup_proposer = std::make_unique<PromptLookupProposer>(c.vocab_size, opt.sampling.greedy());
    proposer = lookup_proposer.get();
  }
  if (model_proposer && lookup_proposer) {
    fallback = std::make_unique<FallbackProposer>(lookup_proposer.get(), model_proposer.get());
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
      CalibrateStepCosts(*model, draft.get(), policy.options().k_max, &costs, co);
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
  GenerateResult r = speculative
                         ? GenerateSpeculative(*model, proposer, prompt, spec_opt, &stats)
                         : GeneratePlain(*model, prompt, opt);
  std::vector<int> shown = r.tokens;
  if (r.hit_eos) shown.pop_back();
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
    };
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
  cmd->add_option("--max-tokens", a->max_tokens, "most tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", a->temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-p", a->top_p, "nucleus mass")->capture_default_str();
  cmd->add_option("--top-k", a->top_k, "0 = off")->capture_default_str();
  cmd->add_option("--seed", a->seed, "sampling seed")->capture_default_str();
  cmd->add_option("--device", a->device, "cpu or cuda")->capture_default_str();
  cmd->add_option("--dtype", a->dtype,
                  "target weights: auto (float32 on cpu), float32, float16 or bfloat16 (on cpu: "
                  "16-bit weights, float32 arithmetic; half the bytes per decode step)")
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
