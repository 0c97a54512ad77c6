#include "tokenizer/normalizer.h"

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <utf8proc.h>
#include <vector>

#include "core/error.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace shardlm::tok {
namespace {

using json = nlohmann::json;

bool is_ascii(std::string_view s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

class UnicodeNormalizer final : public Normalizer {
 public:
  UnicodeNormalizer(int options, bool ascii_fast_path) : options_(options), ascii_fast_(ascii_fast_path) {}
  std::string normalize(std::string s) const override {
    if (s.empty() || (ascii_fast_ && is_ascii(s))) return s;
    utf8proc_uint8_t* dst = nullptr;
    utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                      static_cast<utf8proc_ssize_t>(s.size()), &dst,
                                      static_cast<utf8proc_option_t>(options_));
    SHARDLM_CHECK(n >= 0, "tokenizer: Unicode normalisation failed: " << utf8proc_errmsg(n));
    std::string out(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
    std::free(dst);
    return out;
  }

 private:
  int options_;
  bool ascii_fast_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  std::string normalize(std::string s) const override {
    std::string out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size()) {
      char32_t cp = next_codepoint(s, i);
      // Hugging Face lowercases by Rust's char::to_lowercase, the full mapping: its one code point
      // that lowercases to two (SpecialCasing, no condition) is U+0130 -> i + U+0307.
      if (cp == 0x130) {
        out += "i\xCC\x87";
        continue;
      }
      append_utf8(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
    }
    return out;
  }
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string p) : prepend_(std::move(p)) {}
  std::string normalize(std::string s) const override { return s.empty() ? s : prepend_ + s; }

 private:
  std::string prepend_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(const std::string& pattern, bool literal, std::string content, const std::string& file)
      : regex_(pattern, literal, file), literal_(literal ? pattern : std::string()), content_(std::move(content)) {}
  std::string normalize(std::string s) const override {
    if (!literal_.empty() && s.find(literal_) == std::string::npos) return s;
    std::vector<std::pair<size_t, size_t>> m;
    regex_.find_all(s, m);
    if (m.empty()) return s;
    std::string out;
    out.reserve(s.size() + m.size() * content_.size());
    size_t prev = 0;
    for (auto [b, e] : m) {
      out.append(s, prev, b - prev);
      out += content_;
      prev = e;
    }
    out.append(s, prev, std::string::npos);
    return out;
  }

 private:
  Regex regex_;
  std::string literal_;
  std::string content_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  std::string normalize(std::string s) const override {
    for (const auto& p : parts_) s = p->normalize(std::move(s));
    return s;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const json& j, const std::string& file) {
  if (j.is_null()) return nullptr;
  SHARDLM_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(),
                file << ": normalizer must be an object with a \"type\"");
  const std::string type = j["type"].get<std::string>();
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_COMPOSE, true);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE, true);
  if (type == "NFKC")
    return std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT, true);
  if (type == "NFKD")
    return std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, true);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "Prepend") {
    SHARDLM_CHECK(j.contains("prepend") && j["prepend"].is_string(), file << ": Prepend normalizer lacks \"prepend\"");
    return std::make_unique<PrependNormalizer>(j["prepend"].get<std::string>());
  }
  if (type == "Replace") {
    const auto& pat = j.value("pattern", json());
    SHARDLM_CHECK(j.contains("content") && j["content"].is_string(), file << ": Replace normalizer lacks \"content\"");
    std::string content = j["content"].get<std::string>();
    if (pat.is_object() && pat.contains("String") && pat["String"].is_string())
      return std::make_unique<ReplaceNormalizer>(pat["String"].get<std::string>(), true, content, file);
    if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string())
      return std::make_unique<ReplaceNormalizer>(pat["Regex"].get<std::string>(), false, content, file);
    SHARDLM_FAIL(file << ": Replace normalizer pattern must be {\"String\": ...} or {\"Regex\": ...}");
  }
  if (type == "Sequence") {
    SHARDLM_CHECK(j.contains("normalizers") && j["normalizers"].is_array(),
                  file << ": Sequence normalizer lacks \"normalizers\"");
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (const auto& sub : j["normalizers"]) {
      auto n = make_normalizer(sub, file);
      if (n) parts.push_back(std::move(n));
    }
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  SHARDLM_FAIL(file << ": unsupported normalizer type \"" << type << "\"");
}

}  // namespace shardlm::tok
