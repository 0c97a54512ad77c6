// A tiny deterministic byte-level BPE trainer (GPT-2 style), used by make-model to give random
// test models a real Hugging Face tokenizer.json.
//
// Pre-tokenisation is the GPT-2 regex; every byte is a base token (ids 0..255 in byte order);
// merges are learned greedily: at each step the most frequent adjacent pair over the corpus words
// is merged, ties broken by the smaller (left bytes, right bytes). Same corpus + limit => same
// vocabulary and merges on every platform.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace shardlm {

// The GPT-2 pre-tokeniser pattern (PCRE2 / Oniguruma syntax; needs Unicode properties).
extern const char* const kGpt2SplitRegex;

// UTF-8 of the printable character GPT-2's bytes_to_unicode maps byte B to.
std::string byte_level_char(uint8_t b);
// Maps every byte of RAW to its byte-level character.
std::string to_byte_level(const std::string& raw);

// Splits TEXT (valid UTF-8) with kGpt2SplitRegex. Throws Error on invalid UTF-8.
std::vector<std::string> gpt2_pretokenize(const std::string& text);

struct BpeModel {
  std::vector<std::string> tokens;  // raw bytes of each token; id = index; 0..255 are single bytes
  std::vector<std::pair<int32_t, int32_t>> merges;  // in rank order, as token ids
};

// Learns at most MAX_MERGES merges from CORPUS; stops early when no adjacent pair occurs at least
// MIN_FREQUENCY times. tokens.size() <= 256 + max_merges.
BpeModel train_byte_level_bpe(const std::string& corpus, size_t max_merges, int64_t min_frequency = 2);

}  // namespace shardlm
