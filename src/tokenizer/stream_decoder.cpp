// StreamDecoder: incremental detokenisation by decoding a short suffix window of ids.
#include <string_view>

#include "tokenizer/tokenizer.h"

namespace shardlm {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

bool ends_with_replacement(const std::string& s) {
  return s.size() >= kReplacement.size() && s.compare(s.size() - kReplacement.size(), kReplacement.size(), kReplacement) == 0;
}

}  // namespace

std::string StreamDecoder::push(int32_t id) {
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
  if (cur.size() <= prev.size() || ends_with_replacement(cur) || cur.compare(0, prev.size(), prev) != 0) return {};
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
