// read_file: the bytes of a file, and an error naming the path for a missing file, a directory and
// a read that fails part way (/proc/self/mem at address 0 answers EIO).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "core/file_util.h"

namespace shardlm {
namespace {

std::string error_of(const std::string& path) {
  try {
    read_file(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ReadFile, BytesAndErrorsNamingThePath) {
  const auto dir = std::filesystem::temp_directory_path() / ("shardlm-read-file-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "a.bin").string();
  const std::string bytes = std::string("x\0y", 3) + std::string(200000, 'z');
  std::ofstream(file, std::ios::binary) << bytes;
  EXPECT_EQ(read_file(file), bytes);
  EXPECT_NE(error_of((dir / "missing.json").string())
                .find("cannot read " + (dir / "missing.json").string() + ": No such file or directory"),
            std::string::npos);
  EXPECT_NE(error_of(dir.string()).find("cannot read " + dir.string() + ": it is a directory"), std::string::npos)
      << error_of(dir.string());
  EXPECT_NE(error_of("/proc/self/mem").find("error while reading /proc/self/mem after 0 bytes"), std::string::npos)
      << error_of("/proc/self/mem");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace shardlm
