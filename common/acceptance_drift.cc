#include "common/acceptance_drift.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

namespace specloop {

namespace {

constexpr double kLn2 = 0.69314718055994530942;

bool PositiveFinite(double v) { return std::isfinite(v) && v > 0.0; }

}  // namespace

std::string DriftOptions::Validate() const {
  if (!PositiveFinite(short_half_life)) return "short_half_life must be > 0";
  if (!PositiveFinite(long_half_life)) return "long_half_life must be > 0";
  if (long_half_life < short_half_life) return "long_half_life must be >= short_half_life";
  if (!(std::isfinite(slack) && slack >= 0.0)) return "slack must be >= 0";
  if (!PositiveFinite(threshold)) return "threshold must be > 0";
  if (!(std::isfinite(warmup_weight) && warmup_weight >= 0.0)) return "warmup_weight must be >= 0";
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

AcceptanceDrift::AcceptanceDrift(const DriftOptions& options) : options_(options) {
  const std::string err = options_.Validate();
  if (!err.empty()) {
    std::fprintf(stderr, "specloop AcceptanceDrift: %s\n", err.c_str());
    std::abort();
  }
}

double AcceptanceDrift::short_alpha() const { return short_.value(); }
double AcceptanceDrift::long_alpha() const { return long_.value(); }

DriftDirection AcceptanceDrift::Observe(double x, double weight) {
  if (!(x >= 0.0 && x <= 1.0) || !PositiveFinite(weight)) return DriftDirection::kNone;
  ++observations_;
  const double reference = long_.value();      // before this observation
  const double mean_weight = weight_.value();  // likewise
  const bool detect = total_weight_ >= options_.warmup_weight && long_.norm > 0.0;

  // 1 - 2^(-w/h) through expm1: accurate even when w/h is tiny (long half-lives).
  const double short_gain = -std::expm1(-kLn2 * weight / options_.short_half_life);
  const double long_gain = -std::expm1(-kLn2 * weight / options_.long_half_life);
  short_.Add(1.0 - short_gain, short_gain, x);
  long_.Add(1.0 - long_gain, long_gain, x);
  weight_.Add(1.0 - long_gain, long_gain, weight);
  total_weight_ += weight;
  if (!detect) return DriftDirection::kNone;

  const double d = (weight / mean_weight) * (x - reference);
  up_ += d - options_.slack;
  if (up_ <= 0.0) {
    up_ = up_x_ = up_w_ = 0.0;
  } else {
    up_x_ += weight * x;
    up_w_ += weight;
  }
  down_ += -d - options_.slack;
  if (down_ <= 0.0) {
    down_ = down_x_ = down_w_ = 0.0;
  } else {
    down_x_ += weight * x;
    down_w_ += weight;
  }

  DriftDirection dir = DriftDirection::kNone;
  double after = 0.0;
  if (up_ > options_.threshold) {
    dir = DriftDirection::kUp;
    after = up_x_ / up_w_;
    ++up_events_;
  } else if (down_ > options_.threshold) {
    dir = DriftDirection::kDown;
    after = down_x_ / down_w_;
    ++down_events_;
  } else {
    return DriftDirection::kNone;
  }
  last_event_ = DriftEvent{dir, observations_, reference, after};
  short_.Rebase(after);
  long_.Rebase(after);
  up_ = down_ = up_x_ = up_w_ = down_x_ = down_w_ = 0.0;
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

DriftDirection DomainDrift::Observe(const std::string& domain, double x, double weight,
                                    std::string* resolved) {
  std::lock_guard<std::mutex> lock(mu_);
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
  return it->second->Observe(x, weight);
}

std::vector<DomainDrift::Reading> DomainDrift::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Reading> out;
  out.reserve(domains_.size());
  for (const auto& [domain, d] : domains_) {
    out.push_back(Reading{domain, d->short_alpha(), d->long_alpha(), d->drift(),
                          d->observations(), d->up_events(), d->down_events(),
                          d->last_event()});
  }
  return out;
}

size_t DomainDrift::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return domains_.size();
}

}  // namespace specloop
