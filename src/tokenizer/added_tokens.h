// Added tokens of tokenizer.json ("added_tokens"): matched in the text before the model runs,
// leftmost first, longest at a position, honouring lstrip / rstrip / single_word.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace shardlm::tok {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

// A piece of input: either plain text (id < 0) or one added token.
struct Segment {
  std::string text;
  int32_t id = -1;
};

class AddedTokenMatcher {
 public:
  // patterns[i] is the string to look for (the token content, normalised for normalized tokens).
  void add(const AddedToken& tok, std::string pattern);
  bool empty() const { return entries_.empty(); }
  // Splits `text` into plain pieces and matched tokens (appended to out; empty plain pieces are
  // dropped).
  void split(std::string_view text, std::vector<Segment>& out) const;

 private:
  struct Entry {
    std::string pattern;
    int32_t id;
    bool lstrip, rstrip, single_word;
  };
  std::vector<Entry> entries_;
  // Entries grouped by first byte, longest pattern first.
  std::array<std::vector<uint32_t>, 256> by_first_{};
};

}  // namespace shardlm::tok
