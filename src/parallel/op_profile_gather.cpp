// See op_profile_gather.h. The rows travel as text (a rank has a few dozen), one line each, the
// fields apart by a unit separator and the times as hexadecimal floats, so the bits arrive as sent.
#include "parallel/op_profile_gather.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "core/error.h"
#include "parallel/communicator.h"

namespace shardlm {
namespace {

constexpr char kSep = '\x1f';

std::string pack(const std::vector<OpProfileRow>& rows) {
  std::string s;
  char num[64];
  for (const OpProfileRow& r : rows) {
    SHARDLM_CHECK(
        r.kind.find_first_of("\n\x1f") == std::string::npos && r.section.find_first_of("\n\x1f") == std::string::npos,
        "op profile: a kind or section name with a newline or unit separator");
    s += r.kind + kSep + r.section + kSep + std::to_string(r.steps) + kSep + std::to_string(r.calls) + kSep;
    std::snprintf(num, sizeof num, "%a%c%a%c", r.seconds, kSep, r.step_seconds, kSep);
    s += num;
    s += std::to_string(r.bytes) + "\n";
  }
  return s;
}

std::vector<OpProfileRow> unpack(const std::string& text, int32_t rank) {
  std::vector<OpProfileRow> rows;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::vector<std::string> f;
    std::istringstream fields(line);
    for (std::string x; std::getline(fields, x, kSep);) f.push_back(x);
    SHARDLM_CHECK(f.size() == 7, "op profile: rank " << rank << " sent a row of " << f.size() << " fields");
    rows.push_back({rank, f[0], f[1], std::stoll(f[2]), std::stoll(f[3]), std::strtod(f[4].c_str(), nullptr),
                    std::strtod(f[5].c_str(), nullptr), std::stoll(f[6])});
  }
  return rows;
}

}  // namespace

std::vector<OpProfileRow> gather_op_profile_rows(Communicator* world, const std::vector<OpProfileRow>& mine) {
  if (!world) return mine;
  const std::string text = pack(mine);
  const size_t n = static_cast<size_t>(world->size());
  const int64_t len = static_cast<int64_t>(text.size());
  std::vector<int64_t> lens(n);
  world->all_gather(&len, lens.data(), 1, CommDType::kI64);
  const size_t width = static_cast<size_t>(std::max<int64_t>(1, *std::max_element(lens.begin(), lens.end())));
  std::string padded = text;
  padded.resize(width, '\0');
  std::string all(width * n, '\0');
  world->all_gather(padded.data(), all.data(), width, CommDType::kU8);
  std::vector<OpProfileRow> rows;
  for (size_t r = 0; r < n; ++r) {
    const std::vector<OpProfileRow> part =
        unpack(all.substr(r * width, static_cast<size_t>(lens[r])), static_cast<int32_t>(r));
    rows.insert(rows.end(), part.begin(), part.end());
  }
  return rows;
}

}  // namespace shardlm
