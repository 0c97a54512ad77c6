#include "model/bpe_trainer.h"

#include <pcre2.h>

#include <map>
#include <set>
#include <unordered_map>

#include "core/error.h"

namespace shardlm {

const char* const kGpt2SplitRegex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

namespace {

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

}  // namespace

std::string byte_level_char(uint8_t b) {
  // GPT-2 bytes_to_unicode: printable Latin-1 bytes map to themselves, the rest to 256 + n.
  static const std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    auto printable = [](int c) { return (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF); };
    int n = 0;
    for (int c = 0; c < 256; ++c) t[c] = utf8(printable(c) ? static_cast<uint32_t>(c) : static_cast<uint32_t>(256 + n++));
    return t;
  }();
  return table[b];
}

std::string to_byte_level(const std::string& raw) {
  std::string out;
  for (unsigned char c : raw) out += byte_level_char(c);
  return out;
}

std::vector<std::string> gpt2_pretokenize(const std::string& text) {
  int err = 0;
  PCRE2_SIZE erroff = 0;
  pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kGpt2SplitRegex), PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF | PCRE2_UCP, &err, &erroff, nullptr);
  SHARDLM_CHECK(re, "internal: GPT-2 split regex does not compile (error " << err << " at " << erroff << ")");
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(re, nullptr);
  // Freed once, on every way out (a throw included).
  struct Free {
    pcre2_code* re;
    pcre2_match_data* md;
    ~Free() {
      pcre2_match_data_free(md);
      pcre2_code_free(re);
    }
  } free_at_exit{re, md};
  std::vector<std::string> out;
  PCRE2_SIZE pos = 0;
  uint32_t opts = 0;
  while (pos < text.size()) {
    int rc = pcre2_match(re, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), pos, opts, md, nullptr);
    if (rc < 0) {
      SHARDLM_CHECK(rc == PCRE2_ERROR_NOMATCH, "BPE trainer: corpus is not valid UTF-8 near byte " << pos);
      break;
    }
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    if (ov[1] == ov[0]) {  // cannot happen with this pattern, but never loop forever
      ++pos;
      continue;
    }
    out.emplace_back(text.substr(ov[0], ov[1] - ov[0]));
    pos = ov[1];
    opts = PCRE2_NO_UTF_CHECK;  // checked once on the first match
  }
  return out;
}

BpeModel train_byte_level_bpe(const std::string& corpus, size_t max_merges, int64_t min_frequency) {
  BpeModel m;
  for (int b = 0; b < 256; ++b) m.tokens.emplace_back(1, static_cast<char>(b));
  std::map<std::string, int32_t> token_id;
  for (int b = 0; b < 256; ++b) token_id[m.tokens[b]] = b;

  // Unique words (in sorted order, so the result never depends on hashing) and their counts.
  std::map<std::string, int64_t> word_count;
  for (auto& w : gpt2_pretokenize(corpus)) ++word_count[w];
  std::vector<std::vector<int32_t>> words;
  std::vector<int64_t> counts;
  for (const auto& [w, c] : word_count) {
    std::vector<int32_t> syms;
    for (unsigned char ch : w) syms.push_back(ch);
    words.push_back(std::move(syms));
    counts.push_back(c);
  }

  std::set<std::pair<int32_t, int32_t>> recorded;
  std::unordered_map<uint64_t, int64_t> pair_count;
  while (m.merges.size() < max_merges) {
    pair_count.clear();
    for (size_t w = 0; w < words.size(); ++w) {
      const auto& s = words[w];
      for (size_t i = 0; i + 1 < s.size(); ++i)
        pair_count[(static_cast<uint64_t>(s[i]) << 32) | static_cast<uint32_t>(s[i + 1])] += counts[w];
    }
    // Most frequent pair; ties go to the smaller (left bytes, right bytes).
    int64_t best_count = 0;
    int32_t best_a = -1, best_b = -1;
    for (const auto& [key, c] : pair_count) {
      const int32_t a = static_cast<int32_t>(key >> 32), b = static_cast<int32_t>(key & 0xffffffffu);
      bool better = c > best_count;
      if (!better && c == best_count && best_a >= 0) {
        const std::string &ta = m.tokens[a], &tb = m.tokens[b], &ba = m.tokens[best_a], &bb = m.tokens[best_b];
        better = ta < ba || (ta == ba && tb < bb);
      }
      if (better) {
        best_count = c;
        best_a = a;
        best_b = b;
      }
    }
    if (best_a < 0 || best_count < min_frequency) break;
    const std::string merged = m.tokens[best_a] + m.tokens[best_b];
    int32_t id;
    auto it = token_id.find(merged);
    if (it != token_id.end()) {
      id = it->second;
    } else {
      id = static_cast<int32_t>(m.tokens.size());
      m.tokens.push_back(merged);
      token_id[merged] = id;
    }
    if (recorded.insert({best_a, best_b}).second) m.merges.emplace_back(best_a, best_b);
    for (auto& s : words) {
      std::vector<int32_t> out;
      out.reserve(s.size());
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == best_a && s[i + 1] == best_b) {
          out.push_back(id);
          ++i;
        } else {
          out.push_back(s[i]);
        }
      }
      s.swap(out);
    }
  }
  return m;
}

}  // namespace shardlm
