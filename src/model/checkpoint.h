// Checkpoint: read-only, memory-mapped view of the safetensors files of a Hugging Face directory.
//
// Handles model.safetensors or model.safetensors.index.json + shards. Every header is validated on
// open (JSON, dtypes, shapes, offsets inside the file, no overlaps); errors name file and tensor.
// Tensors are exposed in place (mmap): nothing is copied until a backend asks for a slice.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace shardlm {

struct TensorView {
  std::string name;
  std::string file;  // path of the safetensors file holding it
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // points into the mapped file
  size_t nbytes = 0;
  uint64_t file_offset = 0;    // where `data` starts in `file`
  // False for a view of bytes made in memory (a dequantised or converted slice): its bytes are not
  // those at file_offset, and a column slice copies them from `data` instead of reading the file.
  bool file_backed = true;

  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

class MappedFile;

class Checkpoint {
 public:
  // Opens DIR; throws Error when no safetensors file is found or a header is invalid.
  static std::unique_ptr<Checkpoint> open(const std::string& dir);
  ~Checkpoint();

  // Whether the checkpoint holds the tensor, in a dtype it reads or not.
  bool has(const std::string& name) const;
  // Throws Error naming the tensor and the directory when absent, or the file, the tensor and its
  // dtype when it is of a dtype shardlm does not read.
  const TensorView& get(const std::string& name) const;
  // Like get() but also checks dtype family and shape; the message names file, tensor, expected
  // and found shape.
  const TensorView& get(const std::string& name, const std::vector<int64_t>& shape) const;
  std::vector<std::string> names() const;  // the tensors it can read
  // Every tensor the files hold, those of dtypes shardlm does not read too, in name order; and
  // whether get() was asked for it (a model that never reads one loads something else than the
  // checkpoint holds: cli/unused_tensors.h).
  std::vector<std::string> all_names() const;
  bool was_read(const std::string& name) const;
  size_t nbytes_of(const std::string& name) const;  // 0 for one of a dtype it does not read
  const std::string& dir() const { return dir_; }
  // Total bytes of tensor data across all files.
  size_t total_bytes() const;
  // Adds the tensors of another safetensors file (validated as the checkpoint's are); one of the
  // same name as a checkpoint tensor replaces it. For --kv-scales: a calibration's fp8 KV scales
  // over those the checkpoint carries.
  void add_file(const std::string& path);

 private:
  Checkpoint() = default;
  // Maps one file and indexes its tensors; a name already present throws unless `replace`.
  void map_file(const std::string& path, const std::string& index_path,
                const std::map<std::string, std::string>& index_map, bool replace);
  std::string dir_;
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::map<std::string, TensorView> tensors_;
  struct Unread {
    std::string file;
    std::string why;
  };
  std::map<std::string, Unread> unread_;  // tensors of a dtype shardlm does not read, by name
  mutable std::mutex asked_mutex_;
  mutable std::set<std::string> asked_;  // names get() was called with
};

}  // namespace shardlm
