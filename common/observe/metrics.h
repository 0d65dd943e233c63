// Metrics: a Prometheus registry in prometheus-cpp's shape (prometheus-cpp is not packaged for
// Debian). A Registry owns families; a family is a name, a help text and label names, and
// holds one child (Counter, Gauge or Histogram) per distinct set of label values. Serialize()
// renders the whole registry in the text exposition format 0.0.4, which `promtool check metrics`
// accepts without warnings.
//
//   metrics::Registry registry;
//   metrics::Family<metrics::Counter>* steps;
//   Status s = registry.AddCounter({"specloop_spec_steps_total", "Speculative steps.",
//                                   {"domain"}}, &steps);
//   metrics::Counter& python = steps->Add({{"domain", "python"}});  // keep this reference
//   python.Increment();                                             // hot path
//
// Threading: every class here is thread-safe. The hot path (Counter::Increment,
// Gauge::Set/Increment, Histogram::Observe) is lock-free and allocation-free: it touches only
// the child's atomics (std::atomic<double> is always lock-free on the targets we build for,
// which a static_assert checks). Mutexes guard only family registration, child creation and
// lookup, and Serialize().
//
// Lifetime: families and children live as long as their Registry, and never move; a reference
// returned by Add() stays valid until the Registry is destroyed. Children are never removed.
//
// Naming (checked at registration, as promtool's linter would): names and label names are
// snake_case ([a-z_][a-z0-9_]*; no colons, which Prometheus reserves for recording rules);
// counters end in "_total" and nothing else does; only histograms may end in _bucket, _sum or
// _count; "le" and "quantile" are reserved label names. Use base units (seconds, bytes) and no
// type names in metric names: promtool flags "_ms" or "_gauge", which is not checked here.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/base/status.h"

namespace specloop {
namespace metrics {

static_assert(std::atomic<double>::is_always_lock_free, "the hot path needs lock-free doubles");

// Label name -> label value.
using Labels = std::map<std::string, std::string>;

enum class MetricType { kCounter, kGauge, kHistogram };

namespace internal {
// Adds `v` to `*a` with a compare-exchange loop (C++17 has no fetch_add for atomic<double>).
inline void AtomicAdd(std::atomic<double>* a, double v) {
  double old = a->load(std::memory_order_relaxed);
  while (!a->compare_exchange_weak(old, old + v, std::memory_order_relaxed)) {
  }
}
}  // namespace internal

// A value that only goes up (requests, tokens). Exposed as "<name> <value>".
class Counter {
 public:
  Counter() = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  // Adds `v`. Negative and NaN values are ignored: a counter never decreases.
  // Lock-free, allocation-free.
  void Increment(double v = 1.0) {
    if (v > 0.0) internal::AtomicAdd(&value_, v);
  }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A value that goes up and down (speculation length, draft version). Lock-free,
// allocation-free.
class Gauge {
 public:
  Gauge() = default;
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Increment(double v = 1.0) { internal::AtomicAdd(&value_, v); }
  void Decrement(double v = 1.0) { internal::AtomicAdd(&value_, -v); }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Counts observations into buckets by upper bound, plus their sum and count.
class Histogram {
 public:
  // REQUIRES: `bounds` finite and strictly increasing (Registry::AddHistogram checks this).
  // The +Inf bucket is implicit.
  explicit Histogram(std::vector<double> bounds);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  // Counts `v` in the first bucket whose bound is >= v and adds it to the sum. NaN is
  // ignored. Lock-free, allocation-free (a binary search over the bounds and two atomics).
  void Observe(double v);

  // Finite upper bounds, without +Inf.
  const std::vector<double>& bounds() const { return bounds_; }

  // A consistent-enough reading: `cumulative` has bounds().size() + 1 entries (the last is
  // +Inf) and its last entry equals `count`. Under concurrent Observe() calls the sum may
  // lag or lead the counts by the observations in flight; once writers stop, it is exact.
  struct Snapshot {
    std::vector<uint64_t> cumulative;
    uint64_t count = 0;
    double sum = 0.0;
  };
  Snapshot Collect() const;

 private:
  const std::vector<double> bounds_;
  // Per-bucket (not cumulative) counts; bounds_.size() + 1 entries, the last for +Inf.
  const std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<double> sum_{0.0};
};

// `count` bounds start, start*factor, start*factor^2, ... REQUIRES start > 0, factor > 1.
std::vector<double> ExponentialBuckets(double start, double factor, int count);
// `count` bounds start, start+width, ... REQUIRES width > 0.
std::vector<double> LinearBuckets(double start, double width, int count);

// What registration needs to know about a family.
struct FamilySpec {
  // Metric name, e.g. "specloop_requests_total". Must follow the naming rules above.
  std::string name;
  // One line of help; must not be empty (promtool requires it). Any UTF-8.
  std::string help;
  // Label names, in the order they appear in the exposition. May be empty: the family then
  // has exactly one child, created at registration (so it is exported as 0 from the start).
  std::vector<std::string> label_names;
  // Cardinality cap: the most distinct label sets the family holds, not counting the
  // overflow child. Add() of a new label set past the cap returns the overflow child, whose
  // every label value is `overflow_value`; the family thus exports at most max_children + 1
  // series. Default: 64.
  size_t max_children = 64;
  // Label value of the overflow child. Must not be empty. Default: "other".
  std::string overflow_value = "other";
};

// Type-erased family, as the Registry keeps it.
class FamilyBase {
 public:
  virtual ~FamilyBase() = default;
  virtual MetricType type() const = 0;
  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  // Appends this family's exposition ("# HELP", "# TYPE", samples) to `*out`; nothing when
  // the family has no series. `constant`: the registry's constant labels, rendered
  // (`a="x",b="y"`, or empty), put first in every series' label set.
  virtual void Serialize(const std::string& constant, std::string* out) const = 0;

