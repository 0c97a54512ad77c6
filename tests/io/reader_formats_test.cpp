// RequestReader on each file format, line endings, BOMs, ids and format selection.
#include <gtest/gtest.h>

#include "core/error.h"
#include "io/request_reader.h"
#include "io_test_util.h"

namespace shardlm {
namespace {

using test::read_all;
using test::ScratchDir;
using test::write_file;

// Replicas take windows of lines in turn: a window's lines are parsed, lines before it are read
// past unparsed, and reading stops at the window's end until the next window is set.
TEST(RequestReader, LineWindows) {
  ScratchDir dir;
  const std::string path = dir.file("p.jsonl");
  write_file(path,
             "{\"id\": \"a\", \"prompt\": \"x\"}\n"
             "not json\n"
             "\n"
             "{\"id\": \"d\", \"prompt\": \"x\"}\n"
             "{\"id\": \"e\", \"prompt\": \"x\"}\n"
             "{\"id\": \"f\", \"prompt\": \"x\"}\n"
             "{\"id\": \"g\", \"prompt\": \"x\"}\n");
  RequestReader reader(path, PromptFormat::kAuto);
  auto drain = [&] {
    std::vector<std::string> seen;
    while (auto q = reader.next()) seen.push_back(q->error.empty() ? q->id : "error@" + std::to_string(q->line));
    return seen;
  };
  reader.set_window(2, 4);  // lines 2 and 3: a bad line and a blank one
  EXPECT_EQ(drain(), (std::vector<std::string>{"error@2"}));
  EXPECT_EQ(reader.lines_read(), 3);
  EXPECT_FALSE(reader.eof());
  reader.set_window(5, 7);  // skips line 4 unparsed
  EXPECT_EQ(drain(), (std::vector<std::string>{"e", "f"}));
  EXPECT_THROW(reader.set_window(5, 9), Error);  // already past line 5
  reader.set_window(7, 100);
  EXPECT_EQ(drain(), (std::vector<std::string>{"g"}));
  EXPECT_TRUE(reader.eof());
}

TEST(RequestReader, JsonlFile) {
  ScratchDir dir;
  const std::string path = dir.file("p.jsonl");
  write_file(path,
             "{\"id\": \"a\", \"prompt\": \"Once upon a time\", \"max_tokens\": 8}\n"
             "\n"
             "   \n"
             "{\"prompt\": \"no id here\", \"temperature\": 0.0}\n"
             "{\"id\": 17, \"prompt_token_ids\": [1, 2, 3], \"seed\": 5, \"stop\": \"x\"}\n");
  RequestReader reader(path, PromptFormat::kAuto);
  EXPECT_EQ(reader.format(), PromptFormat::kJsonl);
  std::vector<ParsedRequest> rs;
  while (auto r = reader.next()) rs.push_back(*r);
  EXPECT_EQ(reader.lines_read(), 5);
  ASSERT_EQ(rs.size(), 3u);  // blank lines skipped
  EXPECT_EQ(rs[0].id, "a");
  EXPECT_EQ(rs[0].line, 1);
  EXPECT_EQ(*rs[0].prompt, "Once upon a time");
  EXPECT_EQ(rs[0].overrides.max_tokens, 8);
  EXPECT_EQ(rs[1].id, "4");  // missing id: the line number, counting the blank lines
  EXPECT_EQ(rs[1].line, 4);
  EXPECT_EQ(rs[1].overrides.temperature, 0.0);
  EXPECT_EQ(rs[2].id, "17");
  EXPECT_EQ(*rs[2].prompt_token_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(rs[2].overrides.seed, 5u);
  EXPECT_EQ(*rs[2].overrides.stop, std::vector<std::string>{"x"});
  for (const auto& r : rs) EXPECT_EQ(r.error, "") << r.line;
}

TEST(RequestReader, JsonlWithBomAndCrlf) {
  ScratchDir dir;
  const std::string path = dir.file("win.jsonl");
  write_file(path,
             "\xEF\xBB\xBF{\"id\": \"first\", \"prompt\": \"Hello\"}\r\n"
             "\r\n"
             "{\"id\": \"second\", \"prompt\": \"World\"}\r\n"
             "{\"id\": \"third\", \"prompt\": \"no newline at end\"}");
  const auto rs = read_all(path, PromptFormat::kJsonl);
  ASSERT_EQ(rs.size(), 3u);
  EXPECT_EQ(rs[0].error, "");
  EXPECT_EQ(rs[0].id, "first");
  EXPECT_EQ(*rs[0].prompt, "Hello");
  EXPECT_EQ(rs[1].id, "second");
  EXPECT_EQ(rs[1].line, 3);
  EXPECT_EQ(*rs[1].prompt, "World");
  EXPECT_EQ(*rs[2].prompt, "no newline at end");
}

TEST(RequestReader, TextFile) {
  ScratchDir dir;
  const std::string path = dir.file("p.txt");
  write_file(path,
             "\xEF\xBB\xBFOnce upon a time, a dragon\r\n"
             "  The little robot woke up\n"
             "\n"
             "\r\n"
             "Lily found a caf\xC3\xA9 \xF0\x9F\x99\x82\n"
             "bad \xC3( bytes\n"
             "last line");
  RequestReader reader(path, PromptFormat::kAuto);
  EXPECT_EQ(reader.format(), PromptFormat::kText);
  std::vector<ParsedRequest> rs;
  while (auto r = reader.next()) rs.push_back(*r);
  ASSERT_EQ(rs.size(), 7u);
  for (size_t i = 0; i < rs.size(); ++i) {
    EXPECT_EQ(rs[i].id, std::to_string(i + 1));
    EXPECT_EQ(rs[i].line, static_cast<int64_t>(i + 1));
  }
  EXPECT_EQ(*rs[0].prompt, "Once upon a time, a dragon");  // BOM and CR gone
  EXPECT_EQ(*rs[1].prompt, "  The little robot woke up");  // leading spaces kept
  EXPECT_EQ(rs[2].error, "line 3: empty prompt");
  EXPECT_FALSE(rs[2].prompt.has_value());
  EXPECT_EQ(rs[3].error, "line 4: empty prompt");
  EXPECT_EQ(*rs[4].prompt, "Lily found a caf\xC3\xA9 \xF0\x9F\x99\x82");
  EXPECT_EQ(rs[5].error, "line 6: prompt is not valid UTF-8");
  EXPECT_EQ(*rs[6].prompt, "last line");
}

TEST(RequestReader, OpenAiBatchFile) {
  ScratchDir dir;
  const std::string path = dir.file("batch.jsonl");
  write_file(path,
             R"({"custom_id": "r1", "method": "POST", "url": "/v1/completions", "body": {"prompt": "One", "max_tokens": 3}})"
             "\n"
             R"({"custom_id": "r2", "method": "POST", "url": "/v1/completions", "body": {"prompt": ["Two"], "seed": 4}})"
             "\n"
             R"({"id": "plain", "prompt": "Three"})"
             "\n");
  // As JSONL, OpenAI lines and plain lines mix.
  auto rs = read_all(path, PromptFormat::kAuto);
  ASSERT_EQ(rs.size(), 3u);
  EXPECT_EQ(rs[0].id, "r1");
  EXPECT_EQ(*rs[0].prompt, "One");
  EXPECT_EQ(rs[0].overrides.max_tokens, 3);
  EXPECT_EQ(rs[1].id, "r2");
  EXPECT_EQ(*rs[1].prompt, "Two");
  EXPECT_EQ(rs[1].overrides.seed, 4u);
  EXPECT_EQ(rs[2].id, "plain");
  EXPECT_EQ(rs[2].error, "");
  // As "openai", a plain line is an error.
  rs = read_all(path, PromptFormat::kOpenAiBatch);
  ASSERT_EQ(rs.size(), 3u);
  EXPECT_EQ(rs[0].error, "");
  EXPECT_EQ(rs[2].error, "line 3: expected an OpenAI batch line with 'custom_id' and 'body'");
}

TEST(RequestReader, LinesLongerThanTheReadChunk) {
  ScratchDir dir;
  const std::string path = dir.file("long.txt");
  // Around the reader's 64 KiB chunk: one short of, exactly at and past its boundary.
  const std::string a(65534, 'a'), b(65535, 'b'), c(65536, 'c'), d(300000, 'd');
  write_file(path, a + "\n" + b + "\n" + c + "\r\n" + d);
  const auto rs = read_all(path, PromptFormat::kText);
  ASSERT_EQ(rs.size(), 4u);
  EXPECT_EQ(*rs[0].prompt, a);
  EXPECT_EQ(*rs[1].prompt, b);
  EXPECT_EQ(*rs[2].prompt, c);
  EXPECT_EQ(*rs[3].prompt, d);
}

TEST(RequestReader, FormatSelection) {
  EXPECT_EQ(prompt_format_from_name("auto"), PromptFormat::kAuto);
  EXPECT_EQ(prompt_format_from_name("jsonl"), PromptFormat::kJsonl);
  EXPECT_EQ(prompt_format_from_name("text"), PromptFormat::kText);
  EXPECT_EQ(prompt_format_from_name("openai"), PromptFormat::kOpenAiBatch);
  try {
    prompt_format_from_name("csv");
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'csv'"), std::string::npos) << e.what();
  }
  ScratchDir dir;
  for (const char* name : {"a.JSONL", "b.json"}) {
    write_file(dir.file(name), "{\"prompt\": \"x\"}\n");
    EXPECT_EQ(RequestReader(dir.file(name), PromptFormat::kAuto).format(), PromptFormat::kJsonl) << name;
  }
  write_file(dir.file("c.prompts"), "{\"prompt\": \"x\"}\n");
  RequestReader text(dir.file("c.prompts"), PromptFormat::kAuto);
  EXPECT_EQ(text.format(), PromptFormat::kText);
  EXPECT_EQ(*text.next()->prompt, "{\"prompt\": \"x\"}");  // read as text, verbatim
}

TEST(RequestReader, OpenErrorsNameThePath) {
  ScratchDir dir;
  const std::string missing = dir.file("nope.jsonl");
  try {
    RequestReader r(missing, PromptFormat::kAuto);
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  try {
    RequestReader r(dir.path(), PromptFormat::kText);
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos) << e.what();
  }
}

TEST(RequestReader, EmptyFile) {
  ScratchDir dir;
  write_file(dir.file("e.jsonl"), "");
  RequestReader r(dir.file("e.jsonl"), PromptFormat::kAuto);
  EXPECT_FALSE(r.next().has_value());
  EXPECT_FALSE(r.next().has_value());
  EXPECT_EQ(r.lines_read(), 0);
}

}  // namespace
}  // namespace shardlm
