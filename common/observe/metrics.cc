#include "common/observe/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

namespace specloop {
namespace metrics {

namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "specloop metrics: %s\n", what.c_str());
  std::abort();
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// snake_case: [a-z_][a-z0-9_]*, not starting with "__" (reserved by Prometheus).
bool IsSnakeName(const std::string& s) {
  if (s.empty() || (s[0] >= '0' && s[0] <= '9')) return false;
  if (s.compare(0, 2, "__") == 0) return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

const char* TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter: return "counter";
    case MetricType::kGauge: return "gauge";
    case MetricType::kHistogram: return "histogram";
  }
  return "untyped";
}

void AppendHeader(const FamilyBase& family, std::string* out) {
  *out += "# HELP " + family.name() + " " + EscapeHelp(family.help()) + "\n";
  *out += "# TYPE " + family.name() + " " + TypeName(family.type()) + "\n";
}

// Appends `{c1="x",n1="v1",n2="v2"[,le="x"]}` (`constant`: the registry's constant labels,
// already rendered), or nothing when there are no labels at all.
void AppendLabels(const std::string& constant, const std::vector<std::string>& names,
                  const std::vector<std::string>& values, const std::string* le,
                  std::string* out) {
  if (constant.empty() && names.empty() && le == nullptr) return;
  *out += '{';
  *out += constant;
  bool first = constant.empty();
  for (size_t i = 0; i < names.size(); ++i) {
    if (!first) *out += ',';
    first = false;
    *out += names[i] + "=\"" + EscapeLabelValue(values[i]) + "\"";
  }
  if (le != nullptr) {
    if (!first) *out += ',';
    *out += "le=\"" + *le + "\"";
  }
  *out += '}';
}

void AppendSample(const std::string& name, const std::string& constant,
                  const std::vector<std::string>& label_names,
                  const std::vector<std::string>& values, const std::string* le, double v,
                  std::string* out) {
  *out += name;
  AppendLabels(constant, label_names, values, le, out);
  *out += ' ';
  *out += FormatValue(v);
  *out += '\n';
}

Status CheckLabelNames(const std::vector<std::string>& names) {
  std::set<std::string> seen;
  for (const std::string& n : names) {
    if (!IsSnakeName(n)) {
      return Status::InvalidArgument("label name \"" + n + "\" is not snake_case");
    }
    if (n == "le" || n == "quantile") {
      return Status::InvalidArgument("label name \"" + n + "\" is reserved");
    }
    if (!seen.insert(n).second) return Status::InvalidArgument("duplicate label name " + n);
  }
  return Status::OK();
}

template <typename T>
struct TypeOf;
template <>
struct TypeOf<Counter> {
  static constexpr MetricType kValue = MetricType::kCounter;
};
template <>
struct TypeOf<Gauge> {
  static constexpr MetricType kValue = MetricType::kGauge;
};
template <>
struct TypeOf<Histogram> {
  static constexpr MetricType kValue = MetricType::kHistogram;
};

// A gauge read at scrape time (Registry::AddCallbackGauge).
class CallbackGauge final : public FamilyBase {
 public:
  CallbackGauge(std::string name, std::string help, const Labels& labels,
                std::function<double()> read)
      : FamilyBase(std::move(name), std::move(help)), read_(std::move(read)) {
    for (const auto& [k, v] : labels) {
      names_.push_back(k);
      values_.push_back(SanitizeUtf8(v));
    }
  }
  MetricType type() const override { return MetricType::kGauge; }
  void Serialize(const std::string& constant, std::string* out) const override {
    AppendHeader(*this, out);
    AppendSample(name(), constant, names_, values_, nullptr, read_(), out);
  }

 private:
  std::vector<std::string> names_;
  std::vector<std::string> values_;
  const std::function<double()> read_;
};

}  // namespace

// ---- Histogram ------------------------------------------------------------------------------

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double v) {
  if (std::isnan(v)) return;
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  internal::AtomicAdd(&sum_, v);
}

Histogram::Snapshot Histogram::Collect() const {
  Snapshot s;
  s.sum = sum_.load(std::memory_order_relaxed);
  s.cumulative.resize(bounds_.size() + 1);
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    total += counts_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = total;
  }
  s.count = total;
  return s;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> b;
  for (int i = 0; i < count; ++i, start *= factor) b.push_back(start);
  return b;
}

std::vector<double> LinearBuckets(double start, double width, int count) {
  std::vector<double> b;
  for (int i = 0; i < count; ++i) b.push_back(start + i * width);
  return b;
}

// ---- Family ---------------------------------------------------------------------------------

template <>
std::unique_ptr<Counter> Family<Counter>::NewChild() const { return std::make_unique<Counter>(); }
template <>
std::unique_ptr<Gauge> Family<Gauge>::NewChild() const { return std::make_unique<Gauge>(); }
template <>
std::unique_ptr<Histogram> Family<Histogram>::NewChild() const {
  return std::make_unique<Histogram>(bounds_);
}

