// Run metrics in the Prometheus text format: counters, gauges and histograms, updated by the
// writer rank as requests and steps finish, rendered for --metrics-port and --metrics-file.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace shardlm {

class Metrics {
 public:
  // name -> help text and type; values updated under one lock (updates are per request or step,
  // far from any hot loop).
  void counter_add(const std::string& name, const std::string& help, double v, const std::string& labels = "");
  void gauge_set(const std::string& name, const std::string& help, double v, const std::string& labels = "");
  // Histogram with the given upper bounds (seconds); +Inf is implied.
  void histogram_observe(const std::string& name, const std::string& help, const std::vector<double>& bounds, double v);
  // The histogram at zero, so that it is there from the first scrape (as counters start at 0).
  void histogram_declare(const std::string& name, const std::string& help, const std::vector<double>& bounds);
  // The exposition text (version 0.0.4), families sorted by name.
  std::string render() const;

 private:
  struct Family {
    std::string help, type;
    std::map<std::string, double> values;  // labels -> value (counters, gauges)
    std::vector<double> bounds;
    std::vector<uint64_t> buckets;  // cumulative counts are computed when rendering
    uint64_t count = 0;
    double sum = 0;
  };
  Family& family(const std::string& name, const std::string& help, const char* type);
  Family& histogram(const std::string& name, const std::string& help, const std::vector<double>& bounds);

  mutable std::mutex mu_;
  std::map<std::string, Family> families_;
};

// Latency buckets in seconds: 1 ms .. about 2 min, doubling.
const std::vector<double>& latency_buckets();

}  // namespace shardlm
