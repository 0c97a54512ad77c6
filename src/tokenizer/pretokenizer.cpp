#include "tokenizer/pretokenizer.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/regex.h"

namespace shardlm::tok {

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

using json = nlohmann::json;

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

struct Span {
  size_t b, e;
  bool match;
};

// Hugging Face SplitDelimiterBehavior applied to the alternating match / non-match spans.
std::vector<Span> apply_behavior(const std::vector<Span>& spans, Behavior beh) {
  std::vector<Span> out;
  bool prev_match = false;
  switch (beh) {
    case Behavior::Isolated:
      return spans;
    case Behavior::Removed:
      for (const auto& s : spans)
        if (!s.match) out.push_back(s);
      return out;
    case Behavior::MergedWithPrevious:
      for (const auto& s : spans) {
        if (s.match && !prev_match && !out.empty()) out.back().e = s.e;
        else out.push_back(s);
        prev_match = s.match;
      }
      return out;
    case Behavior::MergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->match && !prev_match && !out.empty()) out.back().b = it->b;
        else out.push_back(*it);
        prev_match = it->match;
      }
      return {out.rbegin(), out.rend()};
    case Behavior::Contiguous:
      for (const auto& s : spans) {
        if (s.match == prev_match && !out.empty()) out.back().e = s.e;
        else out.push_back(s);
        prev_match = s.match;
      }
      return out;
  }
  return out;
}

void regex_split(const Regex& re, Behavior beh, bool invert, std::vector<std::string>& pieces) {
  std::vector<std::string> result;
  std::vector<std::pair<size_t, size_t>> m;
  std::vector<Span> spans;
  for (const auto& p : pieces) {
    m.clear();
    spans.clear();
    re.find_all(p, m);
    size_t prev = 0;
    for (auto [b, e] : m) {
      if (b > prev) spans.push_back({prev, b, invert});
      spans.push_back({b, e, !invert});
      prev = e;
    }
    if (prev < p.size()) spans.push_back({prev, p.size(), invert});
    for (const auto& s : apply_behavior(spans, beh))
      if (s.e > s.b) result.emplace_back(p, s.b, s.e - s.b);
  }
  pieces.swap(result);
}

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(const std::string& pattern, bool literal, Behavior beh, bool invert, const std::string& file)
      : re_(pattern, literal, file), beh_(beh), invert_(invert) {}
  void split(std::vector<std::string>& pieces, bool) const override { regex_split(re_, beh_, invert_, pieces); }

 private:
  Regex re_;
  Behavior beh_;
  bool invert_;
};

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex, const std::string& file)
      : add_prefix_space_(add_prefix_space), re_(use_regex ? std::make_unique<Regex>(kGpt2Pattern, false, file) : nullptr) {}
  void split(std::vector<std::string>& pieces, bool) const override {
    if (add_prefix_space_)
      for (auto& p : pieces)
        if (!p.empty() && p[0] != ' ') p.insert(p.begin(), ' ');
    if (re_) regex_split(*re_, Behavior::Isolated, false, pieces);
    for (auto& p : pieces) p = bytes_to_byte_level(p);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> re_;
};

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  enum class Prepend { Always, First, Never };
  MetaspacePreTokenizer(std::string repl, Prepend scheme, bool split)
      : repl_(std::move(repl)), scheme_(scheme), split_(split) {}
  void split(std::vector<std::string>& pieces, bool at_text_start) const override {
    std::vector<std::string> result;
    bool first = true;
    for (auto& p : pieces) {
      std::string s;
      s.reserve(p.size() + repl_.size());
      for (char c : p) {
        if (c == ' ') s += repl_;
        else s.push_back(c);
      }
      bool prepend = scheme_ == Prepend::Always || (scheme_ == Prepend::First && at_text_start && first);
      if (prepend && !s.empty() && s.compare(0, repl_.size(), repl_) != 0) s.insert(0, repl_);
      first = false;
      if (!split_) {
        if (!s.empty()) result.push_back(std::move(s));
        continue;
      }
      // Split before each replacement character (MergedWithNext).
      size_t start = 0, pos = s.find(repl_, 1);
      while (pos != std::string::npos) {
        result.emplace_back(s, start, pos - start);
        start = pos;
        pos = s.find(repl_, pos + repl_.size());
      }
      if (start < s.size()) result.emplace_back(s, start, std::string::npos);
    }
    pieces.swap(result);
  }

 private:
  std::string repl_;
  Prepend scheme_;
  bool split_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void split(std::vector<std::string>& pieces, bool at_text_start) const override {
    for (const auto& p : parts_) p->split(pieces, at_text_start);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

bool get_bool(const json& j, const char* key, bool dflt) {
  return j.contains(key) && j[key].is_boolean() ? j[key].get<bool>() : dflt;
}

}  // namespace

