// libFuzzer target: parse_safetensors_header on arbitrary bytes, three ways:
//   1. the whole input is the file (its size is the file size);
//   2. the same bytes as the prefix of a file 4 KiB longer (data section past the prefix);
//   3. the input is the JSON header alone: the 8-byte length is written here and a data section of
//      a size picked by the input's length follows, so mutations of the JSON stay parseable
//      instead of mostly breaking the length prefix. shardlm::Error is the documented way to reject input; any other exception, crash or
// sanitizer report is a bug. Accepted headers are checked against the documented invariants.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/safetensors.h"

namespace {

void check_invariants(const shardlm::SafetensorsHeader& h, size_t prefix_len, uint64_t file_size) {
  if (h.data_offset < 8 || h.data_offset > prefix_len || h.data_offset > file_size) std::abort();
  const uint64_t data_len = file_size - h.data_offset;
  for (const auto& e : h.entries) {
    if (e.begin > e.end || e.end > data_len) std::abort();
    for (int64_t d : e.shape)
      if (d < 0) std::abort();
  }
}

void parse_one(const uint8_t* data, size_t size, uint64_t file_size) {
  try {
    const auto h = shardlm::parse_safetensors_header(data, size, file_size, "fuzz.safetensors");
    check_invariants(h, size, file_size);
  } catch (const shardlm::Error&) {
    // rejected with a message: expected for bad input
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  parse_one(data, size, size);
  // The same bytes as the start of a bigger file (data section extends past the prefix).
  parse_one(data, size, static_cast<uint64_t>(size) + 4096);
  // The input as the header JSON; only the header needs to be in memory.
  std::vector<uint8_t> file(8 + size);
  for (int i = 0; i < 8; ++i) file[i] = static_cast<uint8_t>(static_cast<uint64_t>(size) >> (8 * i));
  if (size) std::memcpy(file.data() + 8, data, size);
  static constexpr uint64_t kDataLens[] = {0, 32, 4096, uint64_t{1} << 40};
  parse_one(file.data(), file.size(), file.size() + kDataLens[size % 4]);
  return 0;
}
