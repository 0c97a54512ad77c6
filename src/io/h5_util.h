// Thin helpers over the HDF5 C API for the result writer: an owning id, error checks that turn a
// failed call into shardlm::Error carrying HDF5's own message, and scalar attributes.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>

namespace shardlm::h5 {

// Turns off HDF5's printing of its error stack to stderr (process-wide, idempotent): failures are
// reported through Error instead, with the innermost HDF5 message appended.
void silence_error_printing();

// The innermost description on HDF5's current error stack ("" when empty).
std::string last_error_message();

// Throws Error "<context>: <what> failed: <HDF5 message>" when status is negative; else returns it.
int64_t check(int64_t status, const std::string& what, const std::string& context);

// The rows of a result file's group that its last flush committed: the root attribute
// rows_committed (/requests) or steps_committed (/steps); -1 where none is recorded (a file from
// before they were, another group). Rows past it may hold anything after a crash mid-flush.
int64_t committed_rows(hid_t file, const std::string& group);

// Owns one HDF5 id (dataset, group, type, space, property list, attribute) and drops it with
// H5Idec_ref. Files are closed explicitly by their owner so that a failed close is reported.
class Id {
 public:
  Id() = default;
  explicit Id(hid_t id) : id_(id) {}
  ~Id() { reset(); }
  Id(Id&& o) noexcept : id_(o.id_) { o.id_ = H5I_INVALID_HID; }
  Id& operator=(Id&& o) noexcept;
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  hid_t get() const { return id_; }
  void reset();

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// A new variable-length, UTF-8, NUL-terminated string type (elements are const char*).
Id make_utf8_string_type();

// Creates or replaces a scalar attribute on obj (a file or group id). Strings must be UTF-8.
void write_attr(hid_t obj, const std::string& name, const std::string& value, const std::string& context);
void write_attr(hid_t obj, const std::string& name, double value, const std::string& context);
void write_attr(hid_t obj, const std::string& name, int64_t value, const std::string& context);
void write_attr(hid_t obj, const std::string& name, uint64_t value, const std::string& context);  // U64 (seeds)

}  // namespace shardlm::h5
