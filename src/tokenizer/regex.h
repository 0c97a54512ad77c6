// PCRE2 (UTF + UCP, JIT) regular expression used by Split pre-tokenisers and Replace normalisers.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

struct pcre2_real_code_8;

namespace shardlm::tok {

class Regex {
 public:
  // literal=true matches `pattern` as a plain string. `file` names the tokenizer file in errors.
  Regex(const std::string& pattern, bool literal, const std::string& file);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends [start, end) of every non-empty, non-overlapping match in s (valid UTF-8 required).
  void find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  pcre2_real_code_8* code_ = nullptr;
  std::string pattern_;
};

}  // namespace shardlm::tok
