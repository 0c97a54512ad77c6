// Whole-file reads for the small text files of a model directory (configs, tokenizer, index).
#pragma once

#include <string>

namespace shardlm {

// The bytes of PATH; throws Error "cannot read PATH" when it cannot be opened or read.
std::string read_file(const std::string& path);

}  // namespace shardlm
