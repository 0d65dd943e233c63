// Speculative decoding benchmark, one run on `--target` (default target-wide-46m, the speed
// fixture; target-6m is the do-no-harm case), `--dtype` of its weights (default float32; a
// list, e.g. float32,float16,bfloat16, loads the target in each and runs every dtype's arms in
// the same rotation over the same prompts: "dtype_vs_first" is then an arm's tokens/s over the
// same arm in the first dtype, the median of per-repetition ratios) and `--threads` (default 1).
// It prints first the machine's read bandwidth (one thread and every core) and plain decoding's
// weight bytes per second as a share of it. Then for each draft, domain and dtype, plain vs speculative tokens/s at k = 1..8 and auto; measured alpha (per-token
// acceptance, geometric estimate), c (draft cost per token over one target decode step) and
// beta(k) (target forward of k + 1 positions over one of 1 position), and the measured
// speedup beside the predicted tau(alpha, k) / (k c + beta(k)).
// Rates are decode-phase tokens/s (the target's prompt processing excluded, the draft's catch-up
// on the prompt included). Prints JSON lines {"name", "params", "value", "unit"}. Every arm
// (k = 1..8, auto, ...) decodes each prompt in lockstep with a plain run of the same prompt,
// step by step, so that the two share the machine's state (see Lockstep). "speedup" is an
// arm's rate over plain decoding beside the k = 0 path (plain undisturbed by a draft);
// "lockstep_speedup" over the plain runs beside the arm itself (precise, but favouring arms
// that run the draft: "plain_beside_vs_beside_k0"). "auto_vs_plain" and "k0_path_vs_plain"
// are lockstep ratios. Medians over `--reps` repetitions, the arms taking the prompts in turn
// within each; ratios are medians of the per-repetition ratios. Auto keeps one policy and one
// step-cost table per draft and domain (serving keeps a policy per domain and draft version);
// it first decodes the domain's prompts once untimed, as a long-running server's policy has
// long learnt alpha and costs.
// Also "k0_path_vs_plain": the speculative decoder held at k = 0 against plain decoding, the
// per-step cost of the speculative path itself (auto's floor when it never speculates).
// `--no-fixed` leaves out k = 1..8 (shorter); `--ks 4` runs those fixed k only.
// `--target` and the drafts (`--drafts`): a name under SHARED/models, or a directory (any name
// with a '/'). A draft is a draft model or an EAGLE-3 head, loaded as `--draft` loads them
// (LoadDraft: a head in the target's dtype). A head's c is its one-row drafting forward over the
// target's one-row step, both at 256 cached positions, timed alternately (its block's first
// forward, over the positions verified since the last block, is on top); auto's policy learns the head's cost from its
// timings, as the server's does.
// Also per arm mean_acceptance_length (1 + accepted per verified draft, as vLLM's).
// Prompts: SHARED/prompts/DOMAIN.jsonl, or DIR/DOMAIN.jsonl with `--prompts-dir DIR` (e.g.
// the held-out prompts day0_bench writes).
// Usage: spec_bench [--shared DIR] [--target NAME] [--dtype D[,D2...]] [--threads N]
//                   [--prompts N] [--tokens N] [--reps N] [--temperature T]
//                   [--drafts a,b] [--domains a,b] [--no-fixed] [--ks 1,4]
//                   [--prompts-dir DIR]
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>

#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "bench/bench_util.h"
#include "common/engine/draft.h"
#include "common/engine/draft_model_proposer.h"
#include "common/engine/speculative_decoder.h"
#include "common/model/threads.h"
#include "common/spec/acceptance.h"
#include "common/tokenizer/tokenizer.h"

