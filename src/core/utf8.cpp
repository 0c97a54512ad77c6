#include "core/utf8.h"

#include <cstdint>

namespace shardlm {
namespace {

// Length of the well-formed sequence starting at s[i], or 0 when it is ill-formed. `bad_len`
// receives how many bytes to replace in that case (the maximal subpart, at least 1).
size_t sequence_length(std::string_view s, size_t i, size_t* bad_len) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t c = b(i);
  *bad_len = 1;
  if (c < 0x80) return 1;
  size_t n;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;        // overlong
    if (c == 0xED) hi = 0x9F;        // surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;        // overlong
    if (c == 0xF4) hi = 0x8F;        // above U+10FFFF
  } else {
    return 0;  // continuation byte, C0/C1, F5..FF
  }
  for (size_t k = 1; k < n; ++k) {
    if (i + k >= s.size()) {
      *bad_len = k;
      return 0;
    }
    const uint8_t x = b(i + k);
    const uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (x < l || x > h) {
      *bad_len = k;
      return 0;
    }
  }
  return n;
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
  size_t i = 0, bad = 0;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t n = sequence_length(s, i, &bad);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

bool ends_in_truncated_character(std::string_view s) {
  // From the end, over continuation bytes, to the last lead: a truncated sequence is at most 3
  // bytes, so its lead is among the last 3 (an earlier lead's sequence ended before it).
  for (size_t k = 1; k <= 3 && k <= s.size(); ++k) {
    const size_t i = s.size() - k;
    const auto c = static_cast<uint8_t>(s[i]);
    if (c >= 0x80 && c <= 0xBF) continue;
    if (c < 0xC2 || c > 0xF4) return false;  // ASCII or a byte that begins nothing
    size_t bad = 0;
    return sequence_length(s, i, &bad) == 0 && i + bad == s.size();
  }
  return false;
}

std::string repair_utf8(std::string_view s) {
  if (is_valid_utf8(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 8);
  size_t i = 0, bad = 0;
  while (i < s.size()) {
    const size_t n = sequence_length(s, i, &bad);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      i += bad;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

}  // namespace shardlm
