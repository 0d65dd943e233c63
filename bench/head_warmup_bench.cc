// EAGLE-3 head warm-up at init (trainer/head_warmup.h, `specloop draft init --warmup-tokens`).
// For each budget of --budgets, a head grown from --target (Eagle3Head::InitFromTarget, seed 1,
// the whole vocabulary up to 32000 ids) and warmed up on that many tokens the target samples
// itself, then saved and loaded back as `--draft` loads it; beside them the draft models of
// --drafts (reference). Each is measured on held-out prompts (the first --prompts of
// SHARED/prompts/<domain>.jsonl, cut to their last 128 tokens; warm-up reads no prompt) by
// speculative decoding at k = --k, greedy and at each other temperature of --temperatures
// (prompt i seeded i): mean acceptance length (1 + accepted per verified block, vLLM's) and
// alpha (accepted / tested, the engine's per-token rate), per domain and over all of them.
// Warm-up seconds (wall: sampling, training, total; and the process's CPU seconds, the cost on
// one core whatever the neighbours take): the median over --reps warm-ups of the same budget
// (which must give the same head: checked, "warmup_deterministic" 1/0).
// Prints JSON lines {"name", "params", "value", "unit"}.
// Usage: head_warmup_bench [--shared DIR] [--target NAME] [--budgets 0,4096,...]
//          [--drafts draft-mix-1m] [--domains python,prose] [--prompts N] [--tokens N] [--k K]
//          [--temperatures 0,0.8] [--threads N] [--reps N] [--batch-sequences N]
//          [--sequence-tokens N] [--prefix-tokens N] [--lr-width X (lr x hidden)]
//          [--unroll-steps N]
//          [--decay 0|1] [--seed S (the warm-up's)] [--batch-records N]
//          [--temperature T (the warm-up's sampling)]
//          [--show-samples N (prints N warm-up samples to standard error)]
#include <c10/core/InferenceMode.h>
#include <unistd.h>

#include <cstdlib>
#include <ctime>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>

#include "bench/bench_util.h"
#include "common/base/remove_tree.h"
#include "common/engine/draft.h"
#include "common/engine/speculative_decoder.h"
#include "common/model/threads.h"
#include "common/tokenizer/tokenizer.h"
#include "trainer/head_warmup.h"
#include "trainer/synthetic_traffic.h"

namespace specloop {
namespace {

using bench::Emit;
using nlohmann::json;

void Die(const Status& s) {
  if (s.ok()) return;
  std::cerr << s.ToString() << "\n";
  std::exit(1);
}

struct Eval {
  std::vector<std::string> domains;
  std::map<std::string, std::vector<std::vector<int>>> prompts;
  int tokens = 64, k = 4;
  std::vector<float> temperatures;
};

// Decodes every prompt with `draft` and emits its acceptance under `params` (+ domain,
// temperature).
void Measure(const LlamaModel& target, const Draft& draft, const Eval& e, const json& params) {
  c10::InferenceMode guard;
  for (const float temperature : e.temperatures) {
    SpeculativeStats all;
    for (const std::string& domain : e.domains) {
      SpeculativeStats stats;
      const auto& prompts = e.prompts.at(domain);
      for (size_t i = 0; i < prompts.size(); ++i) {
        SpeculativeOptions o;
        o.k = e.k;
        o.generate.max_tokens = e.tokens;
        o.generate.stop_at_eos = false;
        o.generate.sampling.temperature = temperature;
        o.generate.sampling.seed = i;
        const std::unique_ptr<Proposer> proposer = NewDraftProposer(draft, o.generate.sampling, 0);
        SpeculativeStats s;
        GenerateSpeculative(target, proposer.get(), prompts[i], o, &s);
        stats.Add(s);
      }
      all.Add(stats);
      json p = params;
      p["domain"] = domain;
      p["temperature"] = temperature;
      Emit("acceptance_length", p, stats.mean_acceptance_length(), "tokens");
      Emit("alpha", p, stats.acceptance_rate(), "ratio");
    }
    json p = params;
    p["domain"] = "all";
    p["temperature"] = temperature;
    Emit("acceptance_length", p, all.mean_acceptance_length(), "tokens");
    Emit("alpha", p, all.acceptance_rate(), "ratio");
  }
}

bool SameWeights(const Eagle3Head& a, const Eagle3Head& b) {
  const auto wa = a.NamedWeights(), wb = b.NamedWeights();
  for (size_t i = 0; i < wa.size(); ++i) {
    if (!at::equal(wa[i].second, wb[i].second)) return false;
  }
  return wa.size() == wb.size();
}

}  // namespace
}  // namespace specloop

