// A random checkpoint of an inputs/models config, made in-process once per (config, dtype, seed)
// and test process, under the system temp directory (removed at the process's exit).
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <tuple>

#include "common/test_dirs.h"
#include "core/dtype.h"
#include "model/make_model.h"

namespace shardlm::test {

inline std::string tiny_model_dir(const std::string& config, DType dtype = DType::F32, uint64_t seed = 7) {
  static std::map<std::tuple<std::string, int, uint64_t>, std::string> made;
  const auto key = std::make_tuple(config, static_cast<int>(dtype), seed);
  if (auto it = made.find(key); it != made.end()) return it->second;
  const auto root = fresh_dir(config + "-" + std::to_string(static_cast<int>(dtype)) + "-" + std::to_string(seed));
  const std::string dir = (root / "m").string();
  make_model({std::string(SHARDLM_SOURCE_DIR) + "/inputs/models/" + config + ".json", dir, dtype, seed, ""});
  return made[key] = dir;
}

}  // namespace shardlm::test
