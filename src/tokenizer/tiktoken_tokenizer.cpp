#include "tokenizer/tiktoken_tokenizer.h"

#include <pcre2.h>

#include <charconv>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_util.h"
#include "tokenizer/tokenizer_config.h"
#include "tokenizer/utf8.h"

namespace shardlm::tok {

// Rust's regex (which tiktoken uses) reads \p{Han} as the Script property; PCRE2 >= 10.40 reads it
// as Script_Extensions (which adds CJK punctuation such as U+3001), so ask for the Script there.
#if PCRE2_MAJOR > 10 || (PCRE2_MAJOR == 10 && PCRE2_MINOR >= 40)
#define SHARDLM_HAN R"(\p{sc:Han})"
#else
#define SHARDLM_HAN R"(\p{Han})"
#endif
#define SHARDLM_UPPER_NOT_HAN R"((?:(?!)" SHARDLM_HAN R"()[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]))"
#define SHARDLM_LOWER_NOT_HAN R"((?:(?!)" SHARDLM_HAN R"()[\p{Ll}\p{Lm}\p{Lo}\p{M}]))"
#define SHARDLM_CONTRACTION R"((?i:'s|'t|'re|'ve|'m|'ll|'d)?)"

const char* const kKimiPattern =
    "[" SHARDLM_HAN "]+"
    R"(|[^\r\n\p{L}\p{N}]?)" SHARDLM_UPPER_NOT_HAN "*" SHARDLM_LOWER_NOT_HAN "+" SHARDLM_CONTRACTION
    R"(|[^\r\n\p{L}\p{N}]?)" SHARDLM_UPPER_NOT_HAN "+" SHARDLM_LOWER_NOT_HAN "*" SHARDLM_CONTRACTION
    R"(|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*)"
    R"(|\s*[\r\n]+)"
    R"(|\s+(?!\S))"
    R"(|\s+)";

#undef SHARDLM_HAN
#undef SHARDLM_UPPER_NOT_HAN
#undef SHARDLM_LOWER_NOT_HAN
#undef SHARDLM_CONTRACTION

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// Named specials may sit above the reserved block, but not absurdly far (the table is dense).
constexpr int64_t kMaxSpecialSpan = int64_t{1} << 20;

// "added_tokens_decoder": {"163584": {"content": "[BOS]", "special": true, ...}, ...}.
std::vector<AddedToken> parse_added_tokens_decoder(const json& cfg, const std::string& file) {
  std::vector<AddedToken> out;
  SHARDLM_CHECK(cfg.is_object(), file << ": top level must be a JSON object");
  if (!cfg.contains("added_tokens_decoder") || cfg["added_tokens_decoder"].is_null()) return out;
  const json& dec = cfg["added_tokens_decoder"];
  SHARDLM_CHECK(dec.is_object(), file << ": \"added_tokens_decoder\" must be an object");
  for (const auto& [key, entry] : dec.items()) {
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    SHARDLM_CHECK(ec == std::errc() && end == key.data() + key.size(),
                  file << ": \"added_tokens_decoder\" key \"" << key << "\" is not a token id");
    out.push_back(parse_added_token(entry, id, file, "\"added_tokens_decoder\" (id " + key + ")"));
  }
  return out;
}

// Python's str.isspace: White_Space plus the separators U+001C..U+001F.
bool python_isspace(char32_t cp) { return is_unicode_space(cp) || (cp >= 0x1C && cp <= 0x1F); }

// Calls emit on the consecutive pieces Kimi's TikTokenTokenizer.encode feeds tiktoken: chunks of
// kTiktokenMaxChunkChars characters, each cut (by _split_whitespaces_or_nonwhitespaces) before a
// character that would make a run of whitespace or non-whitespace longer than kTiktokenMaxRunChars.
template <class Emit>
void for_each_kimi_chunk(std::string_view s, Emit&& emit) {
  size_t slice_start = 0, chars = 0, run = 0;
  bool run_space = false;
  for (size_t i = 0; i < s.size();) {
    if (chars == kTiktokenMaxChunkChars) {
      emit(s.substr(slice_start, i - slice_start));
      slice_start = i;
      chars = 0;
    }
    const size_t at = i;
    const bool space = python_isspace(next_codepoint(s, i));
    if (chars++ == 0) {
      run_space = space;
      run = 0;
    }
    if (space != run_space) {
      run_space = space;
      run = 1;
    } else if (++run > kTiktokenMaxRunChars) {
      emit(s.substr(slice_start, at - slice_start));
      slice_start = at;
      run = 1;
    }
  }
  emit(s.substr(slice_start));
}

}  // namespace