 protected:
  FamilyBase(std::string name, std::string help)
      : name_(std::move(name)), help_(std::move(help)) {}

 private:
  const std::string name_;
  const std::string help_;
};

// The children of one metric, keyed by label values. T is Counter, Gauge or Histogram.
// Obtained from Registry::AddCounter/AddGauge/AddHistogram.
template <typename T>
class Family final : public FamilyBase {
 public:
  Family(const Family&) = delete;
  Family& operator=(const Family&) = delete;

  MetricType type() const override;
  const std::vector<std::string>& label_names() const { return label_names_; }
  size_t max_children() const { return max_children_; }
  const std::string& overflow_value() const { return overflow_value_; }

  // Returns the child for `labels`, creating it if needed. `labels` must name exactly the
  // family's label names (a programming error otherwise: the process aborts with a message).
  // Label values may be any string; invalid UTF-8 is replaced by U+FFFD (so two values that
  // differ only in invalid bytes share a child). Past the cardinality cap, a label set not
  // yet present yields the overflow child and sets *folded (when given) to true; otherwise
  // *folded is set to false. The reference is stable for the Registry's lifetime: keep it
  // and update it on the hot path. Takes the family's mutex; allocates only on creation.
  T& Add(const Labels& labels, bool* folded = nullptr);
  // As Add(), with values given in label_names() order. REQUIRES values.size() ==
  // label_names().size() (aborts otherwise).
  T& WithLabelValues(const std::vector<std::string>& values, bool* folded = nullptr);

  // Number of children, the overflow child included once it exists.
  size_t size() const;
  // Number of Add()/WithLabelValues() calls that were folded into the overflow child.
  uint64_t folded_count() const { return folded_count_.load(std::memory_order_relaxed); }

  void Serialize(const std::string& constant, std::string* out) const override;

 private:
  friend class Registry;
  Family(const FamilySpec& spec, std::vector<double> bounds);

  T& Lookup(std::vector<std::string> values, bool* folded);
  std::unique_ptr<T> NewChild() const;

  const std::vector<std::string> label_names_;
  const size_t max_children_;
  const std::string overflow_value_;
  const std::vector<double> bounds_;  // Histogram only.
  std::atomic<uint64_t> folded_count_{0};
  mutable std::mutex mu_;
  // Keyed by label values in label_names_ order; std::map keeps the exposition sorted.
  std::map<std::vector<std::string>, std::unique_ptr<T>> children_;  // GUARDED_BY(mu_)
};

// Owns families and renders them. Thread-safe.
class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Labels put on every series this registry exports, first in each label set (as the
  // Prometheus Go client's WrapRegistererWith): `worker="3"` on each worker of a fleet.
  // Families and callback gauges must not use these label names (InvalidArgument at their
  // registration). InvalidArgument once a family is registered, and for a
  // name that breaks the label naming rules.
  Status SetConstantLabels(const Labels& labels);

  // Registers a family and stores it in *family (owned by the registry). Registering the
  // same name again with an identical spec (type, help, label names, cap, bounds) returns
  // the existing family; anything else under a taken name, or a name that collides with a
  // histogram's _bucket/_sum/_count series, is InvalidArgument, as is a spec that breaks the
  // naming rules at the top of this file.
  Status AddCounter(const FamilySpec& spec, Family<Counter>** family);
  Status AddGauge(const FamilySpec& spec, Family<Gauge>** family);
  // `bounds`: finite, strictly increasing, non-empty; a trailing +Inf is accepted and dropped.
  Status AddHistogram(const FamilySpec& spec, const std::vector<double>& bounds,
                      Family<Histogram>** family);

  // Registers a gauge whose single series `name{labels}` is read by calling `read` at every
  // Serialize(). `read` is called with the registry's mutex held, from whichever thread
  // serializes: it must be thread-safe, fast, and must not call into this Registry.
  // Same naming rules as AddGauge; the name must not be taken (InvalidArgument).
  Status AddCallbackGauge(const std::string& name, const std::string& help, const Labels& labels,
                          std::function<double()> read);
  // Unregisters a callback gauge; once this returns, its `read` is never called again.
  // NotFound if `name` is not a callback gauge.
  Status RemoveCallbackGauge(const std::string& name);

  // The whole registry in text exposition format 0.0.4 (Content-Type
  // "text/plain; version=0.0.4; charset=utf-8"), families sorted by name, children sorted by
  // label values. Families without series are left out.
  std::string Serialize() const;

 private:
  Status CheckNewName(const std::string& name, MetricType type) const;  // REQUIRES mu_ held
  Status CheckConstantClash(const std::string& name,
                            const std::vector<std::string>& label_names) const;  // mu_ held
  template <typename T>
  Status AddFamily(const FamilySpec& spec, std::vector<double> bounds, Family<T>** family);

  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<FamilyBase>> families_;  // GUARDED_BY(mu_)
  std::vector<std::string> constant_names_;                        // GUARDED_BY(mu_)
  std::string constant_;  // rendered constant labels; GUARDED_BY(mu_)
};

// Exposition helpers, exposed for tests.
// Label value escaping: backslash, double quote and newline become \\, \" and \n.
std::string EscapeLabelValue(const std::string& value);
// HELP escaping: backslash and newline become \\ and \n.
std::string EscapeHelp(const std::string& help);
// Shortest text that parses back to `v`: integers below 2^53 without exponent or point,
// "+Inf", "-Inf", "NaN".
std::string FormatValue(double v);
// `s` with every invalid UTF-8 sequence replaced by U+FFFD.
std::string SanitizeUtf8(const std::string& s);

}  // namespace metrics
}  // namespace specloop
