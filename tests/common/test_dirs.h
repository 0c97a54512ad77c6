// Directories a test process makes under the system temp directory, removed when that process
// exits normally. Without this every CTest run left its checkpoints, prompt files and HDF5
// outputs behind (about 160 MB a run). SHARDLM_KEEP_TEST_DIRS=1 keeps them, to look at a failed
// run's files; a process that crashes or is aborted by MPI leaves its directories as well.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

namespace shardlm::test {

namespace detail {
class TestDirs {
 public:
  void add(const std::filesystem::path& d) {
    std::lock_guard<std::mutex> lock(mu_);
    dirs_.push_back(d);
  }
  ~TestDirs() {
    // A forked child that returns through exit() (not execv or _exit) must not remove the
    // directories its parent still uses.
    if (::getpid() != owner_) return;
    const char* keep = std::getenv("SHARDLM_KEEP_TEST_DIRS");
    if (keep != nullptr && *keep != '\0' && std::string(keep) != "0") return;
    for (const auto& d : dirs_) {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
    }
  }

 private:
  std::mutex mu_;
  std::vector<std::filesystem::path> dirs_;
  pid_t owner_ = ::getpid();
};

inline TestDirs& test_dirs() {
  static TestDirs dirs;
  return dirs;
}
}  // namespace detail

// A fresh, empty "shardlm-test-NAME-PID" under the temp directory, removed at this process's exit.
inline std::filesystem::path fresh_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / ("shardlm-test-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  detail::test_dirs().add(d);
  return d;
}

}  // namespace shardlm::test
