// Engine benchmark: what one CPU forward costs, against what the machine allows.
//
// For target-wide-46m (the speed fixture: its weights stream from memory at every step) in
// float32, float16 and bfloat16 (`--dtypes`), on 1 thread and on every core, and for target-6m
// and draft-mix-1m:
//   - forward_latency and forward_cost_ratio: one forward of n = 1, 2, 3, 5, 9, 16 new
//     positions after 16 cached ones, as a multiple of one position (the verification cost of
//     k = n - 1 draft tokens);
//   - dtype_vs_float32: the same forward in a 16-bit dtype over float32's (same n, same run);
//   - compute_floor_ratio (one thread): the least forward_cost_ratio the arithmetic allows, a
//     forward of n rows doing n multiply-adds per weight at kernel_multiply_add_rate (the
//     kernel's best tile on float32 weights that sit in L1: no memory to wait for) against the
//     measured one-position forward: a row's multiply-adds are fixed, one float32 fused
//     multiply-add per weight whatever the weights' dtype;
//   - plain_decode_tokens_per_second at 16 and 300 cached positions (one position a step),
//     the weight bytes per second that is, and its share of the measured read bandwidth;
// plus read_bandwidth (a streaming read of 512 MB, 1 thread and every core).
// The arms of one thread count, every dtype's together, are timed round-robin, one forward each
// in turn (dtypes alternating), and every ratio is the median of per-round ratios, so the
// machine's drift cancels; noise_same_arm_ratio is two identical 1-position arms compared the
// same way. `--clock cpu` times the one-thread arms by the thread's CPU time (on a shared
// machine, time the scheduler gave to others does not count; waits for memory do).
//
// Feature drafts (issue 46; one thread, as `specloop up` serves on a 2-core machine): an
// EAGLE-3 head for target-wide-46m (each of `--dtypes`) and target-6m, in its target's dtype
// as LoadDraft loads it (Eagle3Head::InitFromTarget: the weights do not change the cost),
// at 256 cached positions, batch 1 and 16 sequences, timed round-robin with
//   target_step          the target's one-row decode step (the unit of every fraction)
//   target_step_features the same step returning the head's three layers' features
//   target_verify        the target's forward of k + 1 rows with features (k = 4)
//   draft_model_step     draft-mix-1m's one-row step
//   head_step            the head's drafting step: one row of its own hidden state
//   head_first_forward   the block's first head forward: k + 1 rows of target features (fc)
//   target_step_again    an identical twin of target_step (the noise)
// feature_draft_latency (us) and feature_draft_cost_fraction (median of per-round ratios over
// target_step at the same batch); head_block_cost_fraction: one block of k drafts as
// FeatureDraftProposer runs it (the first forward + k - 1 steps) over a target step; and
// head_weight_bytes_fraction: the head's StreamedWeightBytes over the target's (the physical
// ratio; with fc, and without it as a drafting step reads).
// Prints JSON lines {"name", "params", "value", "unit"}. Usage:
//   engine_bench [--shared DIR] [--threads N] [--reps R] [--only forward|feature-draft]
//                [--dtypes float32,float16,bfloat16] [--clock wall|cpu]
//   (N: the "every core" count)
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "bench/bench_util.h"
#include "common/base/clock.h"
#include "common/kernels/linear_kernels.h"
#include "common/model/eagle3_head.h"
#include "common/model/threads.h"

