// Every kind of bad prompt line becomes a per-request error naming the line and the field, and the
// good line after it still parses.
#include <gtest/gtest.h>

#include "io/request_reader.h"
#include "io_test_util.h"

namespace shardlm {
namespace {

using test::read_all;
using test::ScratchDir;
using test::write_file;

struct BadCase {
  std::string line;
  std::string error;  // expected text after "line N: " (a prefix of the message)
};

const std::vector<BadCase>& bad_cases() {
  static const std::vector<BadCase> cases = {
      {"not json at all", "not valid JSON"},
      {R"({"prompt": "abc)", "not valid JSON"},
      {R"({"prompt": "x"} trailing)", "not valid JSON"},
      {R"({"prompt": "x", "temperature": NaN})", "not valid JSON"},
      {"[1, 2]", "expected a JSON object, got array"},
      {R"("just a string")", "expected a JSON object, got string"},
      {R"({"prompt": 5})", "field 'prompt' must be a string"},
      {R"({"prompt": "x", "temperature": "hot"})", "field 'temperature' must be a number"},
      {R"({"prompt": "x", "temperature": -0.5})", "field 'temperature' must be in [0, 2] (got -0.5)"},
      {R"({"prompt": "x", "temperature": 2.5})", "field 'temperature' must be in [0, 2] (got 2.5)"},
      {R"({"prompt": "x", "temperature": 1e999})", "not valid JSON (number overflow parsing '1e999')"},
      {R"({"prompt": "x", "top_p": 0})", "field 'top_p' must be in (0, 1]"},
      {R"({"prompt": "x", "top_p": 1.5})", "field 'top_p' must be in (0, 1] (got 1.5)"},
      {R"({"prompt": "x", "top_k": -2})", "field 'top_k' must be >= 1, or -1 or 0 for off (got -2)"},
      {R"({"prompt": "x", "top_k": 2.5})", "field 'top_k' must be an integer"},
      {R"({"prompt": "x", "min_p": 1.5})", "field 'min_p' must be in [0, 1]"},
      {R"({"prompt": "x", "seed": "abc"})", "field 'seed' must be an integer"},
      {R"({"prompt": "x", "max_tokens": -1})", "field 'max_tokens' must be >= 1 (got -1)"},
      {R"({"prompt": "x", "max_tokens": 0})", "field 'max_tokens' must be >= 1 (got 0)"},
      {R"({"prompt": "x", "repetition_penalty": -1})", "field 'repetition_penalty' must be > 0 (got -1.0)"},
      {R"({"prompt": "x", "presence_penalty": 2.01})", "field 'presence_penalty' must be in [-2, 2] (got 2.01)"},
      {R"({"prompt": "x", "max_tokens": "16"})", "field 'max_tokens' must be an integer"},
      {R"({"prompt": "x", "max_tokens": 1.5})", "field 'max_tokens' must be an integer"},
      {R"({"prompt": "x", "max_tokens": 18446744073709551615})", "field 'max_tokens' is out of range"},
      {R"({"prompt": "x", "stop": 5})", "field 'stop' must be a string or a list of strings"},
      {R"({"prompt": "x", "stop": ["a", 3]})", "field 'stop' must be a string or a list of strings"},
      {R"({"prompt": "x", "stop": [""]})", "field 'stop' must not contain an empty string"},
      {R"({"prompt": "x", "ignore_eos": "yes"})", "field 'ignore_eos' must be true or false"},
      {R"({"prompt": "x", "prompt_token_ids": [1]})", "give either 'prompt' or 'prompt_token_ids', not both"},
      {R"({"id": "lonely"})", "missing 'prompt' (or 'prompt_token_ids')"},
      {R"({"prompt": ""})", "empty prompt: field 'prompt' is \"\""},
      {R"({"prompt_token_ids": []})", "empty prompt: field 'prompt_token_ids' is an empty list"},
      {R"({"prompt_token_ids": [1, -3]})", "field 'prompt_token_ids[1]' is a negative token id (-3)"},
      {R"({"prompt_token_ids": [1, "a"]})", "field 'prompt_token_ids[1]' must be an integer"},
      {R"({"prompt_token_ids": [3000000000]})", "field 'prompt_token_ids[0]' is out of range (3000000000)"},
      {R"({"prompt_token_ids": "1 2"})", "field 'prompt_token_ids' must be a list of integers"},
      {"{\"id\": \"u8\", \"prompt\": \"caf\xC3(x\"}", "prompt is not valid UTF-8"},
      {"{\"id\": \"bad\xFF\", \"prompt\": \"fine\"}", "field 'id' is not valid UTF-8"},
      {"{\"prompt\": \"fine\", \"stop\": [\"\xE2\x82\"]}", "field 'stop' is not valid UTF-8"},
      {R"({"id": true, "prompt": "x"})", "field 'id' must be a string or a number"},
      {R"({"id": "", "prompt": "x"})", "field 'id' is empty"},
      {R"({"messages": [{"role": "user", "content": "hi"}]})", "chat messages need a chat template; not supported"},
      {R"({"custom_id": "c1", "url": "/v1/chat/completions", "body": {"messages": []}})",
       "chat messages need a chat template; not supported"},
      {R"({"custom_id": "c2", "body": "prompt"})", "field 'body' must be an object"},
      {R"({"custom_id": "c3", "body": {"prompt": ["a", "b"]}})",
       "field 'body.prompt' must be a string, a list of token ids, or a list with one of either"},
      {R"({"custom_id": "c6", "body": {"prompt": [[1, 2], [3]]}})",
       "field 'body.prompt' must be a string, a list of token ids, or a list with one of either"},
      {R"({"prompt": "x", "n": )" + std::string(100000, '[') + std::string(100000, ']') + "}",
       "field 'n' = a JSON array too deep or large to show is not supported"},
      {R"({"prompt": "x", "n": )" + std::string(300000, '7') + "}", "not valid JSON"},
      {R"({"prompt": "x", "response_format": {"type": [[["text"]]]}})",
       R"(field 'response_format' = {"type":[[["text"]]]} is not supported)"},
      {R"({"custom_id": "c4", "body": {"prompt": "x", "temperature": "warm"}})",
       "field 'body.temperature' must be a number"},
      {R"({"custom_id": "c5", "body": {"max_tokens": 5}})", "missing field 'body.prompt'"},
      {R"({"custom_id": 7, "body": {"prompt": "x", "top_p": 2}})", "field 'body.top_p' must be in (0, 1]"},
  };
  return cases;
}

TEST(RequestReaderErrors, EachBadLineIsAnErrorAndTheNextLineParses) {
  ScratchDir dir;
  const std::string path = dir.file("bad.jsonl");
  std::string text;
  const auto& cases = bad_cases();
  for (size_t i = 0; i < cases.size(); ++i)
    text += cases[i].line + "\n" + R"({"id": "ok)" + std::to_string(i) + R"(", "prompt": "fine", "top_k": 3})" + "\n";
  write_file(path, text);

  const auto rs = read_all(path, PromptFormat::kJsonl);
  ASSERT_EQ(rs.size(), 2 * cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const ParsedRequest& bad = rs[2 * i];
    const ParsedRequest& good = rs[2 * i + 1];
    const int64_t line = static_cast<int64_t>(2 * i + 1);
    const std::string want = "line " + std::to_string(line) + ": " + cases[i].error;
    EXPECT_EQ(bad.error.substr(0, want.size()), want) << "input: " << cases[i].line << "\n got: " << bad.error;
    EXPECT_EQ(bad.line, line);
    EXPECT_FALSE(bad.prompt.has_value()) << cases[i].line;
    EXPECT_FALSE(bad.prompt_token_ids.has_value()) << cases[i].line;
    EXPECT_EQ(good.error, "") << "after: " << cases[i].line;
    EXPECT_EQ(good.id, "ok" + std::to_string(i));
    EXPECT_EQ(good.line, line + 1);
    EXPECT_EQ(*good.prompt, "fine");
    EXPECT_EQ(good.overrides.top_k, 3);
  }
}

TEST(RequestReaderErrors, ErrorRowsKeepTheIdWhenItCouldBeRead) {
  ScratchDir dir;
  const std::string path = dir.file("ids.jsonl");
  write_file(path,
             "{\"id\": \"keep-me\", \"prompt\": \"x\", \"temperature\": \"hot\"}\n"
             "{\"id\": \"u8\", \"prompt\": \"caf\xC3(x\"}\n"
             "{\"custom_id\": \"chat\", \"body\": {\"messages\": []}}\n"
             "{{{\n");
  const auto rs = read_all(path, PromptFormat::kJsonl);
  ASSERT_EQ(rs.size(), 4u);
  EXPECT_EQ(rs[0].id, "keep-me");
  EXPECT_EQ(rs[1].id, "u8");
  EXPECT_EQ(rs[1].error, "line 2: prompt is not valid UTF-8");
  EXPECT_EQ(rs[2].id, "chat");
  // Unreadable: no id, so that it cannot take one a readable line has (request_key).
  EXPECT_EQ(rs[3].id, "");
  EXPECT_EQ(rs[3].line, 4);
}

TEST(RequestReaderErrors, OverlongLineIsSkippedAndReadingGoesOn) {
  ScratchDir dir;
  const std::string path = dir.file("long.jsonl");
  const std::string head = R"({"id": "edge", "prompt": ")", tail = R"("})";
  const std::string at_limit = head + std::string(1000 - head.size() - tail.size(), 'e') + tail;
  ASSERT_EQ(at_limit.size(), 1000u);
  write_file(path, R"({"id": "before", "prompt": "a"})"
                   "\n" +
                       std::string(5000, 'x') + "\n" + R"({"id": "after", "prompt": "b"})" + "\n" + at_limit +
                       "\n" + std::string(1001, 'y'));
  RequestReader reader(path, PromptFormat::kJsonl);
  reader.set_max_line_bytes(1000);
  std::vector<ParsedRequest> rs;
  while (auto r = reader.next()) rs.push_back(*r);
  ASSERT_EQ(rs.size(), 5u);
  EXPECT_EQ(rs[0].id, "before");
  EXPECT_EQ(rs[1].error, "line 2: line too long (over 1000 bytes); skipped");
  EXPECT_EQ(rs[1].id, "");  // a JSONL line's id is unknown when it is not read
  EXPECT_EQ(rs[2].id, "after");
  EXPECT_EQ(*rs[2].prompt, "b");
  EXPECT_EQ(rs[3].id, "edge");
  EXPECT_EQ(rs[3].error, "");
  EXPECT_EQ(rs[4].error, "line 5: line too long (over 1000 bytes); skipped");
}

// How much the peak RSS grows reading `path` to its end with a line limit of max_line_bytes (0:
// the default), and the requests read; -1 where the peak cannot be restarted.
long peak_growth_kib(const std::string& path, int64_t max_line_bytes, std::vector<ParsedRequest>* rs) {
  if (!test::reset_peak_rss()) return -1;
  const long peak0 = test::peak_rss_kib();
  {
    RequestReader reader(path, PromptFormat::kText);
    if (max_line_bytes > 0) reader.set_max_line_bytes(max_line_bytes);
    while (auto r = reader.next()) rs->push_back(*r);
  }
  return test::peak_rss_kib() - peak0;
}

// A line four times the limit: a reader that buffered whole lines would hold 64 MiB at its peak,
// one that stops at the limit at most 16 MiB (32 with the string's doubling).
TEST(RequestReaderErrors, SixteenMibLimitByDefault) {
  ScratchDir dir;
  const std::string path = dir.file("huge.txt");
  {
    std::string huge(4 * RequestReader::kMaxLineBytes, 'z');
    write_file(path, huge + "\nnext prompt\n");
  }
  std::vector<ParsedRequest> rs;
  const long grown_kib = peak_growth_kib(path, 0, &rs);
  ASSERT_EQ(rs.size(), 2u);
  EXPECT_EQ(rs[0].error, "line 1: line too long (over 16777216 bytes); skipped");
  EXPECT_EQ(*rs[1].prompt, "next prompt");
  EXPECT_EQ(rs[1].id, "2");
  if (grown_kib < 0) GTEST_SKIP() << "the peak RSS cannot be restarted here (/proc/self/clear_refs)";
  if (!SHARDLM_IO_ASAN) {
    EXPECT_LT(grown_kib, 40 * 1024) << "reading a 64 MiB line grew the peak RSS by " << grown_kib << " KiB";
  }
}

// Below the default limit: a 32 MiB line under a 1 MiB limit is skipped with at most a few MiB
// held, not buffered and dropped.
TEST(RequestReaderErrors, OverlongLineIsDroppedAsItIsRead) {
  ScratchDir dir;
  const std::string path = dir.file("long.txt");
  {
    std::string line(32 << 20, 'w');
    write_file(path, "first\n" + line + "\nlast\n");
  }
  std::vector<ParsedRequest> rs;
  const long grown_kib = peak_growth_kib(path, 1 << 20, &rs);
  ASSERT_EQ(rs.size(), 3u);
  EXPECT_EQ(rs[1].error, "line 2: line too long (over 1048576 bytes); skipped");
  EXPECT_EQ(*rs[2].prompt, "last");
  if (grown_kib < 0) GTEST_SKIP() << "the peak RSS cannot be restarted here (/proc/self/clear_refs)";
  if (!SHARDLM_IO_ASAN) {
    EXPECT_LT(grown_kib, 8 * 1024) << "reading a 32 MiB line grew the peak RSS by " << grown_kib << " KiB";
  }
}

}  // namespace
}  // namespace shardlm
