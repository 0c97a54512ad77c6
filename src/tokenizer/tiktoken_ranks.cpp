#include "tokenizer/tiktoken_ranks.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <functional>

#include "core/error.h"

namespace shardlm::tok {
namespace {

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Standard base64 with padding; appends the bytes to out. False when s is not such a string.
bool decode_base64(std::string_view s, std::string& out) {
  if (s.empty() || s.size() % 4 != 0) return false;
  for (size_t i = 0; i < s.size(); i += 4) {
    const bool last = i + 4 == s.size();
    const int pad = last ? (s[i + 3] == '=') + (s[i + 2] == '=' && s[i + 3] == '=') : 0;
    int v[4] = {0, 0, 0, 0};
    for (int k = 0; k < 4 - pad; ++k) {
      v[k] = base64_value(s[i + k]);
      if (v[k] < 0) return false;
    }
    const uint32_t w = (uint32_t(v[0]) << 18) | (uint32_t(v[1]) << 12) | (uint32_t(v[2]) << 6) | uint32_t(v[3]);
    out.push_back(static_cast<char>(w >> 16));
    if (pad < 2) out.push_back(static_cast<char>((w >> 8) & 0xFF));
    if (pad < 1) out.push_back(static_cast<char>(w & 0xFF));
  }
  return true;
}

}  // namespace

uint64_t TiktokenRanks::head_of(std::string_view s) {
  uint64_t head = 0;
  if (!s.empty()) std::memcpy(&head, s.data(), std::min<size_t>(s.size(), 8));
  return head;
}

size_t TiktokenRanks::find_slot(std::string_view bytes) const {
  // FNV-1a (tokens are short) with a final mix.
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ULL;
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 32;
  const uint64_t head = head_of(bytes), mask = table_.size() - 1;
  for (uint64_t i = h & mask;; i = (i + 1) & mask) {
    const Slot& s = table_[i];
    if (s.rank1 == 0) return i;
    if (s.head == head && s.len == bytes.size() &&
        (s.len <= 8 || token(static_cast<int32_t>(s.rank1 - 1)).substr(8) == bytes.substr(8)))
      return i;
  }
}

int32_t TiktokenRanks::rank(std::string_view bytes) const {
  return static_cast<int32_t>(table_[find_slot(bytes)].rank1) - 1;
}

TiktokenRanks TiktokenRanks::parse(std::string_view text, const std::string& file) {
  struct Entry {
    uint32_t off, len;
    int64_t rank;
    uint32_t line;
  };
  SHARDLM_CHECK(text.size() < (size_t{1} << 32), file << ": larger than 4 GiB");
  TiktokenRanks t;
  std::vector<Entry> entries;
  t.bytes_.reserve(text.size() * 3 / 4);
  uint32_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;  // tiktoken skips blank lines too
    const size_t sp = line.find(' ');
    SHARDLM_CHECK(sp != std::string_view::npos && sp > 0 && line.find(' ', sp + 1) == std::string_view::npos,
                  file << ":" << line_no << ": expected \"<base64 token> <rank>\"");
    const std::string_view tok = line.substr(0, sp), rank_text = line.substr(sp + 1);
    const size_t off = t.bytes_.size();
    SHARDLM_CHECK(decode_base64(tok, t.bytes_),
                  file << ":" << line_no << ": token \"" << tok << "\" is not valid base64");
    int64_t rank = -1;
    const auto [end, ec] = std::from_chars(rank_text.data(), rank_text.data() + rank_text.size(), rank);
    SHARDLM_CHECK(ec == std::errc() && end == rank_text.data() + rank_text.size() && rank >= 0 &&
                      rank < (int64_t{1} << 30),
                  file << ":" << line_no << ": rank \"" << rank_text << "\" is not an integer in [0, 2^30)");
    entries.push_back({static_cast<uint32_t>(off), static_cast<uint32_t>(t.bytes_.size() - off), rank, line_no});
  }
  const size_t n = entries.size();
  SHARDLM_CHECK(n > 0, file << ": no tokens");
  t.spans_.assign(n, Span{0, 0});
  std::vector<uint32_t> line_of(n, 0);
  for (const auto& e : entries) {
    SHARDLM_CHECK(static_cast<size_t>(e.rank) < n, file << ":" << e.line << ": rank " << e.rank
                                                        << " is out of range: the file has " << n
                                                        << " tokens, so ranks must be 0.." << n - 1);
    SHARDLM_CHECK(line_of[e.rank] == 0, file << ":" << e.line << ": duplicate rank " << e.rank << " (also on line "
                                             << line_of[e.rank] << ")");
    line_of[e.rank] = e.line;
    t.spans_[e.rank] = {e.off, e.len};
  }
  size_t cap = 1;
  while (cap < 2 * n) cap <<= 1;
  t.table_.assign(cap, Slot{0, 0, 0});
  for (size_t r = 0; r < n; ++r) {
    const std::string_view tok = t.token(static_cast<int32_t>(r));
    Slot& slot = t.table_[t.find_slot(tok)];
    SHARDLM_CHECK(slot.rank1 == 0, file << ":" << line_of[r] << ": duplicate token: rank " << r
                                        << " has the same bytes as rank " << slot.rank1 - 1 << " (line "
                                        << line_of[slot.rank1 - 1] << ")");
    slot = {head_of(tok), static_cast<uint32_t>(tok.size()), static_cast<uint32_t>(r + 1)};
  }
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    t.byte_rank_[b] = t.rank(std::string_view(&c, 1));
    SHARDLM_CHECK(t.byte_rank_[b] >= 0,
                  file << ": byte 0x" << std::hex << b << " is not a token (every single byte must be one)");
  }
  return t;
}

void TiktokenRanks::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (const int32_t whole = rank(piece); whole >= 0) {
    out.push_back(whole);
    return;
  }
  // Symbols are contiguous byte spans, indexed by their first byte; a merge extends the left
  // symbol over the right one. Candidates are (rank, start, end) of adjacent pairs, popped lowest
  // rank then leftmost first; a candidate is stale when its pair no longer spans [start, end).
  struct Sym {
    int32_t end;  // -1 once merged into its left neighbour
    int32_t prev, next;
    int32_t rank;
  };
  struct Cand {
    int32_t rank, start, end;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : start > o.start; }
  };
  const auto n = static_cast<int32_t>(piece.size());
  std::vector<Sym> sym(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i)
    sym[i] = {i + 1, i - 1, i + 1 < n ? i + 1 : -1, byte_rank_[static_cast<unsigned char>(piece[i])]};
  std::vector<Cand> heap;
  heap.reserve(static_cast<size_t>(n));
  auto consider = [&](int32_t i) {
    const int32_t j = sym[i].next;
    if (j < 0) return;
    const int32_t r = rank(piece.substr(i, sym[j].end - i));
    if (r < 0) return;
    heap.push_back({r, i, sym[j].end});
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const Cand c = heap.back();
    heap.pop_back();
    Sym& s = sym[c.start];
    if (s.end < 0 || s.next < 0 || sym[s.next].end != c.end) continue;
    Sym& right = sym[s.next];
    s.end = c.end;
    s.rank = c.rank;
    s.next = right.next;
    right.end = -1;
    if (s.next >= 0) sym[s.next].prev = c.start;
    if (s.prev >= 0) consider(s.prev);
    consider(c.start);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) out.push_back(sym[i].rank);
}

}  // namespace shardlm::tok
