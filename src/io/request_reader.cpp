// RequestReader: streams a prompt file a line at a time (bounded memory whatever the file size).
#include "io/request_reader.h"

#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include "core/error.h"
#include "io/jsonl_request.h"
#include "core/utf8.h"

namespace shardlm {
namespace {

constexpr size_t kReadChunk = 64 * 1024;

bool is_blank(const std::string& s) {
  return s.find_first_not_of(" \t\r\n\f\v") == std::string::npos;
}

std::string lowercase_extension(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext;
}

}  // namespace

PromptFormat prompt_format_from_name(const std::string& name) {
  if (name == "auto") return PromptFormat::kAuto;
  if (name == "jsonl") return PromptFormat::kJsonl;
  if (name == "text") return PromptFormat::kText;
  if (name == "openai") return PromptFormat::kOpenAiBatch;
  SHARDLM_FAIL("unknown prompt format '" << name << "' (expected auto, jsonl, text or openai)");
}

RequestReader::RequestReader(const std::string& path, PromptFormat format) : path_(path), format_(format) {
  std::error_code ec;
  SHARDLM_CHECK(!std::filesystem::is_directory(path, ec), "prompt file '" << path << "' is a directory");
  in_.open(path, std::ios::binary);
  SHARDLM_CHECK(in_.is_open(), "cannot open prompt file '" << path << "': " << std::strerror(errno));
  if (format_ == PromptFormat::kAuto) {
    const std::string ext = lowercase_extension(path);
    format_ = (ext == ".jsonl" || ext == ".json") ? PromptFormat::kJsonl : PromptFormat::kText;
  }
}

// Reads the next line into line_buf_ (without '\n' or a trailing '\r'). Lines longer than
// max_line_bytes_ are not buffered: what is over is skipped and kTooLong returned.
RequestReader::LineStatus RequestReader::read_line() {
  line_buf_.clear();
  char chunk[kReadChunk];
  bool got_any = false;
  for (;;) {
    in_.getline(chunk, sizeof chunk);
    const std::streamsize n = in_.gcount();
    SHARDLM_CHECK(!in_.bad(), "error reading prompt file '" << path_ << "' after line " << line_);
    if (n > 0) got_any = true;
    const bool chunk_full = in_.fail() && !in_.eof() && n == static_cast<std::streamsize>(sizeof chunk - 1);
    const size_t stored = chunk_full || in_.eof() ? static_cast<size_t>(n) : static_cast<size_t>(n) - 1;
    if (line_buf_.size() + stored > max_line_bytes_) {
      line_buf_.clear();
      if (chunk_full) {
        in_.clear();
        in_.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
      }
      ++line_;
      return LineStatus::kTooLong;
    }
    line_buf_.append(chunk, stored);
    if (chunk_full) {
      in_.clear();  // the line goes on: read its next chunk
      continue;
    }
    if (!got_any) return LineStatus::kEof;
    break;
  }
  ++line_;
  if (!line_buf_.empty() && line_buf_.back() == '\r') line_buf_.pop_back();
  if (line_ == 1 && line_buf_.rfind("\xEF\xBB\xBF", 0) == 0) line_buf_.erase(0, 3);
  return LineStatus::kOk;
}

void RequestReader::set_window(int64_t first_line, int64_t end_line) {
  SHARDLM_CHECK(first_line > line_ && end_line >= first_line,
                "prompt file '" << path_ << "': line window [" << first_line << ", " << end_line
                                << ") must start after line " << line_ << ", already read");
  window_first_ = first_line;
  window_end_ = end_line;
}

std::optional<ParsedRequest> RequestReader::next() {
  for (;;) {
    if (line_ + 1 >= window_end_) return std::nullopt;  // the next line is past the window: not read
    const LineStatus st = read_line();
    if (st == LineStatus::kEof) {
      eof_ = true;
      return std::nullopt;
    }
    if (line_ < window_first_) continue;  // before the window (another replica's): not parsed
    if (st == LineStatus::kTooLong) {
      ParsedRequest r;
      r.line = line_;
      // A JSONL line's id is unknown (request_key); a text line's is its number.
      if (format_ == PromptFormat::kText) r.id = std::to_string(line_);
      r.error = "line " + std::to_string(line_) + ": line too long (over " + std::to_string(max_line_bytes_) +
                " bytes); skipped";
      return r;
    }
    if (format_ == PromptFormat::kText) {
      ParsedRequest r;
      r.line = line_;
      r.id = std::to_string(line_);
      if (line_buf_.empty()) {
        r.error = "line " + std::to_string(line_) + ": empty prompt";
      } else if (!is_valid_utf8(line_buf_)) {
        r.error = "line " + std::to_string(line_) + ": prompt is not valid UTF-8";
      } else {
        r.prompt = line_buf_;
      }
      return r;
    }
    if (is_blank(line_buf_)) continue;  // JSONL: blank lines carry no request
    return parse_jsonl_request(line_buf_, line_, format_ == PromptFormat::kOpenAiBatch);
  }
}

}  // namespace shardlm
