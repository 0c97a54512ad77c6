// Serves the metrics over HTTP (GET /metrics) from a background thread, for Prometheus to scrape,
// and/or writes them to a file periodically for node_exporter's textfile collector.
#pragma once

#include <atomic>
#include <string>
#include <thread>

#include "telemetry/metrics.h"

namespace shardlm {

class MetricsServer {
 public:
  // Listens on bind_address:port (port 0: any free port). Throws Error naming the address.
  MetricsServer(const Metrics& metrics, const std::string& bind_address, int port);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;
  int port() const { return port_; }

 private:
  void serve();

  const Metrics& metrics_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Writes the metrics to path atomically (a temporary file renamed over it).
void write_metrics_file(const Metrics& metrics, const std::string& path);

}  // namespace shardlm
