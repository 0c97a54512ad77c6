// Code point helpers for the tokenizer (validation and repair live in core/utf8.h).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "core/utf8.h"  // is_valid_utf8, repair_utf8

namespace shardlm::tok {

// Appends the UTF-8 encoding of cp.
void append_utf8(std::string& out, char32_t cp);

// Decodes the character at s[i] (s must be valid UTF-8) and advances i past it.
char32_t next_codepoint(std::string_view s, size_t& i);

// Length of the character whose lead byte is c (valid UTF-8 assumed).
inline size_t utf8_len(unsigned char c) {
  return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

// Unicode White_Space (as Rust's char::is_whitespace).
bool is_unicode_space(char32_t cp);
// A word character as Rust regex's \w, which Hugging Face's single_word added tokens test:
// Alphabetic (letters, letter numbers, the circled / squared letters), marks, decimal digits,
// connector punctuation ('_'), Join_Control.
bool is_word_char(char32_t cp);

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

}  // namespace shardlm::tok
