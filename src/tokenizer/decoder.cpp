#include "tokenizer/decoder.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"

namespace shardlm::tok {
namespace {

using json = nlohmann::json;

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string replace_all(std::string_view s, const std::string& from, const std::string& to) {
  std::string out;
  if (from.empty()) return std::string(s);
  size_t prev = 0, pos;
  while ((pos = s.find(from, prev)) != std::string_view::npos) {
    out.append(s, prev, pos - prev);
    out += to;
    prev = pos + from.size();
  }
  out.append(s, prev, std::string_view::npos);
  return out;
}

void strip_chars(std::string& s, const std::string& c, size_t start, size_t stop) {
  if (c.empty()) return;
  size_t b = 0;
  for (size_t k = 0; k < start && s.compare(b, c.size(), c) == 0; ++k) b += c.size();
  size_t e = s.size();
  for (size_t k = 0; k < stop && e >= b + c.size() && s.compare(e - c.size(), c.size(), c) == 0; ++k)
    e -= c.size();
  s = s.substr(b, e - b);
}

}  // namespace

Decoder::Decoder(const json& j, const std::string& file) {
  if (j.is_null()) {
    sep_.push_back(' ');  // (not sep_ = " ": GCC 12 -Wrestrict false positive)
    return;
  }
  bool fused = false;
  compile(j, file, fused);
}

void Decoder::compile(const json& j, const std::string& file, bool& fused) {
  SHARDLM_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(),
                file << ": decoder must be an object with a \"type\"");
  const std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    SHARDLM_CHECK(j.contains("decoders") && j["decoders"].is_array(), file << ": Sequence decoder lacks \"decoders\"");
    for (const auto& sub : j["decoders"])
      if (!sub.is_null()) compile(sub, file, fused);
  } else if (type == "ByteLevel") {
    steps_.push_back({Step::ByteLevel, {}, {}});
  } else if (type == "ByteFallback") {
    steps_.push_back({Step::ByteFallback, {}, {}});
  } else if (type == "Fuse") {
    fused = true;
  } else if (type == "Replace") {
    const auto& pat = j.value("pattern", json());
    SHARDLM_CHECK(pat.is_object() && pat.contains("String") && pat["String"].is_string() && j.contains("content") &&
                      j["content"].is_string(),
                  file << ": only Replace decoders with a {\"String\": ...} pattern are supported");
    steps_.push_back({Step::Replace, pat["String"].get<std::string>(), j["content"].get<std::string>()});
  } else if (type == "Strip") {
    std::string content = j.value("content", std::string(" "));
    size_t start = j.value("start", size_t{0}), stop = j.value("stop", size_t{0});
    if (fused) {
      SHARDLM_CHECK(strip_start_ == 0 && strip_stop_ == 0, file << ": more than one Strip decoder after Fuse");
      strip_content_ = content;
      strip_start_ = start;
      strip_stop_ = stop;
    } else {
      Step s{Step::StripEach, content, {}};
      s.start = start;
      s.stop = stop;
      steps_.push_back(s);
    }
  } else if (type == "Metaspace") {
    std::string repl = j.value("replacement", std::string("\xE2\x96\x81"));
    bool prepend = true;
    if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string())
      prepend = j["prepend_scheme"].get<std::string>() != "never";
    else if (j.contains("add_prefix_space") && j["add_prefix_space"].is_boolean())
      prepend = j["add_prefix_space"].get<bool>();
    Step s{Step::Replace, repl, " "};
    s.drop_in_first = prepend;
    first_differs_ = first_differs_ || prepend;
    steps_.push_back(s);
  } else {
    SHARDLM_FAIL(file << ": unsupported decoder type \"" << type << "\"");
  }
}

std::string Decoder::piece(std::string_view token, bool first) const {
  std::string s(token);
  for (const auto& st : steps_) {
    switch (st.kind) {
      case Step::ByteLevel:
        s = byte_level_to_bytes(s);
        break;
      case Step::Replace:
        if (s.find(st.from) != std::string::npos) s = replace_all(s, st.from, first && st.drop_in_first ? "" : st.to);
        break;
      case Step::ByteFallback:
        if (s.size() == 6 && s.compare(0, 3, "<0x") == 0 && s[5] == '>' && hex_digit(s[3]) >= 0 &&
            hex_digit(s[4]) >= 0)
          s = std::string(1, static_cast<char>(hex_digit(s[3]) * 16 + hex_digit(s[4])));
        break;
      case Step::StripEach:
        strip_chars(s, st.from, st.start, st.stop);
        break;
    }
  }
  return s;
}

std::string Decoder::finish(std::string bytes) const {
  std::string s = repair_utf8(bytes);
  if (strip_start_ || strip_stop_) strip_chars(s, strip_content_, strip_start_, strip_stop_);
  return s;
}

}  // namespace shardlm::tok
