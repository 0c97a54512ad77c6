// The Tokenizer implementation for Hugging Face tokenizer.json files (BPE model). Built by
// load_tokenizer_json (tokenizer_json.cpp); encode/decode live in hf_tokenizer.cpp.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace shardlm::tok {

struct HfTokenizerParts {
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pretokenizer;
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<Decoder> decoder;
  std::vector<AddedToken> added;
};

class HfTokenizer final : public Tokenizer {
 public:
  explicit HfTokenizer(HfTokenizerParts parts);

  // Invalid UTF-8 in `text` is replaced by U+FFFD (one per maximal ill-formed subsequence) before
  // anything else, so encode never fails on bad input.
  std::vector<int32_t> encode(const std::string& text) const override;
  // Ids outside [0, vocab_size) or without a token are skipped.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = true) const override;
  std::string token_bytes(int32_t id) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(pieces_.size()); }
  std::optional<int32_t> bos_to_prepend() const override { return bos_; }
  std::vector<int32_t> eos_ids() const override { return eos_; }
  bool is_special(int32_t id) const override {
    return id >= 0 && static_cast<size_t>(id) < special_.size() && special_[id];
  }

  void set_special_ids(std::optional<int32_t> bos, std::vector<int32_t> eos) {
    bos_ = bos;
    eos_ = std::move(eos);
  }
  // Id of a token string (added tokens first, then the model vocab).
  std::optional<int32_t> token_to_id(const std::string& token) const;

 private:
  void encode_plain(const std::string& segment, bool at_text_start, std::vector<int32_t>& out) const;

  HfTokenizerParts p_;
  AddedTokenMatcher raw_matcher_;   // added tokens with normalized=false, matched on raw text
  AddedTokenMatcher norm_matcher_;  // normalized=true, matched on normalised text
  std::vector<std::string> pieces_;  // decoder piece per id
  std::vector<std::string> first_pieces_;  // as the first token, where that differs (Metaspace); else empty
  std::vector<uint8_t> has_token_;
  std::vector<uint8_t> special_;
  std::optional<int32_t> bos_;
  std::vector<int32_t> eos_;
};

// Reads FILE (a tokenizer.json) plus the configs in DIR (see Tokenizer::load). Throws Error naming
// the file on anything unsupported or malformed.
std::unique_ptr<Tokenizer> load_tokenizer_json(const std::filesystem::path& dir, const std::filesystem::path& file);

}  // namespace shardlm::tok
