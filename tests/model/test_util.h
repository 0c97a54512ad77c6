// Helpers shared by the model tests: scratch directories and whole-file I/O.
#pragma once

#include "common/expect_error.h"
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

}  // namespace shardlm::test
