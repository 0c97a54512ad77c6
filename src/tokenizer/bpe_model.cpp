#include "tokenizer/bpe_model.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <queue>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace shardlm::tok {
namespace {

using json = nlohmann::json;

std::string opt_string(const json& m, const char* key) {
  return m.contains(key) && m[key].is_string() ? m[key].get<std::string>() : std::string();
}
bool opt_bool(const json& m, const char* key) {
  return m.contains(key) && m[key].is_boolean() && m[key].get<bool>();
}

}  // namespace

std::unique_ptr<BpeModel> BpeModel::build(const json& m, VocabList* vocab, MergeList* merges,
                                          const std::string& file) {
  SHARDLM_CHECK(m.is_object(), file << ": \"model\" must be an object");
  const std::string type = m.contains("type") && m["type"].is_string() ? m["type"].get<std::string>() : "BPE";
  SHARDLM_CHECK(type == "BPE", file << ": unsupported model type \"" << type << "\" (only BPE is implemented)");
  SHARDLM_CHECK(vocab != nullptr, file << ": BPE model lacks a \"vocab\" object");
  SHARDLM_CHECK(merges != nullptr || !m.contains("merges") || m["merges"].is_null(),
                file << ": \"merges\" must be an array");

  auto bpe = std::unique_ptr<BpeModel>(new BpeModel());
  bpe->vocab_.reserve(vocab->size());
  int64_t max_id = -1;
  for (auto& [tok, id64] : *vocab) {
    SHARDLM_CHECK(id64 >= 0 && id64 < (int64_t{1} << 30), file << ": vocab entry \"" << tok << "\" has an invalid id");
    if (id64 > max_id) max_id = id64;
    bpe->vocab_.emplace(std::move(tok), static_cast<int32_t>(id64));
  }
  vocab->clear();
  bpe->id_to_token_.resize(static_cast<size_t>(max_id + 1));
  for (const auto& [tok, id] : bpe->vocab_) bpe->id_to_token_[id] = tok;

  bpe->fuse_unk_ = opt_bool(m, "fuse_unk");
  bpe->byte_fallback_ = opt_bool(m, "byte_fallback");
  bpe->ignore_merges_ = opt_bool(m, "ignore_merges");
  bpe->prefix_ = opt_string(m, "continuing_subword_prefix");
  bpe->suffix_ = opt_string(m, "end_of_word_suffix");
  const std::string unk = opt_string(m, "unk_token");
  if (!unk.empty()) {
    auto u = bpe->token_to_id(unk);
    SHARDLM_CHECK(u.has_value(), file << ": unk_token \"" << unk << "\" is not in the vocab");
    bpe->unk_id_ = *u;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto id = bpe->token_to_id(name);
    bpe->byte_ids_[b] = id ? *id : -1;
  }

  if (merges) {
    bpe->merges_.reserve(merges->size() * 2);
    const std::string& prefix = bpe->prefix_;
    std::string merged;
    int32_t rank = 0;
    for (const auto& [a, b] : *merges) {
      auto ia = bpe->token_to_id(a), ib = bpe->token_to_id(b);
      SHARDLM_CHECK(ia && ib, file << ": merge #" << rank << " (\"" << a << "\", \"" << b
                                   << "\") uses a token that is not in the vocab");
      merged = a;
      const bool strip = !prefix.empty() && b.compare(0, prefix.size(), prefix) == 0;
      merged.append(b, strip ? prefix.size() : 0, std::string::npos);
      auto im = bpe->token_to_id(merged);
      SHARDLM_CHECK(im.has_value(), file << ": merge #" << rank << " result \"" << merged << "\" is not in the vocab");
      // The last occurrence of a duplicated pair wins, with its rank: Hugging Face collects the list
      // into a map, where a later entry replaces an earlier one.
      bpe->merges_.insert_or_assign(pair_key(*ia, *ib), Merge{rank, *im});
      ++rank;
    }
    merges->clear();
  }
  return bpe;
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lk(cache_mu_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t start = out.size();
  merge_word(word, out);
  if (cacheable) {
    std::vector<int32_t> ids(out.begin() + static_cast<std::ptrdiff_t>(start), out.end());
    std::lock_guard<std::mutex> lk(cache_mu_);
    if (cache_.size() >= kCacheCapacity) cache_.clear();
    cache_.emplace(std::string(word), std::move(ids));
  }
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  struct Sym {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  std::vector<Sym> syms;
  syms.reserve(word.size());
  bool last_unk = false;
  std::string buf;
  auto add = [&](int32_t id) {
    int32_t n = static_cast<int32_t>(syms.size());
    syms.push_back({id, n - 1, -1, true});
    if (n > 0) syms[n - 1].next = n;
  };

  size_t i = 0;
  while (i < word.size()) {
    size_t len = utf8_len(static_cast<unsigned char>(word[i]));
    if (i + len > word.size()) len = word.size() - i;
    std::string_view ch = word.substr(i, len);
    const bool first = i == 0, last = i + len == word.size();
    std::optional<int32_t> id;
    if ((first || prefix_.empty()) && (!last || suffix_.empty())) {
      id = token_to_id(ch);
    } else {
      buf.clear();
      if (!first) buf += prefix_;
      buf += ch;
      if (last) buf += suffix_;
      id = token_to_id(buf);
    }
    i += len;
    if (id) {
      add(*id);
      last_unk = false;
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char c : ch) all = all && byte_ids_[c] >= 0;
      if (all) {
        for (unsigned char c : ch) add(byte_ids_[c]);
        last_unk = false;
        continue;
      }
    }
    if (unk_id_) {
      if (!(fuse_unk_ && last_unk)) add(*unk_id_);
      last_unk = true;
    }
    // Without an unk token the character is dropped, as Hugging Face does.
  }

  struct Cand {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator<(const Cand& o) const {  // max-heap on (-rank, -pos)
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Cand> heap;
  auto consider = [&](int32_t pos) {
    int32_t nx = syms[pos].next;
    if (nx < 0) return;
    auto it = merges_.find(pair_key(syms[pos].id, syms[nx].id));
    if (it != merges_.end()) heap.push({it->second.rank, pos, it->second.new_id});
  };
  for (int32_t p = 0; p + 1 < static_cast<int32_t>(syms.size()); ++p) consider(p);
  while (!heap.empty()) {
    Cand top = heap.top();
    heap.pop();
    Sym& s = syms[top.pos];
    if (!s.alive || s.next < 0) continue;
    int32_t nx = s.next;
    auto it = merges_.find(pair_key(s.id, syms[nx].id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;
    s.id = top.new_id;
    s.next = syms[nx].next;
    syms[nx].alive = false;
    if (s.next >= 0) syms[s.next].prev = top.pos;
    if (s.prev >= 0) consider(s.prev);
    consider(top.pos);
  }
  for (const auto& s : syms)
    if (s.alive) out.push_back(s.id);
}

}  // namespace shardlm::tok
