// StatusPage: the server's built-in status page (issue 7), served at GET / with its data at
// GET /status.json. Plain HTML and JavaScript from the binary; the chart library (Debian's
// libjs-chart.js) is embedded at build time, so the page needs no network access.
//
// A sampler thread records, every sample_seconds, the acceptance rate per domain (the long
// window, as specloop_acceptance_rate{window="long"}), generated tokens per second and the
// draft version, and per domain over the interval since the previous sample: speed over plain
// decoding (specloop_plain_equivalent_seconds_total over specloop_decode_seconds_total) and the
// draft's mean acceptance length (1 + accepted per verified draft); the last window_seconds of
// samples are kept, and draft version changes are kept as a history (the latest 100).
//
// /status.json: {"now": unix seconds, "model": name, "sample_seconds": s, "draft_version": v,
//   "draft_kind": "model" | "eagle3" | "none",
//   "generated_tokens": total, "samples": [{"t", "alpha": {domain: a}, "over_plain": {domain: x},
//   "mean_acceptance_length": {domain: l}, "tokens_per_second", "draft_version"}...],
//   "versions": [{"t", "version"}...], "chart_library": bool, "trainer": T}; the last sample is
// taken at request time (not stored), so the page has data right after traffic. T: null
// without trainer_status_url, else the trainer's own /status.json (trainer/trainer.h,
// TrainerState: activity, objective, steps, loss, live version, the last evaluation's gate
// decision and why), or {"error": message} when it cannot be read; fetched at most once per
// 2 s, with a 1 s timeout.
//
// Thread safety: Html() and Json() may be called from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "serve/serving_metrics.h"

namespace specloop {

struct StatusPageOptions {
  // Seconds between samples. Default: 5.
  double sample_seconds = 5;
  // History kept. Default: one hour.
  double window_seconds = 3600;
  // Shown in the page title.
  std::string model_name = "specloop";
  // The trainer's metrics server ("http://127.0.0.1:9091"), whose /status.json the page shows;
  // empty: no trainer section. Default: empty (`specloop up` sets it).
  std::string trainer_status_url;
};

class StatusPage {
 public:
  // Starts the sampler thread. `metrics` is not owned and must outlive this object.
  StatusPage(ServingMetrics* metrics, StatusPageOptions options);
  // Stops and joins the sampler thread.
  ~StatusPage();
  StatusPage(const StatusPage&) = delete;
  StatusPage& operator=(const StatusPage&) = delete;

  // The page (text/html). Built once; the same for every request.
  const std::string& Html() const { return html_; }
  // The data behind the page (application/json), see above.
  std::string Json();
  // Records one sample now (the sampler thread calls this).
  void SampleNow();

  // Whether the chart library was embedded at build time.
  static bool HasChartLibrary();

 private:
  struct Sample {
    double t = 0;  // unix seconds
    std::map<std::string, double> alpha;
    double tokens = 0;  // generated tokens so far
    double tokens_per_second = 0;
    uint64_t version = 0;
    std::map<std::string, ServingMetrics::DomainTotals> totals;
    // Over the interval since the previous sample, domains with decode time / drafts in it.
    std::map<std::string, double> over_plain, acceptance_length;
  };
  // The trainer's /status.json (see above), cached for 2 s.
  std::string TrainerJson();
  Sample Take(const Sample* previous);
  void Loop();

  ServingMetrics* const metrics_;
  const StatusPageOptions options_;
  const std::string html_;
  std::mutex mu_;
  std::deque<Sample> samples_;                          // GUARDED_BY(mu_)
  std::vector<std::pair<double, uint64_t>> versions_;   // GUARDED_BY(mu_)
  bool stop_ = false;                                   // GUARDED_BY(mu_)
  std::mutex trainer_mu_;
  double trainer_fetched_ = 0;  // unix seconds; GUARDED_BY(trainer_mu_)
  std::string trainer_json_;    // GUARDED_BY(trainer_mu_)
  std::condition_variable cv_;
  std::thread thread_;
};

}  // namespace specloop
