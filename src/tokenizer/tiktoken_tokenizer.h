// The Tokenizer implementation for tiktoken BPE files as Kimi K2 ships them: DIR/tiktoken.model
// (the mergeable ranks, ids 0..N-1) plus DIR/tokenizer_config.json, whose added_tokens_decoder
// names special tokens at ids N, N+1, ...; the 256 ids from N on that it does not name are the
// reserved specials "<|reserved_token_ID|>" (as Kimi's TikTokenTokenizer defines them).
//
// Encoding: specials are matched first (all of them, as tiktoken's allowed_special="all"); each
// plain segment is cut into chunks as Kimi's TikTokenTokenizer.encode cuts its input (at most
// 400,000 characters, no run of more than 25,000 whitespace or non-whitespace characters); each
// chunk is cut by the split regex and every match is byte-pair encoded by rank (the text between
// matches, which this pattern never leaves, would be dropped as tiktoken drops it). Decoding
// concatenates token bytes.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/regex.h"
#include "tokenizer/tiktoken_ranks.h"
#include "tokenizer/tokenizer.h"

namespace shardlm::tok {

// Kimi K2's split pattern in PCRE2 syntax (class intersection "&&[^\p{Han}]" written as a
// negative look-ahead before each class).
extern const char* const kKimiPattern;
// Number of special ids reserved after the ranks (Kimi's num_reserved_special_tokens).
inline constexpr int32_t kTiktokenReservedSpecials = 256;
// Kimi's TIKTOKEN_MAX_ENCODE_CHARS and MAX_NO_WHITESPACES_CHARS (characters = code points).
inline constexpr size_t kTiktokenMaxChunkChars = 400000;
inline constexpr size_t kTiktokenMaxRunChars = 25000;

class TiktokenTokenizer final : public Tokenizer {
 public:
  // specials: the named ones (ids >= ranks.size()); unnamed ids up to the larger of
  // ranks.size() + kTiktokenReservedSpecials and the highest named id + 1 become reserved specials.
  // `file` names the config in errors.
  TiktokenTokenizer(TiktokenRanks ranks, const std::vector<AddedToken>& specials, const std::string& pattern,
                    const std::string& file);

  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = true) const override;
  std::string token_bytes(int32_t id) const override;
  int32_t vocab_size() const override { return ranks_.size() + static_cast<int32_t>(specials_.size()); }
  std::optional<int32_t> bos_to_prepend() const override { return bos_; }
  std::vector<int32_t> eos_ids() const override { return eos_; }
  bool is_special(int32_t id) const override {
    const int64_t k = int64_t{id} - ranks_.size();
    return k >= 0 && static_cast<size_t>(k) < specials_.size() && specials_[k].special;
  }

  void set_special_ids(std::optional<int32_t> bos, std::vector<int32_t> eos) {
    bos_ = bos;
    eos_ = std::move(eos);
  }
  // Id of a special token's content, else of a token's bytes.
  std::optional<int32_t> token_to_id(const std::string& token) const;

 private:
  void encode_chunk(std::string_view chunk, std::vector<std::pair<size_t, size_t>>& pieces,
                    std::vector<int32_t>& out) const;

  TiktokenRanks ranks_;
  Regex split_;
  AddedTokenMatcher matcher_;
  std::vector<AddedToken> specials_;  // indexed by id - ranks_.size()
  std::unordered_map<std::string, int32_t> special_ids_;
  std::optional<int32_t> bos_;
  std::vector<int32_t> eos_;
};

// Reads DIR/tiktoken.model, DIR/tokenizer_config.json (optional) and the BOS / EOS configs (see
// Tokenizer::load). Throws Error naming the file (and line, for tiktoken.model) when malformed.
std::unique_ptr<Tokenizer> load_tiktoken(const std::filesystem::path& dir);

}  // namespace shardlm::tok
