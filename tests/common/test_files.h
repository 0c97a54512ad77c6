// File helpers for tests.
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/file_util.h"

namespace shardlm::test {

using shardlm::read_file;

inline void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Whitespace-separated token ids (the format of expected_greedy_from_bos.ids).
inline std::vector<int32_t> read_ids(const std::string& path) {
  std::istringstream in(read_file(path));
  std::vector<int32_t> ids;
  int32_t v;
  while (in >> v) ids.push_back(v);
  return ids;
}

}  // namespace shardlm::test
