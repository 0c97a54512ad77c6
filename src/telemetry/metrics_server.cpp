#include "telemetry/metrics_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "core/error.h"

namespace shardlm {

MetricsServer::MetricsServer(const Metrics& metrics, const std::string& bind_address, int port) : metrics_(metrics) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  SHARDLM_CHECK(fd_ >= 0, "metrics: socket(): " << std::strerror(errno));
  const int one = 1;
  ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, bind_address.c_str(), &addr.sin_addr) != 1) {
    ::close(fd_);
    SHARDLM_FAIL("metrics: '" << bind_address << "' is not an IPv4 address");
  }
  if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd_, 16) != 0) {
    const int err = errno;
    ::close(fd_);
    SHARDLM_FAIL("metrics: cannot listen on " << bind_address << ":" << port << ": " << std::strerror(err));
  }
  socklen_t len = sizeof addr;
  ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  thread_ = std::thread([this] { serve(); });
}

MetricsServer::~MetricsServer() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) ::close(fd_);
}

void MetricsServer::serve() {
  while (!stop_) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;  // wakes up to notice stop_
    const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    // One request per connection; the request line is all that matters.
    char buf[2048];
    pollfd q{c, POLLIN, 0};
    ssize_t got = ::poll(&q, 1, 1000) > 0 ? ::recv(c, buf, sizeof buf - 1, 0) : -1;
    std::string request = got > 0 ? std::string(buf, static_cast<size_t>(got)) : std::string();
    std::string status = "200 OK", body;
    if (request.rfind("GET /metrics", 0) == 0) {
      body = metrics_.render();
    } else {
      status = "404 Not Found";
      body = "shardlm serves GET /metrics\n";
    }
    const std::string head = "HTTP/1.1 " + status + "\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: " +
                             std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
    const std::string all = head + body;
    size_t sent = 0;
    while (sent < all.size()) {
      const ssize_t n = ::send(c, all.data() + sent, all.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    ::close(c);
  }
}

void write_metrics_file(const Metrics& metrics, const std::string& path) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    SHARDLM_CHECK(out, "metrics: cannot write " << tmp);
    out << metrics.render();
    SHARDLM_CHECK(out.good(), "metrics: short write to " << tmp);
  }
  SHARDLM_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "metrics: cannot rename " << tmp << " to " << path);
}

}  // namespace shardlm
