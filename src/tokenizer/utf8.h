// UTF-8 helpers for the tokenizer: validation, lossy repair (U+FFFD), code point iteration.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace shardlm::tok {

// Scans one UTF-8 sequence at p[0..n). Returns its length and sets ok=true when it is a complete,
// well-formed character; otherwise ok=false and the return value is the length of the maximal
// ill-formed subpart (Unicode "substitution of maximal subparts", as Rust's from_utf8_lossy).
size_t utf8_scan(const unsigned char* p, size_t n, bool& ok);

bool is_valid_utf8(std::string_view s);

// Replaces each maximal ill-formed subsequence with U+FFFD. Valid input is returned unchanged.
std::string utf8_lossy(std::string_view s);

void append_utf8(std::string& out, char32_t cp);

// Decodes the character at s[i] (s must be valid UTF-8) and advances i past it.
char32_t next_codepoint(std::string_view s, size_t& i);

// Length of the character whose lead byte is c (valid UTF-8 assumed).
inline size_t utf8_len(unsigned char c) {
  return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

// Unicode White_Space (as Rust's char::is_whitespace).
bool is_unicode_space(char32_t cp);
// Letter, number or '_' (word character for single_word added tokens).
bool is_word_char(char32_t cp);

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

}  // namespace shardlm::tok
