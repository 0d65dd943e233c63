// Prefill benchmark: a long prompt arriving while short requests stream (chunked prefill).
//
// The whole stack in-process at the server's defaults (HttpServer + Scheduler with
// SchedulerOptions(), every core, no logging) on `--target` (default target-wide-46m) /
// draft-mix-1m. Each repetition runs two arms, in alternating order: `streams` clients stream
// completions (prompts of every domain cut to ~200 characters, `--tokens` each, temperature
// 0.8), and in the `long` arm a `--long`-token prompt (prose corpus text) is sent once every
// stream has its first token; the `alone` arm sends none. Per arm: the gaps between the
// streams' text events, measured from the long prompt's arrival (or the same moment in the
// alone arm) to the streams' end; their p50 / p99 and max; the long request's time to first
// token. The figure is long / alone p99 gap, the median over repetitions (a whole prefill run
// at admission stalls every stream for its length: hundreds of milliseconds on
// target-wide-46m). Also the long prompt's time to first token in the long arm against the
// same length of prompt sent to an idle server (its prefill alone). Every long prompt is a new
// stretch of the corpus: none is served from the prefix cache.
// JSON lines {"name", "params", "value", "unit"}. Usage:
//   prefill_bench [--shared DIR] [--target NAME] [--reps N] [--streams N] [--tokens N]
//                 [--long N]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <mutex>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "bench/bench_util.h"
#include "common/model/threads.h"
#include "serve/http_server.h"
#include "tests/e2e/e2e_util.h"

namespace specloop {
namespace {

using bench::Emit;
using bench::Median;
using bench::Percentile;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

// Streams one completion; calls on_text(time) at each text event. Returns the HTTP status.
int Stream(int port, const json& body, const std::function<void(Clock::time_point)>& on_text) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(300, 0);
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  const bool sent = e2e::PostStreaming(
      &cli, "/v1/completions", body.dump(),
      [&](const std::string& data) {
        const json j = json::parse(data, nullptr, false);
        if (j.is_object() && j.contains("choices") &&
            !j["choices"][0]["text"].get<std::string>().empty()) {
          on_text(Clock::now());
        }
      },
      &res, &error);
  return sent ? res.status : -1;
}

struct Arm {
  std::vector<double> gaps;  // seconds between a stream's text events, after the mark
  double long_ttft = 0;      // the long request's time to first token (long arm)
  int failures = 0;
};

// `streams` streaming clients; with `long_prompt` non-empty it is sent once all have their
// first token. Gaps are counted from then on.
Arm RunArm(int port, const std::vector<std::pair<std::string, std::string>>& prompts,
           int streams, int tokens, const std::string& long_prompt, int seed) {
  Arm arm;
  std::mutex mu;
  std::atomic<int> started{0};
  std::atomic<bool> marked{false};
  std::vector<std::thread> threads;
  for (int c = 0; c < streams; ++c) {
    threads.emplace_back([&, c] {
      const auto& [domain, prompt] = prompts[(seed + c) % prompts.size()];
      const json body = {{"prompt", prompt},   {"max_tokens", tokens}, {"temperature", 0.8},
                         {"seed", seed + c},   {"domain", domain},     {"stream", true},
                         {"ignore_eos", true}};
      bool first = true;
      Clock::time_point last;
      std::vector<double> gaps;
      const int status = Stream(port, body, [&](Clock::time_point t) {
        if (first) {
          first = false;
          ++started;
        } else if (marked.load()) {
          gaps.push_back(std::chrono::duration<double>(t - last).count());
        }
        last = t;
      });
      std::lock_guard<std::mutex> lock(mu);
      if (status != 200) ++arm.failures;
      arm.gaps.insert(arm.gaps.end(), gaps.begin(), gaps.end());
    });
  }
  while (started.load() < streams) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  marked = true;
  if (!long_prompt.empty()) {
    const auto t0 = Clock::now();
    bool first = true;
    const json body = {{"prompt", long_prompt}, {"max_tokens", 8}, {"temperature", 0.8},
                       {"stream", true},        {"domain", "prose"}};
    const int status = Stream(port, body, [&](Clock::time_point t) {
      if (first) arm.long_ttft = std::chrono::duration<double>(t - t0).count();
      first = false;
    });
    if (status != 200) ++arm.failures;
  }
  for (auto& t : threads) t.join();
  return arm;
}

}  // namespace
}  // namespace specloop

