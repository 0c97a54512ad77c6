// Tokenizer: Hugging Face tokenizer.json (byte-level BPE with Split-regex pre-tokeniser, or
// SentencePiece-style BPE with byte fallback), or a tiktoken BPE file (tiktoken.model, as Kimi K2
// ships it), plus tokenizer_config.json for BOS handling (and the tiktoken specials).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace shardlm {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Loads DIR/tokenizer.json (or DIR/tiktoken.model when there is no tokenizer.json; DIR may also
  // name a tokenizer.json file) and DIR/tokenizer_config.json (optional) and
  // DIR/generation_config.json / config.json (optional, for BOS/EOS ids). Throws Error naming the
  // file on anything unsupported or malformed.
  static std::unique_ptr<Tokenizer> load(const std::string& dir);

  // Encodes text. Added/special tokens are matched before pre-tokenisation. No BOS is added here.
  // Invalid UTF-8 never fails: each maximal ill-formed byte subsequence is replaced by U+FFFD
  // before any processing (so decode(encode(x)) returns the repaired text).
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  // Decodes ids to text (special tokens included in the output only if skip_special is false).
  // Ids without a token are skipped; bytes that do not form valid UTF-8 become U+FFFD.
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special = true) const = 0;
  // Bytes of one token as decoding would produce them when it is not the first token
  // (SentencePiece leading-space stripping applies only to the first token of a sequence).
  virtual std::string token_bytes(int32_t id) const = 0;

  virtual int32_t vocab_size() const = 0;
  // BOS id if the tokenizer config asks for one to be prepended (add_bos_token), else nullopt.
  virtual std::optional<int32_t> bos_to_prepend() const = 0;
  // EOS ids known to the tokenizer config (may be empty; the model's generation config adds more).
  virtual std::vector<int32_t> eos_ids() const = 0;
  virtual bool is_special(int32_t id) const = 0;
};

// Incremental detokeniser: feed ids one at a time, get back only complete UTF-8 text. Bytes of a
// character split across tokens are held until the character completes, so concatenating every
// piece returned equals decode(all ids).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special = true) : tok_(tok), skip_special_(skip_special) {}
  // Decodes CONTEXT (a prompt's tail, detokenization_context's) without returning its text, so that
  // what follows decodes as a continuation: SentencePiece keeps the space before the first word.
  void prime(const std::vector<int32_t>& context);
  std::string push(int32_t id);
  // Whatever is held back (an incomplete character at the end, emitted as U+FFFD replacement).
  // Ends the stream: a later push starts a new sequence (first-token space stripping applies).
  std::string flush();

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  // Window decoding: ids_[prefix_off_, read_off_) is text already returned (kept so that the
  // window decodes in context); ids from read_off_ on are pending. Both advance when the window
  // ends in a complete character, and ids_ is trimmed from the front, so each push costs
  // O(window), not O(sequence).
  std::vector<int32_t> ids_;
  size_t prefix_off_ = 0;
  size_t read_off_ = 0;
};

// The prompt's tail an output is decoded after, as vLLM's incremental detokenizer chooses it: the
// whole prompt up to 4 tokens, else the shortest suffix of 4 to 23 tokens that decodes without
// U+FFFD (one that starts mid-character would), else its last 23 (vLLM: the whole prompt).
std::vector<int32_t> detokenization_context(const Tokenizer& tok, const std::vector<int32_t>& prompt);

}  // namespace shardlm