namespace specloop {
namespace {

using bench::Emit;
using bench::LoadOrDie;
using bench::Median;

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// Decodes plainly (`plain`) and by another arm (`other`) in lockstep: whichever has less decode
// time so far steps next, so that both sample the machine's speed over the same stretch of
// time. On this shared machine a step's time drifts by ~18% (log sd) and stays correlated over
// tens of steps (0.92 at lag 1, 0.73 at 10, 0.43 at 100); plain-vs-plain over 400 steps in
// lockstep differs by 0.45% (sd), two runs of a request one after the other by ~10%.
void Lockstep(PlainGeneration* plain, SpeculativeGeneration* other) {
  while (!plain->finished() || !other->finished()) {
    const bool plain_next =
        !plain->finished() &&
        (other->finished() || plain->result().decode_seconds <= other->decode_seconds());
    if (plain_next) {
      plain->Step();
    } else {
      other->Step();
    }
  }
}

// The directory of model or draft `name`: a path as given, else SHARED/models/NAME.
std::string DraftDir(const std::string& shared, const std::string& name) {
  return name.find('/') == std::string::npos ? shared + "/models/" + name : name;
}

// A head's one-row drafting forward over the target's one-row step, both after `context`
// cached positions, timed alternately (2 untimed rounds, then 15): the median per-round ratio.
double HeadCostRatio(const LlamaModel& target, const Eagle3Head& head, int context) {
  Eagle3Head::Cache cache = head.NewCache(context + 8);
  std::vector<int64_t> tokens(context);
  for (int i = 0; i < context; ++i) tokens[i] = (5 + 11 * i) % head.config().layer.vocab_size;
  head.Forward({{&cache, at::randn({context, head.feature_width()}), tokens}}, nullptr);
  KVCache target_cache = target.NewCache(context + 8);
  ForwardInput prefill;
  prefill.cache = &target_cache;
  prefill.tokens = tokens;
  target.Forward({prefill});
  const at::Tensor own = at::randn({1, head.hidden_size()});
  std::vector<double> ratios;
  for (int r = 0; r < 17; ++r) {
    auto t0 = Clock::now();
    head.Forward({{&cache, own, {9}}}, nullptr);
    const double h = std::chrono::duration<double>(Clock::now() - t0).count();
    cache.length = context;
    ForwardInput step;
    step.cache = &target_cache;
    step.tokens = {9};
    t0 = Clock::now();
    target.Forward({step});
    const double t = std::chrono::duration<double>(Clock::now() - t0).count();
    target_cache.Truncate(context);
    if (r >= 2) ratios.push_back(h / t);
  }
  return Median(ratios);
}

}  // namespace
}  // namespace specloop

