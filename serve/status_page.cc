#include "serve/status_page.h"

#include <chrono>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>

#include "serve/serving_metrics.h"

// Chart.js from Debian's libjs-chart.js, embedded at build time (serve/CMakeLists.txt sets
// SPECLOOP_CHARTJS_PATH when the file exists).
#ifdef SPECLOOP_CHARTJS_PATH
asm(".pushsection .rodata\n"
    ".global specloop_chartjs_begin\n"
    "specloop_chartjs_begin:\n"
    ".incbin \"" SPECLOOP_CHARTJS_PATH "\"\n"
    ".global specloop_chartjs_end\n"
    "specloop_chartjs_end:\n"
    ".popsection\n");
extern "C" const char specloop_chartjs_begin[];
extern "C" const char specloop_chartjs_end[];
#endif

namespace specloop {

namespace {

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Sum of the samples of `name` (any labels) in a text exposition; sets *found.
double SumSeries(const std::string& text, const std::string& name, bool* found = nullptr) {
  double sum = 0;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, name.size(), name) != 0 || line.size() <= name.size()) continue;
    const char next = line[name.size()];
    if (next != ' ' && next != '{') continue;
    const size_t space = line.rfind(' ');
    sum += std::strtod(line.c_str() + space + 1, nullptr);
    if (found) *found = true;
  }
  return sum;
}

const char kPageHead[] = R"HTML(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>specloop status</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; background: #fafafa; }
h1 { font-size: 1.3em; margin: 0 0 .3em; } h2 { font-size: 1.05em; margin: 1.2em 0 .4em; }
.cards { display: flex; gap: 1em; flex-wrap: wrap; }
.card { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: .6em 1em; }
.card b { display: block; font-size: 1.4em; }
.chart { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: .5em;
         position: relative; height: 300px; max-width: 1100px; }
table { border-collapse: collapse; background: #fff; } td, th { border: 1px solid #ddd;
  padding: .25em .8em; text-align: right; }
#note { color: #a00; }
</style>
)HTML";

const char kPageBody[] = R"HTML(</head><body>
<h1 id="title">specloop</h1>
<div id="note"></div>
<div class="cards">
  <div class="card">draft version<b id="version">-</b></div>
  <div class="card">tokens/s (last sample)<b id="tps">-</b></div>
  <div class="card">generated tokens<b id="tokens">-</b></div>
  <div class="card">domains<b id="ndomains">-</b></div>
</div>
<h2>Acceptance rate (alpha) by domain, last hour</h2>
<div class="chart"><canvas id="alpha" data-points="0" data-domains=""></canvas></div>
<h2>Throughput (generated tokens/s), last hour</h2>
<div class="chart"><canvas id="throughput" data-points="0"></canvas></div>
<h2>Draft version history</h2>
<table id="versions"><thead><tr><th>time</th><th>version</th></tr></thead><tbody></tbody></table>
<p><a href="metrics">/metrics</a> &middot; <a href="status.json">status.json</a> &middot;
<a href="health">/health</a></p>
<script>
"use strict";
const colors = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
                "#7f7f7f", "#bcbd22", "#17becf"];
const charts = {};
function lineChart(id, yTitle, yMax) {
  if (typeof Chart === "undefined") return null;
  return new Chart(document.getElementById(id), {
    type: "line", data: { datasets: [] },
    options: { animation: false, responsive: true, maintainAspectRatio: false, parsing: false,
      scales: { x: { type: "linear", min: -60, max: 0,
                     title: { display: true, text: "minutes ago" } },
                y: { min: 0, max: yMax, title: { display: true, text: yTitle } } },
      plugins: { legend: { position: "bottom" } } } });
}
function setData(chart, id, datasets) {
  const canvas = document.getElementById(id);
  let n = 0;
  for (const d of datasets) n += d.data.length;
  canvas.dataset.points = String(n);
  if (!chart) return;
  chart.data.datasets = datasets;
  chart.update("none");
  // Coloured pixels on the canvas (axes and grid are grey): > 0 once a line is drawn.
  const img = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  let painted = 0;
  for (let i = 0; i < img.length; i += 4) {
    const r = img[i], g = img[i + 1], b = img[i + 2];
    if (img[i + 3] > 0 && Math.max(r, g, b) - Math.min(r, g, b) > 60) ++painted;
  }
  canvas.dataset.painted = String(painted);
}
async function refresh() {
  let s;
  try {
    const r = await fetch("status.json", { cache: "no-store" });
    s = await r.json();
  } catch (e) {
    document.getElementById("note").textContent = "cannot reach the server: " + e;
    return;
  }
  document.getElementById("note").textContent =
      s.chart_library ? "" : "chart library not built in: tables only";
  document.getElementById("title").textContent = "specloop: " + s.model;
  document.title = "specloop status: " + s.model;
  document.getElementById("version").textContent = s.draft_version;
  document.getElementById("tokens").textContent = Math.round(s.generated_tokens);
  const last = s.samples[s.samples.length - 1];
  document.getElementById("tps").textContent = last ? last.tokens_per_second.toFixed(1) : "-";
  const minutes = (t) => (t - s.now) / 60;
  const domains = [...new Set(s.samples.flatMap((p) => Object.keys(p.alpha)))].sort();
  document.getElementById("ndomains").textContent = domains.length;
  document.getElementById("alpha").dataset.domains = domains.join(",");
  const alpha = domains.map((d, i) => ({
    label: d, borderColor: colors[i % colors.length], backgroundColor: colors[i % colors.length],
    pointRadius: 2, borderWidth: 2,
    data: s.samples.filter((p) => d in p.alpha).map((p) => ({ x: minutes(p.t), y: p.alpha[d] })) }));
  setData(charts.alpha, "alpha", alpha);
  setData(charts.throughput, "throughput", [{ label: "tokens/s", borderColor: colors[0],
    backgroundColor: colors[0], pointRadius: 1, borderWidth: 2,
    data: s.samples.map((p) => ({ x: minutes(p.t), y: p.tokens_per_second })) }]);
  const rows = s.versions.slice().reverse().map((v) =>
      "<tr><td>" + new Date(v.t * 1000).toLocaleString() + "</td><td>" + v.version + "</td></tr>");
  document.querySelector("#versions tbody").innerHTML = rows.join("");
  document.body.dataset.ready = "1";
}
charts.alpha = lineChart("alpha", "alpha", 1);
charts.throughput = lineChart("throughput", "tokens/s", undefined);
refresh();
setInterval(refresh, 5000);
</script>
</body></html>
)HTML";

