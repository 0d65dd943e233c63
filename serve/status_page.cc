#include "serve/status_page.h"

#include <httplib.h>

#include <chrono>
#include <nlohmann/json.hpp>

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
<h2>Speed over plain decoding by domain (tokens/s per stream against plain steps), last hour</h2>
<div class="chart"><canvas id="speedup" data-points="0"></canvas></div>
<h2>Domains (latest)</h2>
<table id="domains"><thead><tr><th>domain</th><th>over plain</th><th>alpha</th>
<th>mean acceptance length</th></tr></thead><tbody></tbody></table>
<h2>Acceptance rate (alpha) by domain, last hour</h2>
<div class="chart"><canvas id="alpha" data-points="0" data-domains=""></canvas></div>
<h2>Throughput (generated tokens/s), last hour</h2>
<div class="chart"><canvas id="throughput" data-points="0"></canvas></div>
<h2>Trainer</h2>
<div id="trainer" data-state="">-</div>
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
function esc(text) {
  return String(text).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;",
                                                     '"': "&quot;" })[c]);
}
function fixed(v, digits) { return v === null || v === undefined ? "-" : Number(v).toFixed(digits); }
function renderTrainer(t) {
  const el = document.getElementById("trainer");
  if (t === null || t === undefined) {
    el.textContent = "no trainer configured (`specloop up` runs one; `serve --trainer-status URL` shows one)";
    el.dataset.state = "none";
    return;
  }
  if (t.error) {
    el.textContent = t.error;
    el.dataset.state = "error";
    return;
  }
  const row = (k, v) => "<tr><th>" + k + "</th><td style=\"text-align:left\">" + v + "</td></tr>";
  let html = row("activity", esc(t.activity)) + row("objective", esc(t.objective)) +
      row("steps", t.steps) + row("loss (last step)", fixed(t.loss, 4)) +
      row("live draft", "v" + t.live_version);
  const e = t.last_evaluation;
  if (e) {
    html += row("last candidate", "evaluated at step " + e.step + ", " +
                new Date(e.time * 1000).toLocaleString()) +
        row("gate", e.published ? "published as v" + e.version : "refused: " + esc(e.reason)) +
        row("held-out alpha", "live " + fixed(e.live_alpha, 3) + ", candidate " +
            fixed(e.candidate_alpha, 3)) +
        row("why", esc(e.detail));
  } else {
    html += row("last candidate", "none evaluated yet");
  }
  el.innerHTML = "<table>" + html + "</table>";
  el.dataset.state = e ? (e.published ? "published" : "refused") : "training";
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
  document.getElementById("version").textContent =
      s.draft_version + (s.draft_kind === "model" ? "" : " (" + s.draft_kind + ")");
  document.getElementById("tokens").textContent = Math.round(s.generated_tokens);
  const last = s.samples[s.samples.length - 1];
  document.getElementById("tps").textContent = last ? last.tokens_per_second.toFixed(1) : "-";
  const minutes = (t) => (t - s.now) / 60;
  const domains = [...new Set(s.samples.flatMap((p) => Object.keys(p.alpha)
      .concat(Object.keys(p.over_plain || {}))))].sort();
  document.getElementById("ndomains").textContent = domains.length;
  document.getElementById("alpha").dataset.domains = domains.join(",");
  const alpha = domains.map((d, i) => ({
    label: d, borderColor: colors[i % colors.length], backgroundColor: colors[i % colors.length],
    pointRadius: 2, borderWidth: 2,
    data: s.samples.filter((p) => d in p.alpha).map((p) => ({ x: minutes(p.t), y: p.alpha[d] })) }));
  setData(charts.alpha, "alpha", alpha);
  const speedup = domains.map((d, i) => ({
    label: d, borderColor: colors[i % colors.length], backgroundColor: colors[i % colors.length],
    pointRadius: 2, borderWidth: 2,
    data: s.samples.filter((p) => p.over_plain && d in p.over_plain)
              .map((p) => ({ x: minutes(p.t), y: p.over_plain[d] })) }));
  setData(charts.speedup, "speedup", speedup);
  const latest = (key, d) => {
    for (let i = s.samples.length - 1; i >= 0; --i) {
      const m = s.samples[i][key];
      if (m && d in m) return m[d];
    }
    return null;
  };
  document.querySelector("#domains tbody").innerHTML = domains.map((d) =>
      "<tr><td>" + esc(d) + "</td><td>" + fixed(latest("over_plain", d), 2) + "x</td><td>" +
      fixed(latest("alpha", d), 3) + "</td><td>" +
      fixed(latest("mean_acceptance_length", d), 2) + "</td></tr>").join("");
  renderTrainer(s.trainer);
  setData(charts.throughput, "throughput", [{ label: "tokens/s", borderColor: colors[0],
    backgroundColor: colors[0], pointRadius: 1, borderWidth: 2,
    data: s.samples.map((p) => ({ x: minutes(p.t), y: p.tokens_per_second })) }]);
  const rows = s.versions.slice().reverse().map((v) =>
      "<tr><td>" + new Date(v.t * 1000).toLocaleString() + "</td><td>" + v.version + "</td></tr>");
  document.querySelector("#versions tbody").innerHTML = rows.join("");
  document.body.dataset.ready = "1";
}
charts.alpha = lineChart("alpha", "alpha", 1);
charts.speedup = lineChart("speedup", "x plain", undefined);
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
  return &specloop_chartjs_end[0] > &specloop_chartjs_begin[0];
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
  s.totals = metrics_->Totals();
  for (const auto& [d, t] : s.totals) s.tokens += t.generated;
  s.version = metrics_->draft_version();
  if (previous && s.t > previous->t) {
    s.tokens_per_second = (s.tokens - previous->tokens) / (s.t - previous->t);
  }
  for (const auto& [d, now] : s.totals) {
    ServingMetrics::DomainTotals before;
    if (previous) {
      auto it = previous->totals.find(d);
      if (it != previous->totals.end()) before = it->second;
    }
    const double decode = now.decode_seconds - before.decode_seconds;
    if (decode > 0) s.over_plain[d] = (now.plain_seconds - before.plain_seconds) / decode;
    const double drafts = now.drafts - before.drafts;
    if (drafts > 0) s.acceptance_length[d] = 1 + (now.accepted - before.accepted) / drafts;
  }
  return s;
}

