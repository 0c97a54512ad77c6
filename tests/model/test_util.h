// Helpers shared by the model tests: scratch directories and whole-file I/O.
#pragma once

#include "common/test_files.h"
#include "core/error.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace shardlm::test {

// A fresh directory under the system temp dir, removed on destruction.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    static int counter = 0;
    std::string name = std::string("shardlm_model_") + std::to_string(::getpid()) + "_" +
                       std::to_string(counter++) + "_" +
                       (info ? std::string(info->test_suite_name()) + "_" + info->name() : "x");
    for (auto& c : name)
      if (c == '/') c = '_';
    path_ = std::filesystem::temp_directory_path() / name;
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() { std::filesystem::remove_all(path_); }
  std::string str() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};


// Runs fn, which must throw shardlm::Error whose message contains every needle.
template <typename Fn>
void expect_error(Fn fn, std::initializer_list<std::string> needles) {
  try {
    fn();
    ADD_FAILURE() << "no Error thrown";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
}

}  // namespace shardlm::test