int main(int argc, char** argv) {
  using namespace specloop;
  std::string shared = SPECLOOP_SHARED_DIR, target_name = "target-wide-46m";
  std::vector<std::string> budgets = {"0", "4096", "8192", "16384"}, drafts = {"draft-mix-1m"};
  std::string temperatures = "0,0.8";
  int n_prompts = 8, threads = 1, reps = 1, show = 0;
  Eval e;
  e.domains = {"python", "prose"};
  trainer::HeadWarmupOptions w;
  for (int i = 1; i + 1 < argc; i += 2) {
    const char* flag = argv[i];
    const char* value = argv[i + 1];
    if (!std::strcmp(flag, "--shared")) shared = value;
    else if (!std::strcmp(flag, "--target")) target_name = value;
    else if (!std::strcmp(flag, "--budgets")) budgets = bench::SplitCommas(value);
    else if (!std::strcmp(flag, "--drafts")) drafts = bench::SplitCommas(value);
    else if (!std::strcmp(flag, "--domains")) e.domains = bench::SplitCommas(value);
    else if (!std::strcmp(flag, "--prompts")) n_prompts = std::atoi(value);
    else if (!std::strcmp(flag, "--tokens")) e.tokens = std::atoi(value);
    else if (!std::strcmp(flag, "--k")) e.k = std::atoi(value);
    else if (!std::strcmp(flag, "--temperatures")) temperatures = value;
    else if (!std::strcmp(flag, "--threads")) threads = std::atoi(value);
    else if (!std::strcmp(flag, "--reps")) reps = std::max(1, std::atoi(value));
    else if (!std::strcmp(flag, "--batch-sequences")) w.batch_sequences = std::atoi(value);
    else if (!std::strcmp(flag, "--sequence-tokens")) w.sequence_tokens = std::atoi(value);
    else if (!std::strcmp(flag, "--prefix-tokens")) w.prefix_tokens = std::atoi(value);
    else if (!std::strcmp(flag, "--lr-width")) w.lr_width = std::atof(value);
    else if (!std::strcmp(flag, "--show-samples")) show = std::atoi(value);
    else if (!std::strcmp(flag, "--decay")) w.decay = std::atoi(value) != 0;
    else if (!std::strcmp(flag, "--seed")) w.seed = std::strtoull(value, nullptr, 10);
    else if (!std::strcmp(flag, "--batch-records")) w.batch_records = std::atoi(value);
    else if (!std::strcmp(flag, "--temperature")) w.temperature = std::atof(value);
    else if (!std::strcmp(flag, "--unroll-steps")) w.unroll.steps = std::atoi(value);
    else {
      std::cerr << "unknown flag " << flag << "\n";
      return 2;
    }
  }
  for (const std::string& t : bench::SplitCommas(temperatures)) {
    e.temperatures.push_back(std::atof(t.c_str()));
  }
  SetComputeThreads(threads);
  const std::string target_dir = shared + "/models/" + target_name;
  const std::unique_ptr<LlamaModel> target = bench::LoadOrDie(target_dir, "float32");
  for (const std::string& d : e.domains) {
    Die(trainer::LoadDomainPrompts(shared, d, target_dir, n_prompts, 128, &e.prompts[d]));
  }
  if (show > 0) {  // what the warm-up trains on, to standard error
    std::unique_ptr<Tokenizer> tok;
    Die(Tokenizer::Load(target_dir, &tok));
    std::unique_ptr<Eagle3Head> head;
    Die(Eagle3Head::InitFromTarget(*target, {}, &head));
    std::vector<trainer::FeatureExample> examples;
    Die(trainer::SampleWarmupExamples(*target, *head, w, 0,
                                      std::vector<int>(show, w.sequence_tokens), &examples));
    for (size_t i = 0; i < examples.size(); ++i) {
      const std::vector<int64_t>& t = examples[i].tokens;
      std::cerr << "---- sample " << i << " (" << t.size() << " tokens)\n"
                << tok->Decode(std::vector<int>(t.begin(), t.end())) << "\n";
    }
  }
  const json run = {{"target", target_name}, {"threads", threads}, {"k", e.k},
                    {"prompts", n_prompts}, {"tokens", e.tokens}};
  const std::string tmp = std::filesystem::temp_directory_path().string() +
                          "/head_warmup_bench-" + std::to_string(getpid());
  LoadOptions load;
  load.dtype = "float32";

  for (const std::string& draft_name : drafts) {
    Draft draft;
    Die(LoadDraft(shared + "/models/" + draft_name, *target, load, &draft));
    json p = run;
    p["draft"] = draft_name;
    Measure(*target, draft, e, p);
  }
  for (const std::string& budget : budgets) {
    w.tokens = std::atoll(budget.c_str());
    json p = run;
    p["draft"] = "head";
    p["warmup_tokens"] = w.tokens;
    p["batch_sequences"] = w.batch_sequences;
    p["sequence_tokens"] = w.sequence_tokens;
    p["prefix_tokens"] = w.prefix_tokens;
    p["lr"] = w.lr_width / static_cast<double>(target->config().hidden_size);
    p["batch_records"] = w.batch_records;
    p["seed"] = w.seed;
    p["decay"] = w.decay;
    p["sample_temperature"] = w.temperature;
    p["unroll_steps"] = w.unroll.steps;
    std::vector<double> sample_s, train_s, total_s, cpu_s;
    std::unique_ptr<Eagle3Head> first;
    bool deterministic = true;
    trainer::HeadWarmupReport report;
    for (int rep = 0; rep < reps; ++rep) {
      std::unique_ptr<Eagle3Head> head;
      Die(Eagle3Head::InitFromTarget(*target, {}, &head));
      const std::clock_t c0 = std::clock();
      Die(trainer::WarmUpHead(*target, head.get(), w, &report));
      cpu_s.push_back(static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC);
      sample_s.push_back(report.sample_seconds);
      train_s.push_back(report.train_seconds);
      total_s.push_back(report.sample_seconds + report.train_seconds);
      if (!first) {
        first = std::move(head);
      } else {
        deterministic = deterministic && SameWeights(*first, *head);
      }
    }
    Emit("warmup_sample_seconds", p, bench::Median(sample_s), "s");
    Emit("warmup_train_seconds", p, bench::Median(train_s), "s");
    Emit("warmup_seconds", p, bench::Median(total_s), "s");
    Emit("warmup_cpu_seconds", p, bench::Median(cpu_s), "s");
    Emit("warmup_loss_first", p, report.first_loss, "loss");
    Emit("warmup_loss_last", p, report.last_loss, "loss");
    Emit("warmup_sequences", p, report.sequences, "sequences");
    if (reps > 1) Emit("warmup_deterministic", p, deterministic ? 1 : 0, "bool");
    const std::string dir = tmp + "/head-" + budget;
    Die(first->Save(dir, "float32"));
    Draft draft;
    Die(LoadDraft(dir, *target, load, &draft));
    Measure(*target, draft, e, p);
  }
  (void)RemoveTree(tmp);
  return 0;
}
