#include "model/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace shardlm {

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  SHARDLM_CHECK(fd >= 0, "cannot open " << path << ": " << std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    SHARDLM_FAIL("cannot stat " << path << ": " << std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    SHARDLM_FAIL(path << " is not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      SHARDLM_FAIL("cannot mmap " << path << " (" << size_ << " bytes): " << std::strerror(e));
    }
    data_ = static_cast<uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(data_, size_);
}

void MappedFile::advise(size_t offset, size_t len, int advice) const {
  if (!data_ || offset >= size_ || len == 0) return;
  if (len > size_ - offset) len = size_ - offset;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  size_t begin = offset / page * page;
  size_t end = offset + len;
  ::madvise(data_ + begin, end - begin, advice);
}

void MappedFile::advise_sequential(size_t offset, size_t len) const { advise(offset, len, MADV_SEQUENTIAL); }
void MappedFile::advise_willneed(size_t offset, size_t len) const { advise(offset, len, MADV_WILLNEED); }
void MappedFile::advise_dontneed(size_t offset, size_t len) const { advise(offset, len, MADV_DONTNEED); }

}  // namespace shardlm
