// Prometheus metrics of the record stream's two ends, each in its own process (`specloop
// buffer ship|ingest --metrics-port`): copied from the shipper's or ingester's stats when
// /metrics is scraped. Metric names and their alert: docs/operations.md, "The record stream".
//
// Thread-safe (the stats are atomics; the registry is thread-safe).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "fleet/record_shipper.h"
#include "fleet/stream_ingester.h"
#include "common/base/status.h"
#include "common/observe/metrics.h"

namespace specloop {

// specloop_ship_* and specloop_stream_dropped_entries_total, one series each, labelled
// shipper="<id>".
class ShipperMetrics {
 public:
  // Registers the families in `registry` (which must outlive this). `start_us`: Unix time the
  // shipper started, the lag's origin until it first catches up.
  static Status Create(metrics::Registry* registry, const std::string& id, uint64_t start_us,
                       std::unique_ptr<ShipperMetrics>* out);
  // Copies `stats` into the metrics; `now_us`: Unix time.
  void Update(const ShipperStats& stats, uint64_t now_us);

 private:
  ShipperMetrics() = default;
  uint64_t start_us_ = 0;
  metrics::Counter *records_ = nullptr, *bytes_ = nullptr, *errors_ = nullptr,
                   *dropped_ = nullptr;
  metrics::Gauge* lag_ = nullptr;
};

// specloop_ingest_*, specloop_stream_entries and specloop_stream_trimmed_entries_total,
// labelled group="<consumer group>".
class IngesterMetrics {
 public:
  static Status Create(metrics::Registry* registry, const std::string& group,
                       std::unique_ptr<IngesterMetrics>* out);
  void Update(const IngesterStats& stats, uint64_t now_us);

 private:
  IngesterMetrics() = default;
  metrics::Counter *records_ = nullptr, *corrupt_ = nullptr, *missing_ = nullptr,
                   *errors_ = nullptr, *trimmed_ = nullptr;
  metrics::Gauge *lag_entries_ = nullptr, *lag_seconds_ = nullptr, *length_ = nullptr;
};

// GET /metrics (the registry, after `before_scrape` ran) and GET /health on host:port, served
// by a thread of its own until destroyed.
class MetricsEndpoint {
 public:
  // IOError when host:port cannot be bound. `registry` must outlive the endpoint;
  // `before_scrape` must be thread-safe.
  static Status Start(const std::string& host, int port, metrics::Registry* registry,
                      std::function<void()> before_scrape, std::unique_ptr<MetricsEndpoint>* out);
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

 private:
  struct Impl;
  explicit MetricsEndpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace specloop
