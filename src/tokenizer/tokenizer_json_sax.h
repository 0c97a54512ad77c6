// Fast reader for tokenizer.json: a SAX pass that stores model.vocab and model.merges in flat
// vectors (the bulk of the file: ~150k entries each for Qwen2) and builds an ordinary JSON tree
// for everything else. About 8x faster than a full DOM parse.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace shardlm::tok {

struct TokenizerJsonData {
  nlohmann::json root;  // everything except model.vocab (when an object) and model.merges (when an array)
  std::optional<std::vector<std::pair<std::string, int64_t>>> vocab;
  // Merges in rank order; the "a b" string form is split at its single space while parsing.
  std::optional<std::vector<std::pair<std::string, std::string>>> merges;
};

// Throws Error naming `file` on malformed JSON.
TokenizerJsonData parse_tokenizer_json(const std::string& text, const std::string& file);

}  // namespace shardlm::tok
