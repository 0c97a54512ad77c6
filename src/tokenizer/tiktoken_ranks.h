// The mergeable ranks of a tiktoken BPE file (tiktoken.model: one "<base64 token> <rank>" per
// line) and tiktoken's byte-pair encoding over them: a piece of text is split into bytes, then the
// adjacent pair whose concatenation has the lowest rank is merged (leftmost first on ties) until no
// adjacent pair concatenates to a token. A piece that is itself a token is that token.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace shardlm::tok {

class TiktokenRanks {
 public:
  // Parses the text of a tiktoken BPE file. Ranks must be exactly 0..N-1 (N = number of tokens),
  // tokens distinct and every single byte a token. Throws Error "FILE:LINE: ..." on a malformed
  // line (bad base64, bad rank, duplicate rank or token) and "FILE: ..." on a missing byte.
  static TiktokenRanks parse(std::string_view text, const std::string& file);

  int32_t size() const { return static_cast<int32_t>(spans_.size()); }
  // Bytes of the token of rank r (0 <= r < size()).
  std::string_view token(int32_t r) const { return {bytes_.data() + spans_[r].off, spans_[r].len}; }
  // Rank of a byte string, or -1 when it is not a token.
  int32_t rank(std::string_view bytes) const;

  // Appends the ranks of one piece (any bytes; empty appends nothing).
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

 private:
  TiktokenRanks() = default;  // only parse() builds one

  // Open-addressing hash table (linear probing). A slot holds a token's first 8 bytes (zero
  // padded) and length, so most lookups touch only the table; rank1 = rank + 1, 0 = empty.
  struct Slot {
    uint64_t head;
    uint32_t len;
    uint32_t rank1;
  };
  // Index of the slot holding `bytes`, or of the empty slot where it would go.
  size_t find_slot(std::string_view bytes) const;
  static uint64_t head_of(std::string_view s);

  struct Span {
    uint32_t off, len;  // into bytes_
  };
  std::string bytes_;         // every token's bytes, in file order
  std::vector<Span> spans_;   // by rank
  std::vector<Slot> table_;   // size: power of two >= 2 * size()
  int32_t byte_rank_[256];    // rank of each single byte
};

}  // namespace shardlm::tok
