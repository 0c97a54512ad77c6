// StreamDecoder: incremental detokenisation by decoding a short suffix window of ids.
#include <algorithm>
#include <string_view>
#include <vector>

#include "core/utf8.h"

#include "tokenizer/tokenizer.h"

namespace shardlm {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

bool ends_with_replacement(const std::string& s) {
  return s.size() >= kReplacement.size() && s.compare(s.size() - kReplacement.size(), kReplacement.size(), kReplacement) == 0;
}

// Whether the bytes of ids[from, end) end inside a character that a later token may complete. A
// window text ending in U+FFFD is held only then: a U+FFFD the model wrote (Qwen2 has it as a
// token) or bytes nothing can mend would otherwise hold the window for ever, each push decoding
// a longer one, and stop strings unseen until the run of them ends.
bool ends_mid_character(const Tokenizer& tok, const std::vector<int32_t>& ids, size_t from, bool skip_special) {
  std::string tail;
  for (size_t k = ids.size(); k > from && tail.size() < 4; --k) {
    if (skip_special && tok.is_special(ids[k - 1])) continue;
    tail.insert(0, tok.token_bytes(ids[k - 1]));
  }
  return ends_in_truncated_character(tail);
}

}  // namespace

void StreamDecoder::prime(const std::vector<int32_t>& context) {
  for (int32_t id : context) push(id);
}

std::vector<int32_t> detokenization_context(const Tokenizer& tok, const std::vector<int32_t>& prompt) {
  const size_t n = prompt.size();
  if (n > 4) {
    for (size_t len = 4; len <= std::min<size_t>(n, 23); ++len) {
      std::vector<int32_t> suffix(prompt.end() - static_cast<std::ptrdiff_t>(len), prompt.end());
      if (tok.decode(suffix).find(kReplacement) == std::string::npos) return suffix;
    }
  }
  // vLLM falls back on the whole prompt; its last 23 tokens decode the same continuation unless
  // all of them are broken bytes, and priming on a long prompt of those would hold every byte.
  return std::vector<int32_t>(prompt.end() - static_cast<std::ptrdiff_t>(std::min<size_t>(n, 23)), prompt.end());
}

std::string StreamDecoder::push(int32_t id) {
  // A skipped special token decodes to nothing anywhere in the window: kept out of it, so a run of
  // them (EOS under ignore_eos) costs nothing instead of a growing window decoded twice a token.
  if (skip_special_ && tok_.is_special(id)) return {};
  ids_.push_back(id);
  const auto begin = ids_.begin();
  std::string prev;
  if (read_off_ > prefix_off_)
    prev = tok_.decode(std::vector<int32_t>(begin + static_cast<std::ptrdiff_t>(prefix_off_),
                                            begin + static_cast<std::ptrdiff_t>(read_off_)),
                       skip_special_);
  std::string cur = tok_.decode(std::vector<int32_t>(begin + static_cast<std::ptrdiff_t>(prefix_off_), ids_.end()),
                                skip_special_);
  // Hold back while the window ends in an incomplete (or invalid) character: more bytes may
  // complete it. decode() is prefix-stable at complete characters, so cur extends prev.
  if (cur.size() <= prev.size() || cur.compare(0, prev.size(), prev) != 0) return {};
  if (ends_with_replacement(cur) && ends_mid_character(tok_, ids_, read_off_, skip_special_)) return {};
  std::string out = cur.substr(prev.size());
  prefix_off_ = read_off_;
  read_off_ = ids_.size();
  if (prefix_off_ >= 256) {
    ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_off_));
    read_off_ -= prefix_off_;
    prefix_off_ = 0;
  }
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  if (read_off_ < ids_.size()) {
    const auto begin = ids_.begin();
    std::string prev;
    if (read_off_ > prefix_off_)
      prev = tok_.decode(std::vector<int32_t>(begin + static_cast<std::ptrdiff_t>(prefix_off_),
                                              begin + static_cast<std::ptrdiff_t>(read_off_)),
                         skip_special_);
    std::string cur = tok_.decode(
        std::vector<int32_t>(begin + static_cast<std::ptrdiff_t>(prefix_off_), ids_.end()), skip_special_);
    if (cur.size() > prev.size() && cur.compare(0, prev.size(), prev) == 0) out = cur.substr(prev.size());
  }
  ids_.clear();
  prefix_off_ = read_off_ = 0;
  return out;
}

}  // namespace shardlm
