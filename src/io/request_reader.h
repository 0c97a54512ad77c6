// Streams a prompt file one line at a time: JSONL, plain text, or OpenAI batch JSONL.
#pragma once

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>

#include "io/request.h"

namespace shardlm {

enum class PromptFormat { kAuto, kJsonl, kText, kOpenAiBatch };
// "auto" | "jsonl" | "text" | "openai"; throws Error on anything else.
PromptFormat prompt_format_from_name(const std::string& name);

class RequestReader {
 public:
  // Opens the file (throws Error naming it when it cannot be read). kAuto picks by extension
  // (.jsonl/.json -> JSONL, else text); a JSONL line carrying "custom_id" and "body" is read as
  // an OpenAI batch line, so mixed files work.
  RequestReader(const std::string& path, PromptFormat format);
  // Next request, or nullopt at end of file. Never throws for bad content: a bad line comes back
  // with `error` set. Blank lines are skipped in JSONL files; in text files they are an error
  // (empty prompt), so ids stay equal to line numbers.
  std::optional<ParsedRequest> next();
  int64_t lines_read() const { return line_; }
  // Restricts next() to lines [first_line, end_line) (1-based): lines before are read past without
  // parsing, and next() returns nullopt, without reading further, once the window is done. Replicas
  // take windows of the file in turn. first_line must be past every line already read.
  void set_window(int64_t first_line, int64_t end_line);
  // True once the end of the file has been reached.
  bool eof() const { return eof_; }
  // The format in use (kAuto resolved by extension).
  PromptFormat format() const { return format_; }

  // Longest line accepted; a longer one is skipped without being buffered and comes back as a
  // "line too long" error. Settable for tests.
  static constexpr size_t kMaxLineBytes = size_t{16} << 20;
  void set_max_line_bytes(size_t n) { max_line_bytes_ = n; }

 private:
  enum class LineStatus { kOk, kTooLong, kEof };
  LineStatus read_line();

  std::ifstream in_;
  std::string path_;
  PromptFormat format_;
  int64_t line_ = 0;
  int64_t window_first_ = 1, window_end_ = INT64_MAX;
  bool eof_ = false;
  size_t max_line_bytes_ = kMaxLineBytes;
  std::string line_buf_;  // the current line, reused so that reading does not allocate per line
};

// Parses one JSONL / OpenAI-batch line (exposed for tests and fuzzing).
ParsedRequest parse_jsonl_line(const std::string& line, int64_t line_no);

}  // namespace shardlm