TiktokenTokenizer::TiktokenTokenizer(TiktokenRanks ranks, const std::vector<AddedToken>& named,
                                     const std::string& pattern, const std::string& file)
    : ranks_(std::move(ranks)), split_(pattern, false, file) {
  const int32_t base = ranks_.size();
  int64_t end = int64_t{base} + kTiktokenReservedSpecials;
  for (const auto& a : named) {
    SHARDLM_CHECK(a.id >= base, file << ": special token \"" << a.content << "\" has id " << a.id
                                     << ", which is a tiktoken.model rank (specials start at " << base << ")");
    SHARDLM_CHECK(a.id - int64_t{base} < kMaxSpecialSpan,
                  file << ": special token \"" << a.content << "\" has implausibly large id " << a.id);
    end = std::max(end, int64_t{a.id} + 1);
  }
  specials_.resize(static_cast<size_t>(end - base));
  std::vector<uint8_t> is_named(specials_.size(), 0);
  for (const auto& a : named) {
    is_named[a.id - base] = 1;
    specials_[a.id - base] = a;
  }
  for (size_t k = 0; k < specials_.size(); ++k) {
    AddedToken& s = specials_[k];
    if (!is_named[k]) {
      s = AddedToken{};
      s.id = base + static_cast<int32_t>(k);
      s.content = "<|reserved_token_" + std::to_string(s.id) + "|>";
      s.special = true;
    }
    const auto [it, fresh] = special_ids_.emplace(s.content, s.id);
    SHARDLM_CHECK(fresh, file << ": special tokens " << it->second << " and " << s.id << " are both \"" << s.content
                              << "\"");
    matcher_.add(s, s.content);
  }
}

std::optional<int32_t> TiktokenTokenizer::token_to_id(const std::string& token) const {
  if (auto it = special_ids_.find(token); it != special_ids_.end()) return it->second;
  const int32_t r = ranks_.rank(token);
  return r >= 0 ? std::optional<int32_t>(r) : std::nullopt;
}

void TiktokenTokenizer::encode_chunk(std::string_view chunk, std::vector<std::pair<size_t, size_t>>& pieces,
                                     std::vector<int32_t>& out) const {
  pieces.clear();
  split_.find_all(chunk, pieces);
  for (auto [b, e] : pieces) ranks_.encode_piece(chunk.substr(b, e - b), out);
}

std::vector<int32_t> TiktokenTokenizer::encode(const std::string& text_in) const {
  const std::string text = repair_utf8(text_in);
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  std::vector<Segment> segs;
  matcher_.split(text, segs);
  std::vector<std::pair<size_t, size_t>> pieces;
  for (const auto& s : segs) {
    if (s.id >= 0) out.push_back(s.id);
    else for_each_kimi_chunk(s.text, [&](std::string_view chunk) { encode_chunk(chunk, pieces, out); });
  }
  return out;
}

std::string TiktokenTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string bytes;
  const int32_t base = ranks_.size();
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size() || (skip_special && is_special(id))) continue;
    if (id < base) bytes += ranks_.token(id);
    else bytes += specials_[id - base].content;
  }
  return repair_utf8(bytes);
}

std::string TiktokenTokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  if (id < ranks_.size()) return std::string(ranks_.token(id));
  return specials_[id - ranks_.size()].content;
}

std::unique_ptr<Tokenizer> load_tiktoken(const fs::path& dir) {
  const std::string model = (dir / "tiktoken.model").string();
  TiktokenRanks ranks = TiktokenRanks::parse(read_file(model), model);
  const TokenizerConfigFiles files = read_tokenizer_config_files(dir);
  std::vector<AddedToken> named;
  if (files.tokenizer_config) named = parse_added_tokens_decoder(*files.tokenizer_config, files.tokenizer_config_name);
  auto tk = std::make_unique<TiktokenTokenizer>(std::move(ranks), named, kKimiPattern, files.tokenizer_config_name);
  auto ids = resolve_special_ids(files, [&](const std::string& t) { return tk->token_to_id(t); }, std::nullopt);
  tk->set_special_ids(ids.bos, std::move(ids.eos));
  return tk;
}

}  // namespace shardlm::tok