namespace specloop {
namespace {

using bench::Emit;
using bench::Median;
using Clock = std::chrono::steady_clock;

// One arm: a forward of `n` new positions after `past` cached ones of `model` (weights in
// `dtype`), re-run from the same cache.
struct Arm {
  std::string name, dtype;
  const LlamaModel* model;
  int n, past;
  KVCache cache;
  std::vector<double> seconds;
};

// Seconds on a clock that only differences are taken of: steady wall time, or with `cpu` the
// calling thread's CPU time.
double ClockSeconds(bool cpu) {
  if (cpu) return ThreadCpuSeconds();
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

// Times every arm once per round, `reps` rounds; returns nothing, fills arm.seconds.
void RunRounds(std::vector<Arm>& arms, int reps, bool cpu_clock) {
  c10::InferenceMode guard;
  for (Arm& a : arms) {
    a.cache = a.model->NewCache(a.past + a.n);
    a.model->Forward({{&a.cache, std::vector<int64_t>(a.past, 5), false}});
  }
  for (int r = -2; r < reps; ++r) {  // two warm-up rounds
    for (Arm& a : arms) {
      const double t0 = ClockSeconds(cpu_clock);
      a.model->Forward({{&a.cache, std::vector<int64_t>(a.n, 7), true}});
      const double sec = ClockSeconds(cpu_clock) - t0;
      if (r >= 0) a.seconds.push_back(sec);
      a.cache.Truncate(a.past);
    }
  }
}

double MedianRatio(const Arm& a, const Arm& b) {
  std::vector<double> r;
  for (size_t i = 0; i < a.seconds.size(); ++i) r.push_back(a.seconds[i] / b.seconds[i]);
  return Median(r);
}

// Multiply-adds per second of LinearPacked's best case on this thread: 12 rows against a
// float32 matrix of 32 x 192 (24 KB, in L1 after the first pass), the fastest of 7 timings of
// 2,000 products. The ceiling of the forward's arithmetic, as read_bandwidth is of its memory.
double KernelMultiplyAddRate() {
  constexpr int64_t kRows = 12, kOut = 32, kIn = 192, kCalls = 2000;
  std::vector<float> w(kOut * kIn), x(kRows * kIn), out(kRows * kOut);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.001f * static_cast<float>(i % 97);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.01f * static_cast<float>(i % 89);
  const PackedMatrix packed(w.data(), WeightType::kFloat32, kOut, kIn);
  double best = 0;
  for (int t = 0; t < 7; ++t) {
    const double t0 = ClockSeconds(true);
    for (int64_t c = 0; c < kCalls; ++c) {
      LinearPacked(x.data(), kRows, packed, out.data(), kOut, 0, packed.panels(), false);
    }
    best = std::max(best, kCalls * kRows * kOut * kIn / (ClockSeconds(true) - t0));
  }
  return best;
}

// `models`: (dtype, model) pairs of the same model `name`, every arm of every dtype timed in
// one round-robin (the dtypes alternating within each arm).
void MeasureModels(const std::string& name,
                   const std::vector<std::pair<std::string, const LlamaModel*>>& models,
                   int threads, int reps, double bandwidth, double multiply_add_rate,
                   bool cpu_clock) {
  SetComputeThreads(threads);
  const std::vector<int> positions = {1, 2, 3, 5, 9, 16};
  const size_t D = models.size(), A = positions.size() + 2;
  std::vector<Arm> arms;  // arm i of dtype d at i * D + d
  for (size_t i = 0; i < A; ++i) {
    for (const auto& [dtype, model] : models) {
      if (i < positions.size()) {
        const int n = positions[i];
        arms.push_back({"n" + std::to_string(n), dtype, model, n, 16, {}, {}});
      } else if (i == positions.size()) {
        arms.push_back({"same", dtype, model, 1, 16, {}, {}});
      } else {
        arms.push_back({"past300", dtype, model, 1, 300, {}, {}});
      }
    }
  }
  RunRounds(arms, reps, cpu_clock);
  auto arm = [&](size_t i, size_t d) -> const Arm& { return arms[i * D + d]; };
  for (size_t d = 0; d < D; ++d) {
    const LlamaModel& m = *models[d].second;
    const nlohmann::json base = {{"model", name},
                                 {"dtype", models[d].first},
                                 {"threads", threads},
                                 {"isa", IsaName(ActiveIsa())},
                                 {"clock", cpu_clock ? "cpu" : "wall"}};
    const double bytes = static_cast<double>(m.StreamedWeightBytes());
    const double weights = bytes / (m.dtype() == at::kFloat ? 4 : 2);
    const double one = Median(arm(0, d).seconds);
    for (size_t i = 0; i < positions.size(); ++i) {
      nlohmann::json p = base;
      p.update({{"positions", positions[i]}, {"past", 16}});
      Emit("forward_latency", p, Median(arm(i, d).seconds) * 1e6, "us");
      if (i > 0) Emit("forward_cost_ratio", p, MedianRatio(arm(i, d), arm(0, d)), "x one position");
      if (threads == 1) {
        p["multiply_add_rate"] = multiply_add_rate;
        Emit("compute_floor_ratio", p, positions[i] * weights / multiply_add_rate / one,
             "x one position");
      }
      if (d > 0 && models[0].first == "float32") {
        Emit("dtype_vs_float32", p, MedianRatio(arm(i, d), arm(i, 0)), "x float32's time");
      }
    }
    Emit("noise_same_arm_ratio", base, MedianRatio(arm(positions.size(), d), arm(0, d)), "ratio");
    for (const Arm* a : {&arm(0, d), &arm(A - 1, d)}) {
      nlohmann::json p = base;
      p["past"] = a->past;
      const double sec = Median(a->seconds);
      Emit("plain_decode_tokens_per_second", p, 1.0 / sec, "tokens/s");
      Emit("weight_bytes_per_second", p, bytes / sec / 1e9, "GB/s");
      p["read_bandwidth_gb_s"] = bandwidth / 1e9;
      Emit("share_of_read_bandwidth", p, bytes / sec / bandwidth, "fraction");
    }
    Emit("long_context_vs_short", base, 1.0 / MedianRatio(arm(A - 1, d), arm(0, d)),
         "ratio (past 300 / 16)");
  }
}

// One timed piece of work, re-run from the same state: run() does it once and returns its
// seconds (restoring the caches after the timed part).
struct Step {
  std::string name;
  std::function<double()> run;
  std::vector<double> seconds;
};

// Two warm-up rounds, then `reps` rounds of every step once, the order rotating by one each
// round so that no step always follows the same one.
void RunSteps(std::vector<Step>& steps, int reps) {
  for (int r = -2; r < reps; ++r) {
    for (size_t j = 0; j < steps.size(); ++j) {
      Step& s = steps[(j + static_cast<size_t>(r + 2)) % steps.size()];
      const double sec = s.run();
      if (r >= 0) s.seconds.push_back(sec);
    }
  }
}

double MedianRatio(const Step& a, const Step& b) {
  std::vector<double> r;
  for (size_t i = 0; i < a.seconds.size(); ++i) r.push_back(a.seconds[i] / b.seconds[i]);
  return Median(r);
}

template <typename F>
double Time(F&& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// `batch` caches of `model`, each holding `context` positions of varied tokens.
std::vector<KVCache> FilledCaches(const LlamaModel& m, int batch, int context) {
  std::vector<KVCache> caches;
  for (int b = 0; b < batch; ++b) {
    caches.push_back(m.NewCache(context + 16));
    std::vector<int64_t> tokens(context);
    for (int i = 0; i < context; ++i) tokens[i] = (7 + 13 * i + 31 * b) % m.config().vocab_size;
    ForwardInput in;
    in.cache = &caches.back();
    in.tokens = std::move(tokens);
    m.Forward({in});
  }
  return caches;
}

// A forward of `rows` new positions on every cache, timed, then rolled back; with `layers`,
// the features of those layers returned too.
double TimeTarget(const LlamaModel& m, std::vector<KVCache>& caches, int rows,
                  const std::vector<int>* layers) {
  std::vector<ForwardInput> batch;
  const int64_t past = caches[0].length();
  for (KVCache& c : caches) {
    batch.emplace_back();
    batch.back().cache = &c;
    batch.back().tokens.assign(rows, 9);
  }
  at::Tensor hidden;
  const double sec = Time([&] {
    if (layers != nullptr) {
      m.Forward(batch, *layers, &hidden);
    } else {
      m.Forward(batch);
    }
  });
  for (KVCache& c : caches) c.Truncate(past);
  return sec;
}

// The head for `target` in the target's dtype, as LoadDraft loads one.
std::unique_ptr<Eagle3Head> HeadFor(const LlamaModel& target) {
  std::unique_ptr<Eagle3Head> init, head;
  Status s = Eagle3Head::InitFromTarget(target, {}, &init);
  TensorMap tensors;
  if (s.ok()) {
    for (auto& [name, t] : init->NamedWeights()) tensors[name] = t;
    LoadOptions o;
    o.device = target.device().str();
    const at::ScalarType t = target.dtype();
    o.dtype = t == at::kHalf ? "float16" : t == at::kBFloat16 ? "bfloat16" : "float32";
    s = Eagle3Head::FromTensors(init->config(), tensors, target, o, &head);
  }
  if (!s.ok()) {
    std::cerr << "engine_bench: head: " << s.ToString() << "\n";
    std::exit(1);
  }
  return head;
}

// The feature-draft arms of one target (see the head comment) at `context` cached positions.
void MeasureFeatureDraft(const std::string& name, const LlamaModel& target,
                         const std::string& dtype, const LlamaModel& draft, int reps) {
  SetComputeThreads(1);
  constexpr int kContext = 256, kK = 4;
  const std::unique_ptr<Eagle3Head> head = HeadFor(target);
  const std::vector<int>& layers = head->config().aux_layers;
  const nlohmann::json base = {{"target", name},       {"dtype", dtype},
                               {"threads", 1},         {"context", kContext},
                               {"isa", IsaName(ActiveIsa())}};
  const double target_bytes = static_cast<double>(target.StreamedWeightBytes());
  const double head_bytes = static_cast<double>(head->StreamedWeightBytes());
  const int64_t h = head->hidden_size();
  const double fc_bytes =
      static_cast<double>(h * head->feature_width()) * (target.dtype() == at::kFloat ? 4 : 2);
  {
    nlohmann::json p = base;
    p.update({{"head_weight_bytes", head_bytes}, {"target_weight_bytes", target_bytes},
              {"draft_vocab_size", head->draft_vocab_size()}, {"with_fc", true}});
    Emit("head_weight_bytes_fraction", p, head_bytes / target_bytes, "fraction of the target's");
    p["with_fc"] = false;
    p["head_weight_bytes"] = head_bytes - fc_bytes;
    Emit("head_weight_bytes_fraction", p, (head_bytes - fc_bytes) / target_bytes,
         "fraction of the target's");
  }
  for (int batch : {1, 16}) {
    c10::InferenceMode guard;
    std::vector<KVCache> tc = FilledCaches(target, batch, kContext);
    std::vector<KVCache> dc = FilledCaches(draft, batch, kContext);
    std::vector<Eagle3Head::Cache> hc;
    for (int b = 0; b < batch; ++b) {
      hc.push_back(head->NewCache(kContext + 16));
      std::vector<int64_t> tokens(kContext);
      for (int i = 0; i < kContext; ++i) tokens[i] = (5 + 11 * i + b) % target.config().vocab_size;
      head->Forward({{&hc.back(), at::randn({kContext, head->feature_width()}), tokens}},
                    nullptr);
    }
    const at::Tensor own = at::randn({1, h}), features = at::randn({kK + 1, head->feature_width()});
    auto time_head = [&](const at::Tensor& rows) {
      std::vector<Eagle3Head::Input> in;
      for (auto& c : hc) in.push_back({&c, rows, std::vector<int64_t>(rows.size(0), 9)});
      at::Tensor last;
      const double sec = Time([&] { head->Forward(in, &last); });
      for (auto& c : hc) c.length = kContext;
      return sec;
    };
    std::vector<Step> steps = {
        {"target_step", [&] { return TimeTarget(target, tc, 1, nullptr); }, {}},
        {"target_step_features", [&] { return TimeTarget(target, tc, 1, &layers); }, {}},
        {"target_verify", [&] { return TimeTarget(target, tc, kK + 1, &layers); }, {}},
        {"draft_model_step", [&] { return TimeTarget(draft, dc, 1, nullptr); }, {}},
        {"head_step", [&] { return time_head(own); }, {}},
        {"head_first_forward", [&] { return time_head(features); }, {}},
        {"target_step_again", [&] { return TimeTarget(target, tc, 1, nullptr); }, {}},
    };
    RunSteps(steps, reps);
    const Step& unit = steps[0];
    for (const Step& s : steps) {
      nlohmann::json p = base;
      p.update({{"batch", batch}, {"arm", s.name}});
      if (s.name == "target_verify" || s.name == "head_first_forward") p["rows"] = kK + 1;
      if (s.name == "draft_model_step") p["draft"] = "draft-mix-1m";
      Emit("feature_draft_latency", p, Median(s.seconds) * 1e6, "us");
      if (&s != &unit) Emit("feature_draft_cost_fraction", p, MedianRatio(s, unit), "x target step");
    }
    // One block of k drafts: the first forward (k + 1 rows at most) and k - 1 drafting steps.
    std::vector<double> block;
    for (size_t i = 0; i < unit.seconds.size(); ++i) {
      block.push_back((steps[5].seconds[i] + (kK - 1) * steps[4].seconds[i]) / unit.seconds[i]);
    }
    nlohmann::json p = base;
    p.update({{"batch", batch}, {"k", kK}});
    Emit("head_block_cost_fraction", p, Median(block), "x target step");
    Emit("head_block_cost_fraction_per_token", p, Median(block) / kK, "x target step");
  }
}

}  // namespace
}  // namespace specloop

int main(int argc, char** argv) {
  using namespace specloop;
  std::string shared = SPECLOOP_SHARED_DIR;
  int all = AvailableCores(), reps = 31;
  std::string only;
  std::vector<std::string> dtypes = {"float32", "float16", "bfloat16"};
  bool cpu_clock = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) {
      all = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--shared") && i + 1 < argc) {
      shared = argv[++i];
    } else if (!std::strcmp(argv[i], "--only") && i + 1 < argc &&
               (!std::strcmp(argv[i + 1], "forward") ||
                !std::strcmp(argv[i + 1], "feature-draft"))) {
      only = argv[++i];
    } else if (!std::strcmp(argv[i], "--dtypes") && i + 1 < argc) {
      dtypes = bench::SplitCommas(argv[++i]);
    } else if (!std::strcmp(argv[i], "--clock") && i + 1 < argc &&
               (!std::strcmp(argv[i + 1], "wall") || !std::strcmp(argv[i + 1], "cpu"))) {
      cpu_clock = !std::strcmp(argv[++i], "cpu");
    } else {
      std::cerr << "usage: engine_bench [--shared DIR] [--threads N] [--reps R] "
                   "[--only forward|feature-draft] [--dtypes float32,float16,bfloat16] "
                   "[--clock wall|cpu]\n";
      return 2;
    }
  }
  for (const std::string& d : dtypes) {
    if (d != "float32" && d != "float16" && d != "bfloat16") {
      std::cerr << "engine_bench: --dtypes takes float32, float16 and bfloat16, not " << d << "\n";
      return 2;
    }
  }
  if (dtypes.empty() || reps < 1) {
    std::cerr << "engine_bench: --dtypes needs a dtype and --reps at least 1\n";
    return 2;
  }
  std::vector<int> thread_counts = {1};
  if (all > 1) thread_counts.push_back(all);
  std::vector<double> bandwidth;
  for (int t : thread_counts) {
    bandwidth.push_back(bench::ReadBandwidth(t));
    Emit("read_bandwidth", {{"threads", t}, {"buffer_mb", 512}}, bandwidth.back() / 1e9, "GB/s");
  }
  SetComputeThreads(1);
  const double rate = KernelMultiplyAddRate();
  Emit("kernel_multiply_add_rate", {{"threads", 1}, {"isa", IsaName(ActiveIsa())}}, rate / 1e9,
       "G float32 multiply-adds/s");
  const std::string models = shared + "/models/";
  auto small = bench::LoadOrDie(models + "target-6m");
  auto draft = bench::LoadOrDie(models + "draft-mix-1m");
  std::vector<std::unique_ptr<LlamaModel>> wide;
  std::vector<std::pair<std::string, const LlamaModel*>> wide_models;
  for (const std::string& dtype : dtypes) {
    wide.push_back(bench::LoadOrDie(models + "target-wide-46m", dtype));
    wide_models.push_back({dtype, wide.back().get()});
  }
  if (only != "feature-draft") {
    for (size_t i = 0; i < thread_counts.size(); ++i) {
      MeasureModels("target-wide-46m", wide_models, thread_counts[i], reps, bandwidth[i], rate,
                    cpu_clock && thread_counts[i] == 1);
    }
  }
  if (only != "forward") {
    for (const auto& [dtype, model] : wide_models) {
      MeasureFeatureDraft("target-wide-46m", *model, dtype, *draft, reps);
    }
  }
  if (only != "feature-draft") {
    MeasureModels("target-6m", {{"float32", small.get()}}, 1, reps, bandwidth[0], rate, cpu_clock);
    MeasureModels("draft-mix-1m", {{"float32", draft.get()}}, 1, reps, bandwidth[0], rate,
                  cpu_clock);
  }
  if (only != "forward") MeasureFeatureDraft("target-6m", *small, "float32", *draft, reps);
  return 0;
}
