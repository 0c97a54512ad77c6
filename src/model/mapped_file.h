// MappedFile: RAII read-only memory map of a whole file (mmap + madvise).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace shardlm {

class MappedFile {
 public:
  // Maps PATH read-only. Throws Error naming the path when it cannot be opened or mapped.
  // An empty file is allowed (data() is nullptr, size() is 0).
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // Access-pattern hints for [offset, offset + len) (rounded out to pages); failures are ignored.
  void advise_sequential(size_t offset, size_t len) const;
  void advise_willneed(size_t offset, size_t len) const;
  void advise_dontneed(size_t offset, size_t len) const;

 private:
  void advise(size_t offset, size_t len, int advice) const;
  std::string path_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace shardlm
