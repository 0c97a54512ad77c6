// UTF-8 checks shared by the prompt reader (reject bad prompts) and the result writer (the HDF5
// string columns are declared UTF-8, so text that is not gets its bad bytes replaced).
#pragma once

#include <string>
#include <string_view>

namespace shardlm {

// True when s is well-formed UTF-8: no overlong forms, surrogates or code points above U+10FFFF.
bool is_valid_utf8(std::string_view s);

// s with every ill-formed byte sequence replaced by U+FFFD (one replacement per maximal bad
// subpart, as the Unicode standard recommends); valid input comes back unchanged.
std::string repair_utf8(std::string_view s);

// True when s ends inside a character: its last bytes begin a well-formed sequence that more bytes
// could complete ("\xE4\xBD"), as opposed to ending in bytes no continuation can mend.
bool ends_in_truncated_character(std::string_view s);

}  // namespace shardlm
