#include "common/observe/acceptance_drift.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

namespace specloop {

namespace {

bool PositiveFinite(double v) { return std::isfinite(v) && v > 0.0; }

}  // namespace

std::string DriftOptions::Validate() const {
  if (!PositiveFinite(short_half_life)) return "short_half_life must be > 0";
  if (!PositiveFinite(long_half_life)) return "long_half_life must be > 0";
  if (long_half_life < short_half_life) return "long_half_life must be >= short_half_life";
  if (!(std::isfinite(slack) && slack >= 0.0)) return "slack must be >= 0";
  if (!PositiveFinite(threshold)) return "threshold must be > 0";
  if (!(std::isfinite(warmup_tokens) && warmup_tokens >= 0.0)) return "warmup_tokens must be >= 0";
  return "";
}

const char* DriftDirectionName(DriftDirection d) {
  switch (d) {
    case DriftDirection::kUp: return "up";
    case DriftDirection::kDown: return "down";
    case DriftDirection::kNone: break;
  }
  return "none";
}

namespace {
const DriftOptions& Checked(const DriftOptions& options) {
  const std::string err = options.Validate();
  if (!err.empty()) {
    std::fprintf(stderr, "specloop AcceptanceDrift: %s\n", err.c_str());
    std::abort();
  }
  return options;
}
}  // namespace

// No prior: the first step is the estimate.
AcceptanceDrift::AcceptanceDrift(const DriftOptions& options)
    : options_(Checked(options)),
      short_(0.0, 0.0, options.short_half_life),
      long_(0.0, 0.0, options.long_half_life),
      optimal_(0.0, 0.0, options.long_half_life),
      length_decay_(std::pow(0.5, 1.0 / options.long_half_life)) {}

void AcceptanceDrift::ObserveOptimal(double expected, int positions) {
  if (positions > 0 && std::isfinite(expected)) optimal_.ObserveExpected(expected, positions);
}

double AcceptanceDrift::short_alpha() const { return short_.alpha(); }
double AcceptanceDrift::long_alpha() const { return long_.alpha(); }

DriftDirection AcceptanceDrift::Observe(int drafted, int accepted) {
  if (drafted <= 0 || accepted < 0 || accepted > drafted) return DriftDirection::kNone;
  ++observations_;
  const double s = accepted, t = accepted + (accepted < drafted ? 1 : 0);
  const double reference = long_.alpha();  // before this step
  const bool detect = tested_tokens_ >= options_.warmup_tokens;
  short_.Observe(drafted, accepted);
  long_.Observe(drafted, accepted);
  length_sum_ = length_sum_ * length_decay_ + 1.0 + accepted;
  length_norm_ = length_norm_ * length_decay_ + 1.0;
  tested_tokens_ += t;
  if (!detect) return DriftDirection::kNone;

  const double d = s - reference * t;
  up_ += d - options_.slack * t;
  if (up_ <= 0.0) {
    up_ = up_s_ = up_t_ = 0.0;
  } else {
    up_s_ += s;
    up_t_ += t;
  }
  down_ += -d - options_.slack * t;
  if (down_ <= 0.0) {
    down_ = down_s_ = down_t_ = 0.0;
  } else {
    down_s_ += s;
    down_t_ += t;
  }

  DriftDirection dir = DriftDirection::kNone;
  double after = 0.0;
  if (up_ > options_.threshold) {
    dir = DriftDirection::kUp;
    after = up_s_ / up_t_;
    ++up_events_;
  } else if (down_ > options_.threshold) {
    dir = DriftDirection::kDown;
    after = down_s_ / down_t_;
    ++down_events_;
  } else {
    return DriftDirection::kNone;
  }
  last_event_ = DriftEvent{dir, observations_, reference, after};
  short_.Rebase(after);
  long_.Rebase(after);
  up_ = down_ = up_s_ = up_t_ = down_s_ = down_t_ = 0.0;
  return dir;
}

DomainDrift::DomainDrift(const DriftOptions& options, size_t max_domains,
                         std::string overflow_domain)
    : options_(options), max_domains_(max_domains), overflow_domain_(std::move(overflow_domain)) {
  const std::string err = options_.Validate();
  if (!err.empty() || max_domains_ < 1) {
    std::fprintf(stderr, "specloop DomainDrift: %s\n",
                 err.empty() ? "max_domains must be >= 1" : err.c_str());
    std::abort();
  }
}

AcceptanceDrift& DomainDrift::Find(const std::string& domain, std::string* resolved) {
  auto it = domains_.find(domain);
  if (it == domains_.end()) {
    // The overflow domain never counts against the cap.
    const size_t regular = domains_.size() - domains_.count(overflow_domain_);
    const std::string& key =
        (domain == overflow_domain_ || regular < max_domains_) ? domain : overflow_domain_;
    it = domains_.find(key);
    if (it == domains_.end()) {
      it = domains_.emplace(key, std::make_unique<AcceptanceDrift>(options_)).first;
    }
  }
  if (resolved != nullptr) *resolved = it->first;
  return *it->second;
}

DriftDirection DomainDrift::Observe(const std::string& domain, int drafted, int accepted,
                                    double optimal, int optimal_positions,
                                    std::string* resolved) {
  std::lock_guard<std::mutex> lock(mu_);
  AcceptanceDrift& d = Find(domain, resolved);
  d.ObserveOptimal(optimal, optimal_positions);
  return d.Observe(drafted, accepted);
}

std::vector<DomainDrift::Reading> DomainDrift::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Reading> out;
  out.reserve(domains_.size());
  for (const auto& [domain, d] : domains_) {
    out.push_back(Reading{domain, d->short_alpha(), d->long_alpha(), d->drift(),
                          d->mean_acceptance_length(), d->optimal_alpha(), d->observations(),
                          d->up_events(), d->down_events(), d->last_event()});
  }
  return out;
}

size_t DomainDrift::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return domains_.size();
}

}  // namespace specloop
