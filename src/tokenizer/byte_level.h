// GPT-2 byte-level alphabet: every byte maps to a printable code point, so that BPE never sees
// raw whitespace or control bytes.
#pragma once

#include <array>
#include <string>
#include <string_view>

namespace shardlm::tok {

// UTF-8 encoding of the code point that byte b maps to.
const std::array<std::string, 256>& byte_to_unicode();
// Inverse map: the byte for code point cp, or -1 when cp is not in the alphabet.
int unicode_to_byte(char32_t cp);

// Maps every byte of s to its alphabet character.
std::string bytes_to_byte_level(std::string_view s);
// Maps a byte-level token back to bytes. When some character is outside the alphabet (an added
// token such as " <tag>"), the token's own bytes are returned, as Hugging Face does.
std::string byte_level_to_bytes(std::string_view token);

}  // namespace shardlm::tok