std::string StatusPage::TrainerJson() {
  if (options_.trainer_status_url.empty()) return "null";
  std::lock_guard<std::mutex> lock(trainer_mu_);
  const double now = UnixNow();
  if (!trainer_json_.empty() && now - trainer_fetched_ < 2.0) return trainer_json_;
  trainer_fetched_ = now;
  httplib::Client cli(options_.trainer_status_url);
  cli.set_connection_timeout(1, 0);
  cli.set_read_timeout(1, 0);
  auto res = cli.Get("/status.json");
  nlohmann::json j;
  if (!res) {
    j = {{"error", "cannot reach the trainer at " + options_.trainer_status_url + ": " +
                       httplib::to_string(res.error())}};
  } else if (res->status != 200) {
    j = {{"error", "the trainer answered HTTP " + std::to_string(res->status)}};
  } else {
    j = nlohmann::json::parse(res->body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) j = {{"error", "the trainer sent malformed JSON"}};
  }
  trainer_json_ = j.dump();
  return trainer_json_;
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
                  {"over_plain", s.over_plain},
                  {"mean_acceptance_length", s.acceptance_length},
                  {"tokens_per_second", s.tokens_per_second},
                  {"draft_version", s.version}});
  }
  nlohmann::json vs = nlohmann::json::array();
  for (const auto& [t, v] : versions) vs.push_back({{"t", t}, {"version", v}});
  const nlohmann::json out = {{"now", live.t},
                              {"model", options_.model_name},
                              {"sample_seconds", options_.sample_seconds},
                              {"draft_version", live.version},
                              {"draft_kind", metrics_->draft_kind()},
                              {"generated_tokens", live.tokens},
                              {"samples", js},
                              {"versions", vs},
                              {"chart_library", HasChartLibrary()},
                              {"trainer", nlohmann::json::parse(TrainerJson())}};
  return out.dump();
}

}  // namespace specloop
