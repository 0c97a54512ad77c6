// libFuzzer target: the tokenizer on arbitrary input.
//
// Tokenizers: SHARDLM_FUZZ_TOKENIZER (a directory holding tokenizer.json, or several separated by
// ':'), else the real ones in the shared data dir (tokenizers/qwen2, models/stories260K) that
// exist. With none, the target prints a message and exits 0 (nothing to fuzz).
//
// Input: byte 0 picks the tokenizer (bits 0-3) and the mode (bits 4-7), the rest is the payload.
//   mode even: payload is text (any bytes; ill-formed UTF-8 allowed). Checks: encode does not
//              throw, every id is < vocab_size, decode(encode(x)) is valid UTF-8, and streaming the
//              ids through StreamDecoder gives exactly decode(ids).
//   mode odd:  payload is a list of little-endian int32 ids (negative, >= vocab, specials, all
//              allowed). Checks: decode / token_bytes / StreamDecoder do not crash or throw, the
//              decoded text is valid UTF-8 and equals the concatenated stream pieces.
// Any failed check aborts with the offending text on stderr.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/utf8.h"
#include "tokenizer/tokenizer.h"

#ifndef SHARDLM_SHARED_DIR
#define SHARDLM_SHARED_DIR "../shared"
#endif

namespace {

std::vector<std::unique_ptr<shardlm::Tokenizer>>* g_toks = nullptr;

std::vector<std::string> tokenizer_dirs() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("SHARDLM_FUZZ_TOKENIZER"); env && *env) {
    std::string s = env;
    size_t start = 0;
    while (start <= s.size()) {
      size_t end = s.find(':', start);
      if (end == std::string::npos) end = s.size();
      if (end > start) dirs.push_back(s.substr(start, end - start));
      start = end + 1;
    }
    return dirs;
  }
  for (const char* rel : {"/tokenizers/qwen2", "/models/stories260K"}) {
    const std::string d = std::string(SHARDLM_SHARED_DIR) + rel;
    if (FILE* f = std::fopen((d + "/tokenizer.json").c_str(), "rb")) {
      std::fclose(f);
      dirs.push_back(d);
    }
  }
  return dirs;
}

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_tokenizer: %s: %s\n", what, detail.c_str());
  std::abort();
}

std::string hex(const std::string& s) {
  std::string out;
  char buf[4];
  for (unsigned char c : s) {
    std::snprintf(buf, sizeof buf, "%02x", c);
    out += buf;
  }
  return out;
}

// Streams ids one at a time; the concatenation must equal decode(ids).
void check_stream(const shardlm::Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special,
                  const std::string& full) {
  shardlm::StreamDecoder sd(tok, skip_special);
  std::string streamed;
  for (int32_t id : ids) streamed += sd.push(id);
  streamed += sd.flush();
  if (streamed != full) fail("StreamDecoder pieces != decode(ids)", "streamed=" + hex(streamed) + " decode=" + hex(full));
  // After flush the decoder starts a new sequence: a second pass must give the same text.
  std::string again;
  for (int32_t id : ids) again += sd.push(id);
  again += sd.flush();
  if (again != full) fail("StreamDecoder reuse after flush differs", "again=" + hex(again) + " decode=" + hex(full));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_toks = new std::vector<std::unique_ptr<shardlm::Tokenizer>>();
  for (const auto& d : tokenizer_dirs()) {
    g_toks->push_back(shardlm::Tokenizer::load(d));  // a load failure here is a setup error: let it throw
    std::fprintf(stderr, "fuzz_tokenizer: loaded %s (vocab %d)\n", d.c_str(), g_toks->back()->vocab_size());
  }
  if (g_toks->empty()) {
    std::fprintf(stderr,
                 "fuzz_tokenizer: no tokenizer found (set SHARDLM_FUZZ_TOKENIZER or provide %s/tokenizers/qwen2 "
                 "or %s/models/stories260K); skipping tokenizer fuzzing\n",
                 SHARDLM_SHARED_DIR, SHARDLM_SHARED_DIR);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const shardlm::Tokenizer& tok = *(*g_toks)[(data[0] & 0x0f) % g_toks->size()];
  const unsigned mode = data[0] >> 4;
  const bool skip_special = (mode & 2) != 0;
  ++data;
  --size;

  if ((mode & 1) == 0) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    const std::vector<int32_t> ids = tok.encode(text);
    for (int32_t id : ids)
      if (id < 0 || id >= tok.vocab_size()) fail("encode produced an out-of-range id", std::to_string(id));
    const std::string back = tok.decode(ids, skip_special);
    if (!shardlm::is_valid_utf8(back)) fail("decode(encode(x)) is not valid UTF-8", hex(back));
    check_stream(tok, ids, skip_special, back);
    return 0;
  }

  std::vector<int32_t> ids(size / 4);
  if (!ids.empty()) std::memcpy(ids.data(), data, ids.size() * 4);
  // Fold some ids into the vocabulary so that real tokens (not only skipped garbage) get decoded;
  // the top bit of the id keeps it raw (possibly negative or >= vocab).
  const int32_t vocab = tok.vocab_size();
  for (int32_t& id : ids) {
    const uint32_t u = static_cast<uint32_t>(id);
    if (!(u & 0x40000000u) && vocab > 0) id = static_cast<int32_t>((u & 0x3fffffffu) % static_cast<uint32_t>(vocab + 8));
  }
  const std::string text = tok.decode(ids, skip_special);
  if (!shardlm::is_valid_utf8(text)) fail("decode(ids) is not valid UTF-8", hex(text));
  for (int32_t id : ids) (void)tok.token_bytes(id);
  (void)tok.is_special(ids.empty() ? 0 : ids[0]);
  check_stream(tok, ids, skip_special, text);
  return 0;
}
