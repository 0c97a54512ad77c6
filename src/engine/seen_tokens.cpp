#include "engine/seen_tokens.h"

#include "core/error.h"

namespace shardlm {

void SeenTokens::update(const std::vector<int32_t>& tokens, int64_t prompt_len) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  SHARDLM_CHECK(n >= read_ && prompt_len <= n,
                "seen tokens: a sequence of " << n << " tokens after " << read_ << " (prompt " << prompt_len << ")");
  for (; read_ < n; ++read_) {
    const int32_t t = tokens[static_cast<size_t>(read_)];
    auto [it, added] = index_.try_emplace(t, list_.size());
    if (added) list_.push_back(TokenEdit{t, 0});
    if (read_ >= prompt_len) ++list_[it->second].output_count;
  }
}

}  // namespace shardlm
