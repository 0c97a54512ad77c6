#include "telemetry/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace shardlm {

namespace {

std::string number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace

const std::vector<double>& latency_buckets() {
  static const std::vector<double> b = [] {
    std::vector<double> v;
    for (double x = 0.001; x < 150; x *= 2) v.push_back(x);
    return v;
  }();
  return b;
}

Metrics::Family& Metrics::family(const std::string& name, const std::string& help, const char* type) {
  Family& f = families_[name];
  if (f.type.empty()) {
    f.help = help;
    f.type = type;
  }
  SHARDLM_CHECK(f.type == type, "metric " << name << " used as both " << f.type << " and " << type);
  return f;
}

void Metrics::counter_add(const std::string& name, const std::string& help, double v, const std::string& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  family(name, help, "counter").values[labels] += v;
}

void Metrics::gauge_set(const std::string& name, const std::string& help, double v, const std::string& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  family(name, help, "gauge").values[labels] = v;
}

Metrics::Family& Metrics::histogram(const std::string& name, const std::string& help,
                                    const std::vector<double>& bounds) {
  Family& f = family(name, help, "histogram");
  if (f.bounds.empty()) {
    f.bounds = bounds;
    f.buckets.assign(bounds.size(), 0);
  }
  return f;
}

void Metrics::histogram_declare(const std::string& name, const std::string& help, const std::vector<double>& bounds) {
  std::lock_guard<std::mutex> lock(mu_);
  histogram(name, help, bounds);
}

void Metrics::histogram_observe(const std::string& name, const std::string& help, const std::vector<double>& bounds,
                                double v) {
  std::lock_guard<std::mutex> lock(mu_);
  Family& f = histogram(name, help, bounds);
  const size_t i = static_cast<size_t>(std::lower_bound(f.bounds.begin(), f.bounds.end(), v) - f.bounds.begin());
  if (i < f.buckets.size()) ++f.buckets[i];
  ++f.count;
  f.sum += v;
}

std::string Metrics::render() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const auto& [name, f] : families_) {
    out += "# HELP " + name + " " + f.help + "\n# TYPE " + name + " " + f.type + "\n";
    if (f.type == "histogram") {
      uint64_t cum = 0;
      for (size_t i = 0; i < f.bounds.size(); ++i) {
        cum += f.buckets[i];
        out += name + "_bucket{le=\"" + number(f.bounds[i]) + "\"} " + std::to_string(cum) + "\n";
      }
      out += name + "_bucket{le=\"+Inf\"} " + std::to_string(f.count) + "\n";
      out += name + "_sum " + number(f.sum) + "\n" + name + "_count " + std::to_string(f.count) + "\n";
      continue;
    }
    for (const auto& [labels, v] : f.values) {
      out += name + (labels.empty() ? "" : "{" + labels + "}") + " " + number(v) + "\n";
    }
  }
  return out;
}

}  // namespace shardlm
