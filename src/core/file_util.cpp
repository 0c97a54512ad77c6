#include "core/file_util.h"

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace shardlm {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  SHARDLM_CHECK(in, "cannot read " << path);
  std::ostringstream ss;
  ss << in.rdbuf();
  SHARDLM_CHECK(!in.bad(), "error while reading " << path);
  return ss.str();
}

}  // namespace shardlm
