#include "core/file_util.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "core/error.h"

namespace shardlm {

std::string read_file(const std::string& path) {
  std::error_code ec;
  // A directory opens for reading on Linux and reads as empty: a config "not valid JSON" later.
  SHARDLM_CHECK(!std::filesystem::is_directory(path, ec), "cannot read " << path << ": it is a directory");
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  SHARDLM_CHECK(f, "cannot read " << path << ": " << std::strerror(errno));
  std::string out;
  char buf[1 << 16];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f.get())) > 0) out.append(buf, n);
  // An I/O error part way (a network file system) must not pass for a short file.
  SHARDLM_CHECK(!std::ferror(f.get()), "error while reading " << path << " after " << out.size() << " bytes");
  return out;
}

}  // namespace shardlm