int main(int argc, char** argv) {
  using namespace specloop;
  std::string shared = SPECLOOP_SHARED_DIR;
  std::string target_name = "target-wide-46m", dtype = "float32";
  int n_prompts = 5, max_tokens = 64, reps = 5, threads = 1;
  float temperature = 0.0f;
  bool fixed = true;
  std::vector<std::string> drafts = {"draft-mix-1m", "draft-prose-1m"};
  std::vector<std::string> domains = {"prose", "python", "c", "legal", "docs"};
  std::vector<int> fixed_ks = {1, 2, 3, 4, 5, 6, 7, 8};
  std::string prompts_dir;
  for (int i = 1; i < argc; ++i) {
    const char* flag = argv[i];
    if (!std::strcmp(flag, "--no-fixed")) {
      fixed = false;
      continue;
    }
    if (i + 1 >= argc) break;
    const char* value = argv[++i];
    if (!std::strcmp(flag, "--drafts")) drafts = bench::SplitCommas(value);
    if (!std::strcmp(flag, "--domains")) domains = bench::SplitCommas(value);
    if (!std::strcmp(flag, "--shared")) shared = value;
    if (!std::strcmp(flag, "--target")) target_name = value;
    if (!std::strcmp(flag, "--dtype")) dtype = value;
    if (!std::strcmp(flag, "--threads")) threads = std::atoi(value);
    if (!std::strcmp(flag, "--prompts")) n_prompts = std::atoi(value);
    if (!std::strcmp(flag, "--tokens")) max_tokens = std::atoi(value);
    if (!std::strcmp(flag, "--reps")) reps = std::atoi(value);
    if (!std::strcmp(flag, "--temperature")) temperature = std::atof(value);
    if (!std::strcmp(flag, "--prompts-dir")) prompts_dir = value;
    if (!std::strcmp(flag, "--ks")) {
      fixed_ks.clear();
      for (const std::string& k : bench::SplitCommas(value)) fixed_ks.push_back(std::atoi(k.c_str()));
    }
  }
  for (int k : fixed_ks) {
    if (k < 1 || k > 8) {
      std::cerr << "spec_bench: --ks takes k in 1..8\n";
      return 2;
    }
  }
  if (prompts_dir.empty()) prompts_dir = shared + "/prompts";
  for (int t : {1, AvailableCores()}) {
    Emit("read_bandwidth", {{"threads", t}, {"buffer_mb", 512}}, bench::ReadBandwidth(t) / 1e9,
         "GB/s");
    if (AvailableCores() == 1) break;
  }
  const std::vector<std::string> dtypes = bench::SplitCommas(dtype);
  if (dtypes.empty()) {
    std::cerr << "spec_bench: --dtype needs a dtype\n";
    return 2;
  }
  SetComputeThreads(threads);
  c10::InferenceMode guard;
  const std::string target_dir = DraftDir(shared, target_name);  // a name or a directory
  std::unique_ptr<Tokenizer> tok;
  if (!Tokenizer::Load(target_dir, &tok).ok()) return 1;
  const int k_max = 8;
  // Per dtype: the target, and its costs measured once for the run: target forward of n
  // positions (after 16 and after 256 cached tokens; c and beta are at 256).
  const CalibrationOptions calibration;
  const size_t D = dtypes.size();
  std::vector<std::unique_ptr<LlamaModel>> targets;
  std::vector<StepCostTable> costs(D);
  std::vector<double> t1(D);
  for (size_t d = 0; d < D; ++d) {
    targets.push_back(LoadOrDie(target_dir, dtypes[d]));
    CalibrateStepCosts(*targets[d], nullptr, k_max, &costs[d], calibration);
    t1[d] = costs[d].TargetSeconds(1, calibration.context);
    const json run = {{"target", target_name}, {"dtype", dtypes[d]}, {"threads", threads}};
    Emit("plain_weight_bytes_per_second", run,
         targets[d]->StreamedWeightBytes() /
             costs[d].TargetSeconds(1, calibration.short_context) / 1e9,
         "GB/s");
    for (int n = 1; n <= k_max + 1; ++n) {
      for (int context : {calibration.short_context, calibration.context}) {
        Emit("target_forward_latency",
             {{"positions", n}, {"context", context}, {"dtype", dtypes[d]}},
             costs[d].TargetSeconds(n, context) * 1e6, "us");
      }
    }
  }

  GenerateOptions gen;
  gen.max_tokens = max_tokens;
  gen.sampling.temperature = temperature;
  gen.stop_at_eos = false;
  std::map<std::string, std::vector<std::vector<int>>> prompts;
  for (const auto& d : domains) {
    std::ifstream in(prompts_dir + "/" + d + ".jsonl");
    if (!in) {
      std::cerr << "spec_bench: cannot read " << prompts_dir << "/" << d << ".jsonl\n";
      return 1;
    }
    for (std::string line; (int)prompts[d].size() < n_prompts && std::getline(in, line);) {
      std::vector<int> ids = tok->Encode(json::parse(line)["prompt"].get<std::string>());
      if (ids.size() > 256) ids.erase(ids.begin(), ids.end() - 256);
      ids.insert(ids.begin(), 1);
      prompts[d].push_back(ids);
    }
  }

  CalibrationOptions auto_calibration = calibration;
  auto_calibration.sampling = gen.sampling;

  for (const std::string& draft_name : drafts) {
    // The draft, loaded against each dtype's target (a draft model's weights stay as stored,
    // as serve's --draft loads them; a head takes its target's dtype).
    std::vector<Draft> draft(D);
    std::vector<double> c(D);
    for (size_t d = 0; d < D; ++d) {
      LoadOptions draft_load;
      if (Status s = LoadDraft(DraftDir(shared, draft_name), *targets[d], draft_load, &draft[d]);
          !s.ok()) {
        std::cerr << "spec_bench: --drafts " << draft_name << ": " << s.ToString() << "\n";
        return 1;
      }
      if (draft[d].head) {
        c[d] = HeadCostRatio(*targets[d], *draft[d].head, calibration.context);
      } else {
        StepCostTable draft_cost;
        CalibrateStepCosts(*targets[d], draft[d].model.get(), 0, &draft_cost);
        c[d] = draft_cost.DraftSeconds(1) / t1[d];
      }
      Emit("draft_cost_ratio_c",
           {{"draft", draft_name}, {"kind", draft[d].kind()}, {"dtype", dtypes[d]}}, c[d],
           "ratio");
    }
    for (const auto& domain : domains) {
      // k = -1: auto (one policy per draft, domain and dtype, learning across prompts, as
      // serving keeps one per domain); k = 0: plain decoding; k = -2: the speculative decoder
      // at k = 0. An arm is (dtype, k).
      constexpr int kAuto = -1, kPathAtZero = -2;
      typedef std::pair<size_t, int> ArmKey;
      std::map<ArmKey, SpeculativeStats> stats;
      std::vector<ArmKey> arms;  // all but plain, which runs beside each
      for (size_t d = 0; d < D; ++d) {
        if (fixed) {
          for (int k : fixed_ks) arms.push_back({d, k});
        }
        arms.push_back({d, kAuto});
        arms.push_back({d, kPathAtZero});
      }
      std::vector<SpeculationPolicy> policy(D);
      std::vector<StepCostTable> policy_costs(D);
      for (size_t d = 0; d < D; ++d) {
        // A head's cost is learnt from its timings (null: as the server calibrates for one).
        CalibrateStepCosts(*targets[d], draft[d].model.get(), k_max, &policy_costs[d],
                           auto_calibration);
        for (const auto& prompt : prompts[domain]) {  // auto's warm-up, untimed
          std::unique_ptr<Proposer> proposer = NewDraftProposer(draft[d], gen.sampling, 0.0f);
          SpeculativeOptions o;
          o.generate = gen;
          o.policy = &policy[d];
          o.costs = &policy_costs[d];
          GenerateSpeculative(*targets[d], proposer.get(), prompt, o, nullptr);
        }
      }
      // Per rep: each arm's tokens/s and that of the plain runs paired with it.
      std::map<ArmKey, std::vector<double>> tps, paired_plain;
      for (int rep = 0; rep < reps; ++rep) {
        // Every arm on each prompt in turn, each in lockstep with its own plain run (of its
        // dtype); the order rotates from prompt to prompt, so that no arm always runs first or
        // right after the same one.
        std::map<ArmKey, double> seconds, plain_seconds;
        std::map<ArmKey, int64_t> tokens, plain_tokens;
        size_t turn = rep;
        for (const auto& prompt : prompts[domain]) {
          for (size_t j = 0; j < arms.size(); ++j) {
            const ArmKey arm = arms[(j + turn) % arms.size()];
            const size_t d = arm.first;
            const int k = arm.second;
            std::unique_ptr<Proposer> proposer = NewDraftProposer(draft[d], gen.sampling, 0.0f);
            SpeculativeOptions o;
            o.generate = gen;
            o.k = std::max(k, 0);
            if (k == kAuto) {
              o.policy = &policy[d];
              o.costs = &policy_costs[d];
            }
            PlainGeneration plain(*targets[d], prompt, gen);
            SpeculativeGeneration other(*targets[d], proposer.get(), prompt, o);
            Lockstep(&plain, &other);
            stats[arm].Add(other.stats());
            // Decode phase only: the target's prompt processing is the same work in both and
            // dilutes any decoding speedup; the draft's catch-up on the prompt is in the decode
            // phase (work only speculation needs). Plain's first token comes from its prefill.
            seconds[arm] += other.decode_seconds();
            tokens[arm] += other.result().tokens.size();
            plain_seconds[arm] += plain.result().decode_seconds;
            plain_tokens[arm] += plain.result().tokens.size() - 1;
          }
          ++turn;
        }
        for (const ArmKey& arm : arms) {
          tps[arm].push_back(tokens[arm] / seconds[arm]);
          paired_plain[arm].push_back(plain_tokens[arm] / plain_seconds[arm]);
        }
      }
      for (size_t d = 0; d < D; ++d) {
        const ArmKey path_at_zero = {d, kPathAtZero};
        // Two speedups per arm and rep. Over plain decoding beside the k = 0 path: plain as it
        // runs alone, nothing evicting the target's weights between its steps; the arm and that
        // plain run a few requests apart, so this carries the machine's drift (~2% a rep). And
        // over plain decoding in lockstep with the arm: precise, and exact for arms that never
        // run the draft, but beside one that does, plain's steps find the target's weights
        // partly evicted by the draft's, and the arm looks faster than it is alone (see
        // plain_beside_vs_beside_k0: plain 4-17% slower beside fixed k in one run).
        auto speedup = [&](int k, int rep) {
          return k == 0 ? 1.0 : tps[{d, k}][rep] / paired_plain[path_at_zero][rep];
        };
        auto lockstep = [&](int k) {
          std::vector<double> r;
          for (int rep = 0; rep < reps; ++rep) {
            r.push_back(tps[{d, k}][rep] / paired_plain[{d, k}][rep]);
          }
          return Median(r);
        };
        // Between arms: the median over reps of the ratio of their speedups (plain: 1).
        auto ratio = [&](int a, int b) {
          std::vector<double> r;
          for (int rep = 0; rep < reps; ++rep) r.push_back(speedup(a, rep) / speedup(b, rep));
          return Median(r);
        };
        // Against the first dtype: the median over reps of this dtype's tokens/s over the
        // first's, for arm k (plain: the plain runs beside the k = 0 path).
        auto vs_first = [&](int k) {
          std::vector<double> r;
          for (int rep = 0; rep < reps; ++rep) {
            r.push_back(k == 0 ? paired_plain[path_at_zero][rep] /
                                     paired_plain[{0, kPathAtZero}][rep]
                               : tps[{d, k}][rep] / tps[{0, k}][rep]);
          }
          return Median(r);
        };
        const double plain = Median(paired_plain[path_at_zero]);
        const json base = {{"draft", draft_name}, {"kind", draft[d].kind()},
                           {"domain", domain},    {"temperature", temperature},
                           {"tokens", max_tokens}, {"dtype", dtypes[d]}};
        json p = base;
        p["k"] = 0;
        Emit("tokens_per_second", p, plain, "tokens/s");
        if (d > 0) {
          p["first_dtype"] = dtypes[0];
          Emit("dtype_vs_first", p, vs_first(0), "ratio");
        }
        double best_fixed = 0;
        int best_k = 0;
        Emit("k0_path_vs_plain", base, lockstep(kPathAtZero), "ratio");
        for (const ArmKey& arm : arms) {
          const int k = arm.second;
          if (arm.first != d || k == kPathAtZero) continue;
          const SpeculativeStats& s = stats[arm];
          const double measured = Median(tps[arm]);
          p = base;
          p["k"] = k < 0 ? json("auto") : json(k);
          Emit("tokens_per_second", p, measured, "tokens/s");
          Emit("speedup", p, ratio(k, 0), "ratio");
          Emit("lockstep_speedup", p, lockstep(k), "ratio");
          if (d > 0) {
            json q = p;
            q["first_dtype"] = dtypes[0];
            Emit("dtype_vs_first", q, vs_first(k), "ratio");
          }
          // Plain decoding slowed by its partner: its rate beside this arm over that beside
          // the k = 0 path.
          std::vector<double> beside;
          for (int rep = 0; rep < reps; ++rep) {
            beside.push_back(paired_plain[arm][rep] / paired_plain[path_at_zero][rep]);
          }
          Emit("plain_beside_vs_beside_k0", p, Median(beside), "ratio");
          // Geometric per-token acceptance: accepted / (accepted + steps that saw a rejection).
          int64_t full = 0;  // steps that accepted their whole block
          if (k > 0 && !s.accepted_at.empty()) full = s.accepted_at[k - 1];
          const double alpha = s.accepted + (s.steps - full) > 0
                                   ? double(s.accepted) / (s.accepted + s.steps - full)
                                   : 0.0;
          Emit("acceptance_rate", p, s.acceptance_rate(), "ratio");
          Emit("tokens_per_step", p, s.tokens_per_step(), "tokens");
          Emit("mean_acceptance_length", p, s.mean_acceptance_length(), "tokens");
          if (k > 0) {
            Emit("alpha", p, alpha, "ratio");
            const double beta = costs[d].TargetSeconds(k + 1, calibration.context) / t1[d];
            Emit("beta", p, beta, "ratio");
            const double tau = spec::ExpectedTokensPerStep(alpha, k);
            Emit("predicted_speedup", p, tau / (k * c[d] + beta), "ratio");
            if (measured > best_fixed) {
              best_fixed = measured;
              best_k = k;
            }
          } else {
            Emit("k_mean", p, s.k_mean(), "tokens");
            if (fixed) Emit("auto_vs_best_fixed", p, ratio(kAuto, best_k), "ratio");
            // Auto decodes plainly but for probes where speculation does not pay: there the
            // lockstep ratio is exact and precise (where it speculates, see lockstep_speedup).
            Emit("auto_vs_plain", p, lockstep(kAuto), "ratio");
            p["best_fixed_k"] = best_k;
          }
        }
      }
    }
  }
  return 0;
}
