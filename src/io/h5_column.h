// One column of the result file: an extendable, chunked 1-D dataset that grows by whole batches.
#pragma once

#include <hdf5.h>

#include <cstddef>
#include <string>

#include "io/h5_util.h"

namespace shardlm::h5 {

// Element kinds and the memory layout append() expects for each.
enum class ColumnKind {
  kInt32,        // int32_t
  kInt64,        // int64_t
  kFloat64,      // double
  kString,       // const char* (UTF-8, variable length)
  kVlenInt32,    // hvl_t of int32_t
  kVlenFloat32,  // hvl_t of float
  kVlenFloat64,  // hvl_t of double
};

class Column {
 public:
  // Creates <parent>/<name> empty, unlimited, in chunks of chunk_rows rows. `context` names the
  // file in error messages.
  Column(hid_t parent, const std::string& name, ColumnKind kind, hsize_t chunk_rows, const std::string& context);
  // Opens an existing <parent>/<name> (written by the constructor above) to append to it.
  Column(hid_t parent, const std::string& name, ColumnKind kind, const std::string& context);
  // Writes n elements after the last row.
  void append(const void* data, size_t n);
  // Drops rows past n (rows a crash left in some columns but not all).
  void truncate(hsize_t n);
  hsize_t size() const { return size_; }

 private:
  Id dset_;
  Id mem_type_;
  hsize_t size_ = 0;
  std::string where_;
};

}  // namespace shardlm::h5
