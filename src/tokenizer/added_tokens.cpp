#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace shardlm::tok {
namespace {

// Code point ending just before position `end` (valid UTF-8).
char32_t cp_before(std::string_view s, size_t end, size_t* start_out) {
  size_t b = end;
  do {
    --b;
  } while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80);
  size_t i = b;
  char32_t cp = next_codepoint(s, i);
  if (start_out) *start_out = b;
  return cp;
}

}  // namespace

void AddedTokenMatcher::add(const AddedToken& tok, std::string pattern) {
  if (pattern.empty()) return;
  auto idx = static_cast<uint32_t>(entries_.size());
  entries_.push_back({std::move(pattern), tok.id, tok.lstrip, tok.rstrip, tok.single_word});
  auto& bucket = by_first_[static_cast<unsigned char>(entries_.back().pattern[0])];
  // Longest first, equal lengths in the order added: placed by a binary search. Sorting the bucket
  // again at every add grew as the square of the tokens sharing a first byte (20k "<t..>": 1.3 s).
  const size_t len = entries_.back().pattern.size();
  bucket.insert(std::upper_bound(bucket.begin(), bucket.end(), len,
                                 [&](size_t n, uint32_t b) { return n > entries_[b].pattern.size(); }),
                idx);
}

void AddedTokenMatcher::split(std::string_view text, std::vector<Segment>& out) const {
  if (entries_.empty()) {
    if (!text.empty()) out.push_back({std::string(text), -1});
    return;
  }
  size_t seg_start = 0;  // start of the pending plain piece
  size_t pos = 0;
  while (pos < text.size()) {
    const auto& bucket = by_first_[static_cast<unsigned char>(text[pos])];
    const Entry* hit = nullptr;
    for (uint32_t idx : bucket) {
      const Entry& e = entries_[idx];
      if (text.size() - pos >= e.pattern.size() && text.compare(pos, e.pattern.size(), e.pattern) == 0) {
        hit = &e;
        break;
      }
    }
    if (hit && hit->single_word) {
      size_t end = pos + hit->pattern.size();
      bool ok = true;
      if (pos > 0 && is_word_char(cp_before(text, pos, nullptr))) ok = false;
      if (end < text.size()) {
        size_t j = end;
        if (is_word_char(next_codepoint(text, j))) ok = false;
      }
      if (!ok) {
        // Hugging Face's matcher goes on after the refused match (its matches never overlap): a
        // shorter token inside it is not looked for.
        pos += hit->pattern.size();
        continue;
      }
    }
    if (!hit) {
      ++pos;
      continue;
    }
    size_t mb = pos, me = pos + hit->pattern.size();
    if (hit->lstrip) {
      while (mb > seg_start) {
        size_t b;
        if (!is_unicode_space(cp_before(text, mb, &b))) break;
        mb = b;
      }
    }
    if (hit->rstrip) {
      while (me < text.size()) {
        size_t j = me;
        if (!is_unicode_space(next_codepoint(text, j))) break;
        me = j;
      }
    }
    if (mb > seg_start) out.push_back({std::string(text.substr(seg_start, mb - seg_start)), -1});
    out.push_back({std::string(text.substr(mb, me - mb)), hit->id});
    seg_start = pos = me;
  }
  if (seg_start < text.size()) out.push_back({std::string(text.substr(seg_start)), -1});
}

}  // namespace shardlm::tok
