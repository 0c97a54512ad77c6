#include "tokenizer/byte_level.h"

#include <vector>

#include "tokenizer/utf8.h"

namespace shardlm::tok {
namespace {

struct Tables {
  std::array<std::string, 256> fwd;
  std::vector<int> inv;  // indexed by code point (< 512)
  Tables() : inv(512, -1) {
    std::array<bool, 256> direct{};
    for (int b = 33; b <= 126; ++b) direct[b] = true;
    for (int b = 161; b <= 172; ++b) direct[b] = true;
    for (int b = 174; b <= 255; ++b) direct[b] = true;
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      char32_t cp = direct[b] ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      append_utf8(fwd[b], cp);
      inv[cp] = b;
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

const std::array<std::string, 256>& byte_to_unicode() { return tables().fwd; }

int unicode_to_byte(char32_t cp) { return cp < 512 ? tables().inv[cp] : -1; }

std::string bytes_to_byte_level(std::string_view s) {
  const auto& fwd = tables().fwd;
  std::string out;
  out.reserve(s.size() * 2);
  for (unsigned char c : s) out += fwd[c];
  return out;
}

std::string byte_level_to_bytes(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  if (!is_valid_utf8(token)) return std::string(token);
  size_t i = 0;
  while (i < token.size()) {
    int b = unicode_to_byte(next_codepoint(token, i));
    if (b < 0) return std::string(token);
    out.push_back(static_cast<char>(b));
  }
  return out;
}

}  // namespace shardlm::tok