std::string BuildHtml() {
  std::string html = kPageHead;
#ifdef SPECLOOP_CHARTJS_PATH
  html += "<script>\n";
  html.append(specloop_chartjs_begin, specloop_chartjs_end);
  html += "\n</script>\n";
#endif
  html += kPageBody;
  return html;
}

}  // namespace

bool StatusPage::HasChartLibrary() {
#ifdef SPECLOOP_CHARTJS_PATH
  return specloop_chartjs_end > specloop_chartjs_begin;
#else
  return false;
#endif
}

StatusPage::StatusPage(ServingMetrics* metrics, StatusPageOptions options)
    : metrics_(metrics), options_(std::move(options)), html_(BuildHtml()) {
  thread_ = std::thread([this] { Loop(); });
}

StatusPage::~StatusPage() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

StatusPage::Sample StatusPage::Take(const Sample* previous) {
  Sample s;
  s.t = UnixNow();
  for (const DomainDrift::Reading& r : metrics_->drift().Snapshot()) {
    s.alpha[r.domain] = r.long_alpha;
  }
  const std::string text = metrics_->registry().Serialize();
  s.tokens = SumSeries(text, "specloop_generated_tokens_total");
  s.version = static_cast<uint64_t>(SumSeries(text, "specloop_draft_version"));
  if (previous && s.t > previous->t) {
    s.tokens_per_second = (s.tokens - previous->tokens) / (s.t - previous->t);
  }
  return s;
}

void StatusPage::SampleNow() {
  Sample previous;
  bool have_previous;
  {
    std::lock_guard<std::mutex> lock(mu_);
    have_previous = !samples_.empty();
    if (have_previous) previous = samples_.back();
  }
  Sample s = Take(have_previous ? &previous : nullptr);
  std::lock_guard<std::mutex> lock(mu_);
  if (versions_.empty() || versions_.back().second != s.version) {
    versions_.emplace_back(s.t, s.version);
    if (versions_.size() > 100) versions_.erase(versions_.begin());
  }
  samples_.push_back(std::move(s));
  while (!samples_.empty() && samples_.front().t < samples_.back().t - options_.window_seconds) {
    samples_.pop_front();
  }
}

void StatusPage::Loop() {
  for (;;) {
    SampleNow();
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, std::chrono::duration<double>(options_.sample_seconds),
                     [this] { return stop_; })) {
      return;
    }
  }
}

std::string StatusPage::Json() {
  std::deque<Sample> samples;
  std::vector<std::pair<double, uint64_t>> versions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    samples = samples_;
    versions = versions_;
  }
  Sample live = Take(samples.empty() ? nullptr : &samples.back());
  if (versions.empty() || versions.back().second != live.version) {
    versions.emplace_back(live.t, live.version);
  }
  samples.push_back(live);
  nlohmann::json js = nlohmann::json::array();
  for (const Sample& s : samples) {
    js.push_back({{"t", s.t},
                  {"alpha", s.alpha},
                  {"tokens_per_second", s.tokens_per_second},
                  {"draft_version", s.version}});
  }
  nlohmann::json vs = nlohmann::json::array();
  for (const auto& [t, v] : versions) vs.push_back({{"t", t}, {"version", v}});
  const nlohmann::json out = {{"now", live.t},
                              {"model", options_.model_name},
                              {"sample_seconds", options_.sample_seconds},
                              {"draft_version", live.version},
                              {"generated_tokens", live.tokens},
                              {"samples", js},
                              {"versions", vs},
                              {"chart_library", HasChartLibrary()}};
  return out.dump();
}

}  // namespace specloop
