#include "fleet/stream_metrics.h"

#include <chrono>
#include <thread>

#include <httplib.h>

namespace specloop {

namespace {

Status AddCounter(metrics::Registry* r, const std::string& name, const std::string& help,
                  const metrics::Labels& labels, metrics::Counter** out) {
  metrics::FamilySpec spec{name, help, {}};
  for (const auto& [k, v] : labels) spec.label_names.push_back(k);
  metrics::Family<metrics::Counter>* f = nullptr;
  Status s = r->AddCounter(spec, &f);
  if (s.ok()) *out = &f->Add(labels);
  return s;
}

Status AddGauge(metrics::Registry* r, const std::string& name, const std::string& help,
                const metrics::Labels& labels, metrics::Gauge** out) {
  metrics::FamilySpec spec{name, help, {}};
  for (const auto& [k, v] : labels) spec.label_names.push_back(k);
  metrics::Family<metrics::Gauge>* f = nullptr;
  Status s = r->AddGauge(spec, &f);
  if (s.ok()) *out = &f->Add(labels);
  return s;
}

// A counter that mirrors a running total kept elsewhere (never decreases).
void Mirror(metrics::Counter* c, uint64_t total) {
  c->Increment(static_cast<double>(total) - c->Value());
}

double Seconds(uint64_t later_us, uint64_t earlier_us) {
  return later_us > earlier_us ? static_cast<double>(later_us - earlier_us) / 1e6 : 0.0;
}

}  // namespace

Status ShipperMetrics::Create(metrics::Registry* registry, const std::string& id,
                              uint64_t start_us, std::unique_ptr<ShipperMetrics>* out) {
  std::unique_ptr<ShipperMetrics> m(new ShipperMetrics());
  m->start_us_ = start_us;
  const metrics::Labels l = {{"shipper", id}};
  Status s = AddCounter(registry, "specloop_ship_records_total",
                        "Records shipped into the Redis stream.", l, &m->records_);
  if (s.ok()) {
    s = AddCounter(registry, "specloop_ship_bytes_total", "Bytes of the records shipped.", l,
                   &m->bytes_);
  }
  if (s.ok()) {
    s = AddCounter(registry, "specloop_ship_errors_total",
                   "Failed shipping transactions, trims and connections.", l, &m->errors_);
  }
  if (s.ok()) {
    s = AddCounter(registry, "specloop_stream_dropped_entries_total",
                   "Stream entries the length cap removed before every consumer group had "
                   "acknowledged them.",
                   l, &m->dropped_);
  }
  if (s.ok()) {
    s = AddGauge(registry, "specloop_ship_lag_seconds",
                 "Seconds since the shipper last had shipped every record of its buffer.", l,
                 &m->lag_);
  }
  if (!s.ok()) return s;
  *out = std::move(m);
  return Status::OK();
}

void ShipperMetrics::Update(const ShipperStats& st, uint64_t now_us) {
  Mirror(records_, st.records.load());
  Mirror(bytes_, st.bytes.load());
  Mirror(errors_, st.errors.load());
  Mirror(dropped_, st.dropped.load());
  const uint64_t caught_up = st.caught_up_us.load();
  lag_->Set(Seconds(now_us, caught_up > 0 ? caught_up : start_us_));
}

Status IngesterMetrics::Create(metrics::Registry* registry, const std::string& group,
                               std::unique_ptr<IngesterMetrics>* out) {
  std::unique_ptr<IngesterMetrics> m(new IngesterMetrics());
  const metrics::Labels l = {{"group", group}};
  Status s = AddCounter(registry, "specloop_ingest_records_total",
                        "Records written from the stream into the trainer's buffer.", l,
                        &m->records_);
  if (s.ok()) {
    s = AddCounter(registry, "specloop_ingest_corrupt_entries_total",
                   "Stream entries skipped: not a valid record.", l, &m->corrupt_);
  }
  if (s.ok()) {
    s = AddCounter(registry, "specloop_ingest_missing_entries_total",
                   "Delivered stream entries trimmed before they were read again.", l,
                   &m->missing_);
  }
  if (s.ok()) {
    s = AddCounter(registry, "specloop_ingest_errors_total",
                   "Failed stream reads, buffer writes, trims and connections.", l, &m->errors_);
  }
  if (s.ok()) {
    s = AddCounter(registry, "specloop_stream_trimmed_entries_total",
                   "Stream entries removed once every consumer group had acknowledged them.", l,
                   &m->trimmed_);
  }
  if (s.ok()) {
    s = AddGauge(registry, "specloop_ingest_lag_entries",
                 "Stream entries the group has not acknowledged (pending and undelivered).", l,
                 &m->lag_entries_);
  }
  if (s.ok()) {
    s = AddGauge(registry, "specloop_ingest_lag_seconds",
                 "Age of the oldest stream entry the group has not acknowledged (0: none).", l,
                 &m->lag_seconds_);
  }
  if (s.ok()) {
    s = AddGauge(registry, "specloop_stream_entries",
                 "Entries in the record stream after the last trim.", l, &m->length_);
  }
  if (!s.ok()) return s;
  *out = std::move(m);
  return Status::OK();
}

void IngesterMetrics::Update(const IngesterStats& st, uint64_t now_us) {
  Mirror(records_, st.records.load());
  Mirror(corrupt_, st.corrupt.load());
  Mirror(missing_, st.missing.load());
  Mirror(errors_, st.errors.load());
  Mirror(trimmed_, st.trimmed.load());
  lag_entries_->Set(static_cast<double>(st.lag_entries.load()));
  const uint64_t oldest_ms = st.oldest_unacknowledged_ms.load();
  lag_seconds_->Set(oldest_ms > 0 ? Seconds(now_us, oldest_ms * 1000) : 0.0);
  length_->Set(static_cast<double>(st.stream_length.load()));
}

struct MetricsEndpoint::Impl {
  httplib::Server http;
  std::thread thread;
};

MetricsEndpoint::MetricsEndpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MetricsEndpoint::~MetricsEndpoint() {
  impl_->http.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

Status MetricsEndpoint::Start(const std::string& host, int port, metrics::Registry* registry,
                              std::function<void()> before_scrape,
                              std::unique_ptr<MetricsEndpoint>* out) {
  auto impl = std::make_unique<Impl>();
  impl->http.Get("/metrics", [registry, before_scrape](const httplib::Request&,
                                                      httplib::Response& res) {
    if (before_scrape) before_scrape();
    res.set_content(registry->Serialize(), "text/plain; version=0.0.4; charset=utf-8");
  });
  impl->http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{\"status\":\"ok\"}", "application/json");
  });
  if (!impl->http.bind_to_port(host.c_str(), port)) {
    return Status::IOError("metrics: cannot bind " + host + ":" + std::to_string(port));
  }
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->http.listen_after_bind(); });
  out->reset(new MetricsEndpoint(std::move(impl)));
  return Status::OK();
}

}  // namespace specloop