template <typename T>
Family<T>::Family(const FamilySpec& spec, std::vector<double> bounds)
    : FamilyBase(spec.name, SanitizeUtf8(spec.help)),
      label_names_(spec.label_names),
      max_children_(spec.max_children),
      overflow_value_(SanitizeUtf8(spec.overflow_value)),
      bounds_(std::move(bounds)) {
  if (label_names_.empty()) children_.emplace(std::vector<std::string>(), NewChild());
}

template <typename T>
MetricType Family<T>::type() const {
  return TypeOf<T>::kValue;
}

template <typename T>
T& Family<T>::Add(const Labels& labels, bool* folded) {
  if (labels.size() != label_names_.size()) {
    Die(name() + ": Add() got " + std::to_string(labels.size()) + " labels, family has " +
        std::to_string(label_names_.size()));
  }
  std::vector<std::string> values;
  values.reserve(label_names_.size());
  for (const std::string& n : label_names_) {
    auto it = labels.find(n);
    if (it == labels.end()) Die(name() + ": Add() is missing label " + n);
    values.push_back(SanitizeUtf8(it->second));
  }
  return Lookup(std::move(values), folded);
}

template <typename T>
T& Family<T>::WithLabelValues(const std::vector<std::string>& values, bool* folded) {
  if (values.size() != label_names_.size()) {
    Die(name() + ": WithLabelValues() got " + std::to_string(values.size()) +
        " values, family has " + std::to_string(label_names_.size()) + " labels");
  }
  std::vector<std::string> clean;
  clean.reserve(values.size());
  for (const std::string& v : values) clean.push_back(SanitizeUtf8(v));
  return Lookup(std::move(clean), folded);
}

template <typename T>
T& Family<T>::Lookup(std::vector<std::string> values, bool* folded) {
  std::lock_guard<std::mutex> lock(mu_);
  if (folded != nullptr) *folded = false;
  auto it = children_.find(values);
  if (it != children_.end()) return *it->second;
  std::vector<std::string> overflow(label_names_.size(), overflow_value_);
  // The overflow label set never counts against the cap (and is never duplicated).
  const size_t regular = children_.size() - (children_.count(overflow) ? 1 : 0);
  if (values != overflow && regular >= max_children_) {
    if (folded != nullptr) *folded = true;
    folded_count_.fetch_add(1, std::memory_order_relaxed);
    values = std::move(overflow);
    it = children_.find(values);
    if (it != children_.end()) return *it->second;
  }
  return *children_.emplace(std::move(values), NewChild()).first->second;
}

template <typename T>
size_t Family<T>::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return children_.size();
}

template <>
void Family<Histogram>::Serialize(const std::string& constant, std::string* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (children_.empty()) return;
  AppendHeader(*this, out);
  std::vector<std::string> les;
  for (double b : bounds_) les.push_back(FormatValue(b));
  les.push_back("+Inf");
  const std::string bucket = name() + "_bucket";
  for (const auto& [values, child] : children_) {
    const Histogram::Snapshot s = child->Collect();
    for (size_t i = 0; i < les.size(); ++i) {
      AppendSample(bucket, constant, label_names_, values, &les[i],
                   static_cast<double>(s.cumulative[i]), out);
    }
    AppendSample(name() + "_sum", constant, label_names_, values, nullptr, s.sum, out);
    AppendSample(name() + "_count", constant, label_names_, values, nullptr,
                 static_cast<double>(s.count), out);
  }
}

template <typename T>
void Family<T>::Serialize(const std::string& constant, std::string* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (children_.empty()) return;
  AppendHeader(*this, out);
  for (const auto& [values, child] : children_) {
    AppendSample(name(), constant, label_names_, values, nullptr, child->Value(), out);
  }
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

// ---- Registry -------------------------------------------------------------------------------

Registry::Registry() = default;
Registry::~Registry() = default;

Status Registry::SetConstantLabels(const Labels& labels) {
  std::vector<std::string> names;
  for (const auto& kv : labels) names.push_back(kv.first);
  SPECLOOP_RETURN_IF_ERROR(CheckLabelNames(names).Annotate("constant labels"));
  std::lock_guard<std::mutex> lock(mu_);
  if (!families_.empty()) {
    return Status::InvalidArgument("constant labels are set before the first family");
  }
  constant_names_ = names;
  constant_.clear();
  for (const auto& [k, v] : labels) {
    if (!constant_.empty()) constant_ += ',';
    constant_ += k + "=\"" + EscapeLabelValue(SanitizeUtf8(v)) + "\"";
  }
  return Status::OK();
}

Status Registry::CheckConstantClash(const std::string& name,
                                    const std::vector<std::string>& label_names) const {
  for (const std::string& n : label_names) {
    for (const std::string& c : constant_names_) {
      if (n == c) return Status::InvalidArgument(name + ": label " + n + " is a constant label");
    }
  }
  return Status::OK();
}

Status Registry::CheckNewName(const std::string& name, MetricType type) const {
  const bool histogram = type == MetricType::kHistogram;
  if (!IsSnakeName(name)) {
    return Status::InvalidArgument("metric name \"" + name + "\" is not snake_case");
  }
  const bool total = EndsWith(name, "_total");
  if (type == MetricType::kCounter && (!total || name == "_total")) {
    return Status::InvalidArgument("counter " + name + " must end in _total");
  }
  if (type != MetricType::kCounter && total) {
    return Status::InvalidArgument("only counters end in _total: " + name);
  }
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    if (!histogram && EndsWith(name, suffix)) {
      return Status::InvalidArgument("only histograms may end in " + std::string(suffix) +
                                     ": " + name);
    }
    // A histogram's series must not collide with another family's, in either order of
    // registration (only histograms may end in these suffixes, so only they can collide).
    if (histogram && families_.count(name + suffix)) {
      return Status::InvalidArgument(name + suffix + " is already registered");
    }
    if (histogram && EndsWith(name, suffix)) {
      auto it = families_.find(name.substr(0, name.size() - std::strlen(suffix)));
      if (it != families_.end() && it->second->type() == MetricType::kHistogram) {
        return Status::InvalidArgument(name + " is a series of histogram " + it->first);
      }
    }
  }
  if (families_.count(name)) return Status::InvalidArgument(name + " is already registered");
  return Status::OK();
}

