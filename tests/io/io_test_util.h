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

// A field of /proc/self/status in KiB (-1 when unavailable).
inline long status_kib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const size_t n = std::char_traits<char>::length(field);
  while (std::getline(in, line))
    if (line.rfind(field, 0) == 0) return std::stol(line.substr(n));
  return -1;
}

// VmRSS of this process in KiB (-1 when unavailable).
inline long rss_kib() { return status_kib("VmRSS:"); }

// The peak resident set (VmHWM), restarted from the current one by reset_peak_rss (false where
// /proc/self/clear_refs does not take it): a buffer allocated, filled and freed between the two
// shows in the peak, where the RSS read afterwards would not see it.
inline bool reset_peak_rss() {
  std::ofstream c("/proc/self/clear_refs");
  c << "5" << std::flush;
  return static_cast<bool>(c);
}
inline long peak_rss_kib() { return status_kib("VmHWM:"); }

}  // namespace shardlm::test
