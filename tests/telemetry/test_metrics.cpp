#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <thread>

#include "common/cli_runner.h"
#include "common/shared_data.h"
#include "common/test_files.h"
#include "telemetry/metrics.h"
#include "telemetry/metrics_server.h"

namespace fs = std::filesystem;

namespace shardlm {
namespace {

std::string http_get(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: localhost\r\n\r\n";
  send(fd, req.data(), req.size(), 0);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof buf, 0)) > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

TEST(Metrics, PrometheusTextFormat) {
  Metrics m;
  m.counter_add("x_total", "things", 2);
  m.counter_add("x_total", "things", 3);
  m.gauge_set("g", "a gauge", 1.5, "replica=\"0\"");
  m.histogram_observe("h_seconds", "lat", {0.1, 1.0}, 0.05);
  m.histogram_observe("h_seconds", "lat", {0.1, 1.0}, 0.5);
  m.histogram_observe("h_seconds", "lat", {0.1, 1.0}, 7);
  const std::string t = m.render();
  EXPECT_NE(t.find("# HELP x_total things\n# TYPE x_total counter\nx_total 5\n"), std::string::npos) << t;
  EXPECT_NE(t.find("g{replica=\"0\"} 1.5\n"), std::string::npos) << t;
  EXPECT_NE(t.find("h_seconds_bucket{le=\"0.10000000000000001\"} 1\n"), std::string::npos) << t;
  EXPECT_NE(t.find("h_seconds_bucket{le=\"1\"} 2\n"), std::string::npos) << t;
  EXPECT_NE(t.find("h_seconds_bucket{le=\"+Inf\"} 3\nh_seconds_sum 7.5499999999999998\nh_seconds_count 3\n"),
            std::string::npos)
      << t;
  EXPECT_THROW(m.gauge_set("x_total", "things", 1), std::exception);  // a counter stays a counter
  // Declared before any observation: every bucket, the sum and the count at zero.
  m.histogram_declare("d_seconds", "declared", {0.5});
  const std::string d = m.render();
  EXPECT_NE(d.find("# TYPE d_seconds histogram\nd_seconds_bucket{le=\"0.5\"} 0\nd_seconds_bucket{le=\"+Inf\"} 0\n"
                   "d_seconds_sum 0\nd_seconds_count 0\n"),
            std::string::npos)
      << d;
}

TEST(Metrics, ServerAnswersGetMetricsAnd404) {
  Metrics m;
  m.counter_add("shardlm_test_total", "t", 42);
  MetricsServer server(m, "127.0.0.1", 0);
  ASSERT_GT(server.port(), 0);
  const std::string ok = http_get(server.port(), "/metrics");
  EXPECT_EQ(ok.rfind("HTTP/1.1 200 OK", 0), 0u) << ok;
  EXPECT_NE(ok.find("shardlm_test_total 42"), std::string::npos) << ok;
  EXPECT_EQ(http_get(server.port(), "/other").rfind("HTTP/1.1 404", 0), 0u);
  EXPECT_THROW(MetricsServer(m, "not-an-address", 0), std::exception);
}

// A run serves its metrics while it runs and leaves the textfile at the end. The metrics count
// the rows as the file holds them: a duplicate id is a failed request without output.
TEST(Metrics, RunServesAndWritesMetrics) {
  SHARDLM_REQUIRE_SHARED(model, "models/stories260K");
  fs::path d = test::fresh_dir("metrics");
  std::string lines;
  for (int i = 0; i < 60; ++i) {
    lines += "{\"id\": \"m" + std::to_string(i) + "\", \"prompt\": \"Once upon a time\", \"max_tokens\": 150, \"ignore_eos\": true}\n";
  }
  lines += "{\"id\": \"m7\", \"prompt\": \"Once upon a time\", \"max_tokens\": 150, \"ignore_eos\": true}\n";
  test::write_file(d / "p.jsonl", lines);
  const std::string log = (d / "log").string();
  const pid_t pid = fork();
  if (pid == 0) {
    FILE* f = std::freopen(log.c_str(), "w", stderr);
    (void)f;
    const std::string bin = test::shardlm_bin(), prompts = (d / "p.jsonl").string(), out = (d / "o.h5").string(),
                      file = (d / "metrics.prom").string();
    execl(bin.c_str(), bin.c_str(), "run", "--model", model.c_str(), "--prompts", prompts.c_str(), "--out", out.c_str(),
          "--threads", "1", "--max-seqs", "2", "--metrics-port", "0", "--metrics-file", file.c_str(), "--progress-interval",
          "0", static_cast<char*>(nullptr));
    _exit(127);
  }
  int port = 0;
  for (int i = 0; i < 100 && port == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::smatch mt;
    const std::string text = test::read_file(log);
    if (std::regex_search(text, mt, std::regex("metrics at http://127\\.0\\.0\\.1:([0-9]+)/metrics"))) port = std::stoi(mt[1]);
  }
  ASSERT_GT(port, 0) << test::read_file(log);
  std::string live;
  for (int i = 0; i < 100 && live.find("shardlm_requests_running{replica=\"0\"} 2") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    live = http_get(port, "/metrics");
  }
  EXPECT_NE(live.find("shardlm_requests_running{replica=\"0\"} 2"), std::string::npos) << live;
  EXPECT_NE(live.find("# TYPE shardlm_time_to_first_token_seconds histogram"), std::string::npos) << live;
  int st = 0;
  waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << test::read_file(log);
  const std::string file = test::read_file((d / "metrics.prom").string());
  EXPECT_NE(file.find("shardlm_requests_finished_total 61\n"), std::string::npos) << file;
  EXPECT_NE(file.find("shardlm_requests_failed_total 1\n"), std::string::npos) << file;
  EXPECT_NE(file.find("shardlm_output_tokens_total 9000\n"), std::string::npos) << file;
  EXPECT_NE(file.find("shardlm_request_time_per_output_token_seconds_count 60\n"), std::string::npos) << file;
  EXPECT_NE(file.find("shardlm_time_to_first_token_seconds_count 60\n"), std::string::npos) << file;
}

}  // namespace
}  // namespace shardlm