template <typename T>
Status Registry::AddFamily(const FamilySpec& spec, std::vector<double> bounds,
                           Family<T>** family) {
  if (spec.help.empty()) return Status::InvalidArgument(spec.name + ": help must not be empty");
  if (spec.max_children < 1) return Status::InvalidArgument(spec.name + ": max_children < 1");
  if (spec.overflow_value.empty()) {
    return Status::InvalidArgument(spec.name + ": overflow_value must not be empty");
  }
  SPECLOOP_RETURN_IF_ERROR(CheckLabelNames(spec.label_names).Annotate(spec.name));
  std::lock_guard<std::mutex> lock(mu_);
  SPECLOOP_RETURN_IF_ERROR(CheckConstantClash(spec.name, spec.label_names));
  auto it = families_.find(spec.name);
  if (it != families_.end()) {
    auto* existing = dynamic_cast<Family<T>*>(it->second.get());
    if (existing == nullptr || existing->help() != SanitizeUtf8(spec.help) ||
        existing->label_names() != spec.label_names ||
        existing->max_children() != spec.max_children ||
        existing->overflow_value() != SanitizeUtf8(spec.overflow_value) ||
        existing->bounds_ != bounds) {
      return Status::InvalidArgument(spec.name + " is already registered differently");
    }
    *family = existing;
    return Status::OK();
  }
  SPECLOOP_RETURN_IF_ERROR(CheckNewName(spec.name, TypeOf<T>::kValue));
  auto* f = new Family<T>(spec, std::move(bounds));
  families_.emplace(spec.name, std::unique_ptr<FamilyBase>(f));
  *family = f;
  return Status::OK();
}

Status Registry::AddCounter(const FamilySpec& spec, Family<Counter>** family) {
  return AddFamily(spec, {}, family);
}

Status Registry::AddGauge(const FamilySpec& spec, Family<Gauge>** family) {
  return AddFamily(spec, {}, family);
}

Status Registry::AddHistogram(const FamilySpec& spec, const std::vector<double>& bounds,
                              Family<Histogram>** family) {
  std::vector<double> b = bounds;
  if (!b.empty() && b.back() == std::numeric_limits<double>::infinity()) b.pop_back();
  if (b.empty()) return Status::InvalidArgument(spec.name + ": no finite bucket bounds");
  for (size_t i = 0; i < b.size(); ++i) {
    if (!std::isfinite(b[i]) || (i > 0 && !(b[i] > b[i - 1]))) {
      return Status::InvalidArgument(spec.name + ": bounds must be finite and increasing");
    }
  }
  return AddFamily(spec, std::move(b), family);
}

Status Registry::AddCallbackGauge(const std::string& name, const std::string& help,
                                  const Labels& labels, std::function<double()> read) {
  if (help.empty()) return Status::InvalidArgument(name + ": help must not be empty");
  if (!read) return Status::InvalidArgument(name + ": no callback");
  std::vector<std::string> names;
  for (const auto& kv : labels) names.push_back(kv.first);
  SPECLOOP_RETURN_IF_ERROR(CheckLabelNames(names).Annotate(name));
  std::lock_guard<std::mutex> lock(mu_);
  SPECLOOP_RETURN_IF_ERROR(CheckConstantClash(name, names));
  SPECLOOP_RETURN_IF_ERROR(CheckNewName(name, MetricType::kGauge));
  families_.emplace(name, std::make_unique<CallbackGauge>(name, SanitizeUtf8(help), labels,
                                                          std::move(read)));
  return Status::OK();
}

Status Registry::RemoveCallbackGauge(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end() || dynamic_cast<CallbackGauge*>(it->second.get()) == nullptr) {
    return Status::NotFound(name + " is not a callback gauge");
  }
  families_.erase(it);
  return Status::OK();
}

std::string Registry::Serialize() const {
  std::string out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& kv : families_) kv.second->Serialize(constant_, &out);
  return out;
}

}  // namespace metrics
}  // namespace specloop
