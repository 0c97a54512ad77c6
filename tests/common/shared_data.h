// Locating ../shared reference data from tests; skip when it is absent (a user's fresh clone).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace shardlm::test {

inline std::string shared_dir() { return SHARDLM_SHARED_DIR; }

// Path under ../shared, or "" when missing.
inline std::string shared_path(const std::string& rel) {
  auto p = std::filesystem::path(SHARDLM_SHARED_DIR) / rel;
  return std::filesystem::exists(p) ? p.string() : std::string();
}

}  // namespace shardlm::test

// Skips the current test with a clear message when ../shared/<rel> is missing; else assigns var.
#define SHARDLM_REQUIRE_SHARED(var, rel)                                                         \
  std::string var = ::shardlm::test::shared_path(rel);                                            \
  if (var.empty()) {                                                                              \
    GTEST_SKIP() << "reference data " << SHARDLM_SHARED_DIR << "/" << rel                         \
                 << " is absent (it ships beside the repository in CI, not in a fresh clone)";   \
  }
