// Helpers for the io tests: a scratch directory, file writing, and the process's resident memory.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/request_reader.h"

// AddressSanitizer quarantines freed memory (256 MiB by default), so RSS says nothing under it.
#if defined(__SANITIZE_ADDRESS__)
#define SHARDLM_IO_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SHARDLM_IO_ASAN 1
#endif
#endif

#ifndef SHARDLM_IO_ASAN
#define SHARDLM_IO_ASAN 0
#endif

namespace shardlm::test {

// A fresh directory under $TMPDIR (or /tmp), removed with its contents at scope exit.
class ScratchDir {
 public:
  ScratchDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/shardlm_io_XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + tmpl);
    path_ = buf.data();
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "writing " << path;
}

// Every request of a prompt file, in order.
inline std::vector<ParsedRequest> read_all(const std::string& path, PromptFormat format) {
  RequestReader reader(path, format);
  std::vector<ParsedRequest> out;
  while (auto r = reader.next()) out.push_back(std::move(*r));
  return out;
}

// VmRSS of this process in KiB, from /proc/self/status (-1 when unavailable).
inline long rss_kib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

}  // namespace shardlm::test
