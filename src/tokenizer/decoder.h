// Decoders of tokenizer.json, compiled into a per-token transform plus a whole-sequence finish:
// ByteLevel, Replace (String), ByteFallback, Fuse, Strip, Metaspace, Sequence.
//
// Decoding = concatenate the per-token pieces (raw bytes), repair invalid UTF-8 by replacing
// each maximal ill-formed subsequence with U+FFFD, then strip (Strip after Fuse) at the start of
// the whole text. Metaspace (with a prepend scheme) drops every replacement character of the first
// token instead of turning it into a space, as Hugging Face's does. This equals Hugging Face for every well-formed
// output; for byte sequences that are not valid UTF-8, HF's ByteFallback emits one U+FFFD per byte where this emits one
// per maximal ill-formed subsequence (which keeps decoding prefix-stable for streaming).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace shardlm::tok {

class Decoder {
 public:
  // j may be null (no decoder: tokens are joined with a space, as Hugging Face does).
  Decoder(const nlohmann::json& j, const std::string& file);

  // Bytes of one token as it appears when it is not the first of a sequence (first: when it is).
  std::string piece(std::string_view token, bool first = false) const;
  // Whether a token's piece differs when it comes first (Metaspace with a prepend scheme).
  bool first_piece_differs() const { return first_differs_; }
  // Separator between pieces ("" normally, " " without a decoder).
  const std::string& separator() const { return sep_; }
  // Turns the concatenated pieces into the final text.
  std::string finish(std::string bytes) const;

 private:
  struct Step {
    enum Kind { ByteLevel, Replace, ByteFallback, StripEach } kind;
    std::string from, to;  // Replace; StripEach: from = content
    bool drop_in_first = false;  // Replace: `from` goes (not to `to`) in a sequence's first token
    size_t start = 0, stop = 0;
  };
  void compile(const nlohmann::json& j, const std::string& file, bool& fused);

  std::vector<Step> steps_;
  std::string sep_;
  std::string strip_content_;  // whole-sequence strip (after Fuse)
  size_t strip_start_ = 0, strip_stop_ = 0;
  bool first_differs_ = false;
};

}  // namespace shardlm::tok
