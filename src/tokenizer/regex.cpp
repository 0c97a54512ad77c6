#include "tokenizer/regex.h"

#include <pcre2.h>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace shardlm::tok {
namespace {

// Per-thread JIT stack and match context (the default 32 KiB JIT stack is too small for long
// whitespace runs with look-ahead).
struct ThreadMatchState {
  pcre2_jit_stack* stack = nullptr;
  pcre2_match_context* ctx = nullptr;
  pcre2_match_data* data = nullptr;
  ThreadMatchState() {
    ctx = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(64 * 1024, 16 * 1024 * 1024, nullptr);
    if (ctx && stack) pcre2_jit_stack_assign(ctx, nullptr, stack);
    data = pcre2_match_data_create(1, nullptr);
  }
  ~ThreadMatchState() {
    if (data) pcre2_match_data_free(data);
    if (ctx) pcre2_match_context_free(ctx);
    if (stack) pcre2_jit_stack_free(stack);
  }
};

ThreadMatchState& thread_state() {
  thread_local ThreadMatchState st;
  return st;
}

// \s and \S as Unicode's White_Space, which the peers' engines use (Rust regex for HF tokenizers
// and tiktoken, Oniguruma): PCRE2's \s with UCP also matches U+180E (Mongolian vowel separator),
// which Unicode 6.3 took out of White_Space, and "\u180e's" then split differently. \P{White_Space}
// (inside a class, where a negated list cannot go) is PCRE2 10.40's; escapes other than \s and \S
// are copied as they are, \Q..\E quoted text and POSIX classes too.
std::string white_space_as_unicode(const std::string& pattern) {
#if PCRE2_MAJOR > 10 || (PCRE2_MAJOR == 10 && PCRE2_MINOR >= 40)
  // White_Space's code points, listed: a class of ranges matches faster than the property.
  const std::string ws = R"(\t-\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '\\' || i + 1 == pattern.size()) {
      // A ']' right after '[' or '[^' is a literal, not the class's end.
      if (!in_class && pattern[i] == '[') {
        in_class = true;
        out += '[';
        if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
        if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
        continue;
      }
      if (in_class && pattern.compare(i, 2, "[:") == 0) {  // a POSIX class, [:alpha:]
        const size_t end = pattern.find(":]", i + 2);
        if (end != std::string::npos) {
          out.append(pattern, i, end + 2 - i);
          i = end + 1;
          continue;
        }
      }
      if (in_class && pattern[i] == ']') in_class = false;
      out += pattern[i];
      continue;
    }
    const char next = pattern[i + 1];
    if (next == 's') {
      out += in_class ? ws : "[" + ws + "]";
    } else if (next == 'S') {
      out += in_class ? std::string("\\P{White_Space}") : "[^" + ws + "]";
    } else if (next == 'Q') {
      const size_t end = pattern.find("\\E", i + 2);
      const size_t stop = end == std::string::npos ? pattern.size() : end + 2;
      out.append(pattern, i, stop - i);
      i = stop - 1;
      continue;
    } else {
      out += '\\';
      out += next;
    }
    ++i;
  }
  return out;
#else
  return pattern;
#endif
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

Regex::Regex(const std::string& pattern, bool literal, const std::string& file) : pattern_(pattern) {
  int err = 0;
  PCRE2_SIZE off = 0;
  uint32_t opts = PCRE2_UTF | PCRE2_NO_UTF_CHECK;
  opts |= literal ? PCRE2_LITERAL : PCRE2_UCP;  // PCRE2 rejects UCP together with LITERAL
  SHARDLM_CHECK(is_valid_utf8(pattern), file << ": regex pattern is not valid UTF-8");
  const std::string compiled = literal ? pattern : white_space_as_unicode(pattern);
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled.data()), compiled.size(), opts, &err, &off, nullptr);
  SHARDLM_CHECK(code_ != nullptr, file << ": unsupported regex pattern '" << pattern << "' (PCRE2: "
                                      << pcre2_message(err) << " at offset " << off << ")");
  // JIT is an optimisation; the interpreter is used when it is unavailable.
  pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);
}

Regex::~Regex() {
  if (code_) pcre2_code_free(code_);
}

void Regex::find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
  auto& st = thread_state();
  SHARDLM_CHECK(st.data && st.ctx, "tokenizer: cannot allocate PCRE2 match state");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t pos = 0;
  while (pos < s.size()) {
    int rc = pcre2_match(code_, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, st.data, st.ctx);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    SHARDLM_CHECK(rc >= 0, "tokenizer: regex '" << pattern_ << "' failed: " << pcre2_message(rc));
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    size_t b = ov[0], e = ov[1];
    if (e > b) {
      out.emplace_back(b, e);
      pos = e;
    } else {
      // Empty match: step over one character.
      pos = b + utf8_len(static_cast<unsigned char>(s[b < s.size() ? b : s.size() - 1]));
    }
  }
}

}  // namespace shardlm::tok