int main(int argc, char** argv) {
  using namespace specloop;
  std::string shared = SPECLOOP_SHARED_DIR, target_name = "target-wide-46m";
  int reps = 5, streams = 8, tokens = 96, long_tokens = 900;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--shared")) shared = argv[i + 1];
    if (!std::strcmp(argv[i], "--target")) target_name = argv[i + 1];
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--streams")) streams = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--tokens")) tokens = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--long")) long_tokens = std::atoi(argv[i + 1]);
  }
  const std::string target_dir = shared + "/models/" + target_name;
  std::unique_ptr<LlamaModel> target, draft;
  std::unique_ptr<Tokenizer> tokenizer;
  if (!LlamaModel::Load(target_dir, {}, &target).ok() ||
      !LlamaModel::Load(shared + "/models/draft-mix-1m", {}, &draft).ok() ||
      !Tokenizer::Load(target_dir, &tokenizer).ok()) {
    std::cerr << "prefill_bench: cannot load the fixture models under " << shared << "\n";
    return 1;
  }
  SetComputeThreads(0);
  // The long prompts: prose corpus text cut to `long_tokens` tokens (BOS added by the server),
  // a new stretch for each send, so that none is in the prefix cache.
  std::vector<std::string> long_prompts;
  {
    std::ifstream in(shared + "/corpus/prose/valid.txt");
    for (int i = 0; i < 2 * reps; ++i) {
      std::string text(long_tokens * 8, '\0');
      in.read(&text[0], static_cast<std::streamsize>(text.size()));
      text.resize(static_cast<size_t>(in.gcount()));
      std::vector<int> ids = tokenizer->Encode(text);
      ids.resize(std::min<size_t>(ids.size(), long_tokens - 1));
      long_prompts.push_back(tokenizer->Decode(ids));
    }
  }
  std::vector<std::pair<std::string, std::string>> prompts;
  for (const std::string domain : {"prose", "python", "c", "legal", "docs"}) {
    std::ifstream in(shared + "/prompts/" + domain + ".jsonl");
    std::string line;
    for (int n = 0; n < 4 && std::getline(in, line); ++n) {
      prompts.push_back({domain, json::parse(line)["prompt"].get<std::string>().substr(0, 200)});
    }
  }
  std::unique_ptr<ServingMetrics> metrics;
  (void)ServingMetrics::Create(ServingMetricsOptions(), &metrics);
  Scheduler scheduler(target.get(), std::move(draft), tokenizer.get(), metrics.get(), nullptr,
                      SchedulerOptions());
  if (!scheduler.Start().ok()) return 1;
  HttpServerOptions ho;
  ho.port = 0;
  ho.model_name = target_name;
  HttpServer server(ho, &scheduler, metrics.get(), tokenizer.get(), &target->config(), nullptr,
                    nullptr);
  int port = 0;
  if (!server.Bind(&port).ok()) return 1;
  std::thread server_thread([&] { (void)server.Run(); });

  // Warm-up (the policy learns its costs and acceptance), then the long prompt alone.
  (void)RunArm(port, prompts, streams, tokens, "", 100000);
  std::vector<double> idle_ttft;
  std::vector<double> ratio, p99_alone, p99_long, p50_alone, p50_long, max_alone, max_long,
      long_ttft;
  int failures = 0;
  for (int r = 0; r < reps; ++r) {
    idle_ttft.push_back(RunArm(port, prompts, 0, tokens, long_prompts[2 * r], 0).long_ttft);
    Arm alone, with_long;
    for (int order = 0; order < 2; ++order) {
      if ((order == 0) == (r % 2 == 0)) {
        alone = RunArm(port, prompts, streams, tokens, "", r * 100);
      } else {
        with_long = RunArm(port, prompts, streams, tokens, long_prompts[2 * r + 1], r * 100);
      }
    }
    failures += alone.failures + with_long.failures;
    p50_alone.push_back(Percentile(alone.gaps, 0.5));
    p50_long.push_back(Percentile(with_long.gaps, 0.5));
    p99_alone.push_back(Percentile(alone.gaps, 0.99));
    p99_long.push_back(Percentile(with_long.gaps, 0.99));
    max_alone.push_back(Percentile(alone.gaps, 1.0));
    max_long.push_back(Percentile(with_long.gaps, 1.0));
    ratio.push_back(p99_long.back() / p99_alone.back());
    long_ttft.push_back(with_long.long_ttft);
  }
  server.Stop();
  server_thread.join();
  scheduler.Stop();

  const json params = {{"target", target_name}, {"streams", streams}, {"tokens", tokens},
                       {"long_prompt_tokens", long_tokens}, {"reps", reps}};
  Emit("prefill_gap_p50_alone", params, Median(p50_alone) * 1e3, "ms");
  Emit("prefill_gap_p50_with_long", params, Median(p50_long) * 1e3, "ms");
  Emit("prefill_gap_p99_alone", params, Median(p99_alone) * 1e3, "ms");
  Emit("prefill_gap_p99_with_long", params, Median(p99_long) * 1e3, "ms");
  Emit("prefill_gap_max_alone", params, Median(max_alone) * 1e3, "ms");
  Emit("prefill_gap_max_with_long", params, Median(max_long) * 1e3, "ms");
  Emit("prefill_gap_p99_long_over_alone", params, Median(ratio), "ratio");
  Emit("prefill_long_ttft_idle", params, Median(idle_ttft) * 1e3, "ms");
  Emit("prefill_long_ttft_with_streams", params, Median(long_ttft) * 1e3, "ms");
  Emit("prefill_failures", params, failures, "requests");
  return 0;
}
