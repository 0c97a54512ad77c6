// safetensors format: header parsing with full validation, and a writer (used by make-model).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace shardlm {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::F32;  // unused when `unread` is set
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // offset into the data section (after the 8-byte length and the header)
  uint64_t end = 0;
  // A dtype of the safetensors format that shardlm does not read (F64, BOOL, I8, F8_E5M2, ...):
  // the tensor's bytes are checked like any other's, and only reading it is an error (a buffer or
  // quantiser metadata the model never reads must not reject the checkpoint).
  std::string unread;
};

struct SafetensorsHeader {
  uint64_t data_offset = 0;  // 8 + header length
  std::vector<SafetensorsEntry> entries;
};

// Parses and validates the header of a safetensors file of file_size bytes whose first bytes are
// `prefix` (at least 8 bytes; the whole header must be inside it). `file` only names the file in
// errors. Checks: header length within the file and below 100 MB, valid JSON object, dtypes of the
// format (those shardlm does not read are kept as `unread`),
// non-negative shapes whose element count fits 63 bits, end - begin == numel * dtype size, no name
// twice, and the tensors tiling the data section (no overlap, no gap, nothing after the last), as
// the reference reader requires. Throws Error naming the file and tensor.
SafetensorsHeader parse_safetensors_header(const uint8_t* prefix, size_t prefix_len, uint64_t file_size,
                                           const std::string& file);

// Writes a safetensors file; tensors are written in the order given.
struct SafetensorsWriteItem {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;  // numel * dtype_size bytes
};
void write_safetensors(const std::string& path, const std::vector<SafetensorsWriteItem>& items);

// Streaming writer: the header (all names, dtypes and shapes) is written up front, then each
// tensor's bytes in the declared order, so a large model never has to sit in memory at once.
struct SafetensorsTensorDecl {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};
class SafetensorsStreamWriter {
 public:
  SafetensorsStreamWriter(const std::string& path, std::vector<SafetensorsTensorDecl> decls);
  ~SafetensorsStreamWriter();
  SafetensorsStreamWriter(const SafetensorsStreamWriter&) = delete;
  SafetensorsStreamWriter& operator=(const SafetensorsStreamWriter&) = delete;
  // Appends the bytes of the next declared tensor; nbytes must equal its size.
  void write_next(const void* data, size_t nbytes);
  // Checks every tensor was written and closes the file (throws on I/O error).
  void finish();
  size_t next_index() const { return next_; }
  const std::vector<SafetensorsTensorDecl>& decls() const { return decls_; }

 private:
  std::string path_;
  std::vector<SafetensorsTensorDecl> decls_;
  size_t next_ = 0;
  void* fp_ = nullptr;  // FILE*
};

}  // namespace shardlm
