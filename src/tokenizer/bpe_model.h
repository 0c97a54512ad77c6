// BPE model of tokenizer.json: vocab, ranked merges, byte fallback, unk/fuse_unk, ignore_merges,
// continuing_subword_prefix / end_of_word_suffix. Words are merged lowest rank first with a
// priority queue over a linked list of symbols; results are cached per word.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace shardlm::tok {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  using VocabList = std::vector<std::pair<std::string, int64_t>>;
  using MergeList = std::vector<std::pair<std::string, std::string>>;
  // Builds the model from the "model" object (minus vocab / merges) and the vocab / merges lists
  // read by parse_tokenizer_json (consumed; nullptr when absent or not of the expected JSON type).
  // Throws Error naming `file` on anything malformed or unsupported.
  static std::unique_ptr<BpeModel> build(const nlohmann::json& model, VocabList* vocab, MergeList* merges,
                                         const std::string& file);

  // Appends the ids of one pre-tokenised word.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  // Token strings indexed by id (empty where the vocab has a hole); views into the vocab map.
  const std::vector<std::string_view>& id_to_token() const { return id_to_token_; }

 private:
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  struct Merge {
    int32_t rank;
    int32_t new_id;
  };

  TokenMap vocab_;
  std::vector<std::string_view> id_to_token_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::string prefix_;  // continuing_subword_prefix
  std::string suffix_;  // end_of_word_suffix
  int32_t byte_ids_[256];  // <0xNN> ids, -1 when absent

  // Word cache (thread-safe; cleared when full).
  static constexpr size_t kCacheCapacity = 1 << 16;
  static constexpr size_t kMaxCachedWordBytes = 256;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace shardlm::tok