std::unique_ptr<PreTokenizer> make_pretokenizer(const json& j, const std::string& file) {
  if (j.is_null()) return nullptr;
  SHARDLM_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(),
                file << ": pre_tokenizer must be an object with a \"type\"");
  const std::string type = j["type"].get<std::string>();
  if (type == "ByteLevel")
    return std::make_unique<ByteLevelPreTokenizer>(get_bool(j, "add_prefix_space", true), get_bool(j, "use_regex", true),
                                                   file);
  if (type == "Split") {
    const auto& pat = j.value("pattern", json());
    std::string pattern;
    bool literal;
    if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) {
      pattern = pat["Regex"].get<std::string>();
      literal = false;
    } else if (pat.is_object() && pat.contains("String") && pat["String"].is_string()) {
      pattern = pat["String"].get<std::string>();
      literal = true;
    } else {
      SHARDLM_FAIL(file << ": Split pre_tokenizer pattern must be {\"Regex\": ...} or {\"String\": ...}");
    }
    const std::string b = j.value("behavior", std::string("Isolated"));
    Behavior beh;
    if (b == "Isolated") beh = Behavior::Isolated;
    else if (b == "Removed") beh = Behavior::Removed;
    else if (b == "MergedWithPrevious") beh = Behavior::MergedWithPrevious;
    else if (b == "MergedWithNext") beh = Behavior::MergedWithNext;
    else if (b == "Contiguous") beh = Behavior::Contiguous;
    else SHARDLM_FAIL(file << ": unsupported Split behavior \"" << b << "\"");
    return std::make_unique<SplitPreTokenizer>(pattern, literal, beh, get_bool(j, "invert", false), file);
  }
  if (type == "Metaspace") {
    std::string repl = j.value("replacement", std::string("\xE2\x96\x81"));
    auto scheme = MetaspacePreTokenizer::Prepend::Always;
    if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) {
      const std::string s = j["prepend_scheme"].get<std::string>();
      if (s == "first") scheme = MetaspacePreTokenizer::Prepend::First;
      else if (s == "never") scheme = MetaspacePreTokenizer::Prepend::Never;
      else if (s != "always") SHARDLM_FAIL(file << ": unsupported Metaspace prepend_scheme \"" << s << "\"");
    } else if (!get_bool(j, "add_prefix_space", true)) {
      scheme = MetaspacePreTokenizer::Prepend::Never;
    }
    SHARDLM_CHECK(!repl.empty(), file << ": Metaspace replacement is empty");
    return std::make_unique<MetaspacePreTokenizer>(repl, scheme, get_bool(j, "split", true));
  }
  if (type == "Sequence") {
    SHARDLM_CHECK(j.contains("pretokenizers") && j["pretokenizers"].is_array(),
                  file << ": Sequence pre_tokenizer lacks \"pretokenizers\"");
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (const auto& sub : j["pretokenizers"]) {
      auto p = make_pretokenizer(sub, file);
      if (p) parts.push_back(std::move(p));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(parts));
  }
  SHARDLM_FAIL(file << ": unsupported pre_tokenizer type \"" << type << "\"");
}

}  // namespace shardlm::tok
