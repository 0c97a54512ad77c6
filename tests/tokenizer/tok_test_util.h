// Helpers shared by the tokenizer tests.
#pragma once

#include "common/test_files.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace shardlm::test {


// Fresh empty directory under the system temp dir.
inline std::filesystem::path make_temp_dir(const std::string& tag) {
  auto base = std::filesystem::temp_directory_path() /
              ("shardlm_tok_" + tag + "_" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::filesystem::create_directories(base);
  return base;
}

inline std::vector<int32_t> parse_ids(const std::string& line) {
  std::vector<int32_t> ids;
  std::istringstream ss(line);
  long v;
  while (ss >> v) ids.push_back(static_cast<int32_t>(v));
  return ids;
}

}  // namespace shardlm::test
