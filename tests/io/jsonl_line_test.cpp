// parse_jsonl_line on single lines: ids, prompts, every sampling override, OpenAI batch lines.
#include <gtest/gtest.h>

#include <random>

#include "io/request_reader.h"
#include "core/utf8.h"

namespace shardlm {
namespace {

TEST(JsonlLine, ParsesEveryOverride) {
  const ParsedRequest r = parse_jsonl_line(
      R"({"id": "q1", "prompt": "Once upon a time", "max_tokens": 32, "temperature": 0.7, "top_p": 0.9,)"
      R"( "top_k": 40, "min_p": 0.05, "seed": 18446744073709551615, "stop": ["\n\n", "The end"],)"
      R"( "ignore_eos": true, "unknown_extra": {"x": [1, 2]}})",
      7);
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.id, "q1");
  EXPECT_EQ(r.line, 7);
  ASSERT_TRUE(r.prompt.has_value());
  EXPECT_EQ(*r.prompt, "Once upon a time");
  EXPECT_FALSE(r.prompt_token_ids.has_value());
  const SamplingOverrides& o = r.overrides;
  EXPECT_EQ(o.max_tokens, 32);
  EXPECT_EQ(o.temperature, 0.7);
  EXPECT_EQ(o.top_p, 0.9);
  EXPECT_EQ(o.top_k, 40);
  EXPECT_EQ(o.min_p, 0.05);
  EXPECT_EQ(o.seed, UINT64_C(18446744073709551615));
  ASSERT_TRUE(o.stop.has_value());
  EXPECT_EQ(*o.stop, (std::vector<std::string>{"\n\n", "The end"}));
  EXPECT_EQ(o.ignore_eos, true);
}

TEST(JsonlLine, UnsetOverridesStayUnset) {
  const ParsedRequest r = parse_jsonl_line(R"({"prompt": "hi", "temperature": null, "stop": null})", 3);
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.id, "3");  // no id: the line number
  EXPECT_FALSE(r.overrides.max_tokens || r.overrides.temperature || r.overrides.top_p || r.overrides.top_k ||
               r.overrides.min_p || r.overrides.seed || r.overrides.stop || r.overrides.ignore_eos);
}

// OpenAI chat's max_completion_tokens sets the output length as max_tokens does, and wins where
// both are given (vLLM's chat requests); a negative one is a per-request error.
TEST(JsonlLine, MaxCompletionTokensIsMaxTokens) {
  EXPECT_EQ(parse_jsonl_line(R"({"prompt": "a", "max_completion_tokens": 3})", 1).overrides.max_tokens, 3);
  EXPECT_EQ(parse_jsonl_line(R"({"prompt": "a", "max_tokens": 9, "max_completion_tokens": 3})", 1).overrides.max_tokens,
            3);
  EXPECT_EQ(
      parse_jsonl_line(R"({"prompt": "a", "max_tokens": 9, "max_completion_tokens": null})", 1).overrides.max_tokens,
      9);
  const ParsedRequest bad = parse_jsonl_line(R"({"prompt": "a", "max_completion_tokens": -1})", 4);
  EXPECT_NE(bad.error.find("field 'max_completion_tokens' must be >= 1 (got -1)"), std::string::npos) << bad.error;
}

TEST(JsonlLine, IdsAndEdgeValues) {
  EXPECT_EQ(parse_jsonl_line(R"({"id": 42, "prompt": "a"})", 1).id, "42");
  EXPECT_EQ(parse_jsonl_line(R"({"id": -5, "prompt": "a"})", 1).id, "-5");
  EXPECT_EQ(parse_jsonl_line(R"({"id": 2.5, "prompt": "a"})", 1).id, "2.5");
  EXPECT_EQ(parse_jsonl_line(R"({"id": "caf\u00e9", "prompt": "a"})", 1).id, "caf\xC3\xA9");
  const ParsedRequest r = parse_jsonl_line(
      R"({"prompt": "a", "max_tokens": 1, "temperature": 0, "top_p": 1, "top_k": -1, "min_p": 0, "seed": 0,)"
      R"( "stop": "END", "ignore_eos": false})",
      1);
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.overrides.max_tokens, 1);
  // vLLM's bound: at least one token (0 is refused there, not a request that completes at once).
  const ParsedRequest zero = parse_jsonl_line(R"({"prompt": "a", "max_tokens": 0})", 2);
  EXPECT_EQ(zero.error, "line 2: field 'max_tokens' must be >= 1 (got 0)");
  EXPECT_EQ(r.overrides.temperature, 0.0);
  EXPECT_EQ(r.overrides.top_p, 1.0);
  EXPECT_EQ(r.overrides.top_k, -1);
  EXPECT_EQ(r.overrides.min_p, 0.0);
  EXPECT_EQ(r.overrides.seed, 0u);
  EXPECT_EQ(*r.overrides.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(r.overrides.ignore_eos, false);
  // An integral float is taken as an integer (some writers emit every number as a float).
  EXPECT_EQ(parse_jsonl_line(R"({"prompt": "a", "max_tokens": 16.0})", 1).overrides.max_tokens, 16);
  // An id with a NUL would be stored cut short (the file's strings end at one): an error row.
  const ParsedRequest nul = parse_jsonl_line(R"({"id": "x\u0000y", "prompt": "a"})", 3);
  EXPECT_EQ(nul.error, "line 3: field 'id' contains a NUL character (\\u0000)");
  EXPECT_EQ(nul.id, "");  // not "x": that may be another request's
  // A line without the field is known by its number; one whose id cannot be read, by none.
  EXPECT_EQ(parse_jsonl_line(R"({"prompt": "a"})", 7).id, "7");
  EXPECT_EQ(parse_jsonl_line(R"({"prompt": "a)", 7).id, "");
  EXPECT_EQ(parse_jsonl_line(R"({"id": [1], "prompt": "a"})", 7).id, "");
  // vLLM takes any signed 64-bit seed; a negative one is its 64-bit pattern, but -1 is no seed.
  EXPECT_EQ(parse_jsonl_line(R"({"prompt": "a", "seed": -2})", 1).overrides.seed, UINT64_MAX - 1);
  EXPECT_FALSE(parse_jsonl_line(R"({"prompt": "a", "seed": -1})", 1).overrides.seed.has_value());
  EXPECT_FALSE(nul.prompt.has_value());
}

TEST(JsonlLine, TokenIdPrompt) {
  const ParsedRequest r = parse_jsonl_line(R"({"id": "t", "prompt_token_ids": [1, 0, 2147483647, 403]})", 2);
  ASSERT_EQ(r.error, "");
  EXPECT_FALSE(r.prompt.has_value());
  ASSERT_TRUE(r.prompt_token_ids.has_value());
  EXPECT_EQ(*r.prompt_token_ids, (std::vector<int32_t>{1, 0, 2147483647, 403}));
}

TEST(JsonlLine, OpenAiBatchLine) {
  const ParsedRequest r = parse_jsonl_line(
      R"({"custom_id": "req-1", "method": "POST", "url": "/v1/completions", "body": {"model": "x",)"
      R"( "prompt": "Tell me a story", "max_tokens": 20, "temperature": 0.5, "top_p": 0.8, "seed": 9,)"
      R"( "stop": ["\n"], "n": 1}})",
      4);
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.id, "req-1");
  EXPECT_EQ(*r.prompt, "Tell me a story");
  EXPECT_EQ(r.overrides.max_tokens, 20);
  EXPECT_EQ(r.overrides.temperature, 0.5);
  EXPECT_EQ(r.overrides.top_p, 0.8);
  EXPECT_EQ(r.overrides.seed, 9u);
  EXPECT_EQ(*r.overrides.stop, std::vector<std::string>{"\n"});

  const ParsedRequest list = parse_jsonl_line(R"({"custom_id": "req-2", "body": {"prompt": ["Only one"]}})", 5);
  ASSERT_EQ(list.error, "");
  EXPECT_EQ(*list.prompt, "Only one");

  const ParsedRequest ids = parse_jsonl_line(R"({"custom_id": "req-3", "body": {"prompt": [5, 6, 7]}})", 6);
  ASSERT_EQ(ids.error, "");
  EXPECT_EQ(*ids.prompt_token_ids, (std::vector<int32_t>{5, 6, 7}));
  // A batch of one token list, as the completions API takes it.
  const ParsedRequest one = parse_jsonl_line(R"({"custom_id": "req-4", "body": {"prompt": [[5, 6]]}})", 7);
  ASSERT_EQ(one.error, "");
  EXPECT_EQ(*one.prompt_token_ids, (std::vector<int32_t>{5, 6}));
}

TEST(JsonlLine, ChatMessagesAreAPerRequestError) {
  const ParsedRequest r = parse_jsonl_line(
      R"({"custom_id": "chat-1", "method": "POST", "url": "/v1/chat/completions",)"
      R"( "body": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}})",
      9);
  EXPECT_EQ(r.id, "chat-1");
  EXPECT_EQ(r.line, 9);
  EXPECT_EQ(r.error, "line 9: chat messages need a chat template; not supported");
  EXPECT_FALSE(r.prompt.has_value());
}

// vLLM's stop_token_ids and penalties are applied; the sampling fields this engine does not apply
// are refused when they ask for something, and pass at their neutral values.
TEST(JsonlLine, StopTokenIdsAndUnappliedFields) {
  const ParsedRequest ok = parse_jsonl_line(
      R"({"id": "a", "prompt": "x", "stop_token_ids": [7, 0], "n": 1, "best_of": null, "repetition_penalty": 1.0,)"
      R"( "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}, "logprobs": 1.0, "echo": false,)"
      R"( "min_tokens": 0, "include_stop_str_in_output": false, "prompt_logprobs": null, "suffix": "",)"
      R"( "use_beam_search": false, "add_special_tokens": true, "skip_special_tokens": true, "bad_words": [],)"
      R"( "guided_json": null, "response_format": {"type": "text"}, "truncate_prompt_tokens": null})",
      1);
  EXPECT_EQ(ok.error, "");
  ASSERT_TRUE(ok.overrides.stop_token_ids.has_value());
  EXPECT_EQ(*ok.overrides.stop_token_ids, (std::vector<int32_t>{7, 0}));
  // vLLM's penalties are applied: each field is read.
  const ParsedRequest pen = parse_jsonl_line(
      R"({"id": "p", "prompt": "x", "repetition_penalty": 1.15, "presence_penalty": -2, "frequency_penalty": 0.5})", 1);
  EXPECT_EQ(pen.error, "");
  EXPECT_EQ(pen.overrides.repetition_penalty, 1.15);
  EXPECT_EQ(pen.overrides.presence_penalty, -2.0);
  EXPECT_EQ(pen.overrides.frequency_penalty, 0.5);
  // vLLM's logprobs (completions: an integer; chat: a boolean with top_logprobs) and prompt_logprobs.
  EXPECT_EQ(ok.overrides.logprobs, 1);
  EXPECT_FALSE(ok.overrides.prompt_logprobs.has_value());
  const ParsedRequest lp = parse_jsonl_line(R"({"id": "l", "prompt": "x", "logprobs": 5, "prompt_logprobs": 0})", 1);
  EXPECT_EQ(lp.error, "");
  EXPECT_EQ(lp.overrides.logprobs, 5);
  EXPECT_EQ(lp.overrides.prompt_logprobs, 0);
  const ParsedRequest chat =
      parse_jsonl_line(R"({"id": "c", "prompt": "x", "logprobs": true, "top_logprobs": 20, "prompt_logprobs": 20})", 1);
  EXPECT_EQ(chat.error, "");
  EXPECT_EQ(chat.overrides.logprobs, 20);
  EXPECT_EQ(chat.overrides.prompt_logprobs, 20);
  EXPECT_EQ(parse_jsonl_line(R"({"id": "t", "prompt": "x", "logprobs": true})", 1).overrides.logprobs, 0);
  EXPECT_FALSE(parse_jsonl_line(R"({"id": "f", "prompt": "x", "logprobs": false})", 1).overrides.logprobs.has_value());
  // top_logprobs 0 (some clients send it by default) needs nothing.
  EXPECT_EQ(parse_jsonl_line(R"({"id": "z", "prompt": "x", "top_logprobs": 0})", 1).error, "");
  const std::pair<const char*, const char*> refused[] = {
      {R"("n": 4)", "line 2: field 'n' = 4 is not supported: one completion is generated per request"},
      {R"("best_of": 2)", "field 'best_of' = 2 is not supported"},
      // The penalties outside vLLM's bounds.
      {R"("repetition_penalty": 0)", "field 'repetition_penalty' must be > 0 (got 0.0)"},
      {R"("repetition_penalty": "1.2")", "field 'repetition_penalty' must be a number"},
      {R"("presence_penalty": 2.5)", "field 'presence_penalty' must be in [-2, 2] (got 2.5)"},
      {R"("frequency_penalty": -3)", "field 'frequency_penalty' must be in [-2, 2] (got -3.0)"},
      // vLLM's logit controls, malformed.
      {R"("logit_bias": [5, 100])", "field 'logit_bias' must be an object of token ids to biases"},
      {R"("logit_bias": {"x5": 1})", "field 'logit_bias[x5]': the key is not a token id"},
      {R"("logit_bias": {"-3": 1})", "field 'logit_bias[-3]': the key is not a token id"},
      {R"("logit_bias": {"5": "1"})", "field 'logit_bias[5]' must be a number"},
      {R"("logit_bias": {"5": 1, "05": 2})", "field 'logit_bias' names token 5 twice"},
      {R"("min_tokens": -1)", "field 'min_tokens' must be >= 0 (got -1)"},
      {R"("min_tokens": 1.5)", "field 'min_tokens' must be an integer"},
      {R"("allowed_token_ids": [])", "field 'allowed_token_ids' is empty"},
      {R"("allowed_token_ids": [1, -2])", "field 'allowed_token_ids[1]' is not a token id (-2)"},
      {R"("allowed_token_ids": 3)", "field 'allowed_token_ids' must be a list of token ids"},
      // vLLM's max_logprobs bound.
      {R"("logprobs": 21)", "field 'logprobs' must be in [0, 20] (got 21; vLLM's max_logprobs)"},
      {R"("logprobs": -1)", "field 'logprobs' must be in [0, 20] (got -1"},
      {R"("logprobs": 0.5)", "field 'logprobs' must be an integer"},
      {R"("prompt_logprobs": 40)", "field 'prompt_logprobs' must be in [0, 20] (got 40"},
      {R"("logprobs": true, "top_logprobs": 30)", "field 'top_logprobs' must be in [0, 20]"},
      {R"("top_logprobs": 3)", "field 'top_logprobs' needs \"logprobs\": true"},
      {R"("logprobs": false, "top_logprobs": 3)", "field 'top_logprobs' needs \"logprobs\": true"},
      {R"("echo": true)", "field 'echo' = true is not supported"},
      {R"("include_stop_str_in_output": true)", "field 'include_stop_str_in_output' = true"},
      {R"("use_beam_search": true)", "field 'use_beam_search' = true is not supported: beam search is not run"},
      {R"("add_special_tokens": false)", "field 'add_special_tokens' = false is not supported: BOS is prepended"},
      {R"("skip_special_tokens": false)", "field 'skip_special_tokens' = false is not supported"},
      {R"("truncate_prompt_tokens": 100)", "field 'truncate_prompt_tokens' = 100 is not supported"},
      {R"("bad_words": ["x"])", "field 'bad_words'"},
      {R"("guided_json": {"type": "object"})", "field 'guided_json' = {\"type\":\"object\"} is not supported"},
      {R"("guided_choice": ["a", "b"])", "guided decoding is not applied"},
      {R"("response_format": {"type": "json_object"})", "field 'response_format'"},
      {R"("structured_outputs": {"regex": "a+"})", "field 'structured_outputs'"},
      {R"("stop_token_ids": [-1])", "field 'stop_token_ids[0]' is not a token id (-1)"},
      {R"("stop_token_ids": 7)", "field 'stop_token_ids' must be a list of token ids"},
  };
  for (const auto& [field, want] : refused) {
    const ParsedRequest r = parse_jsonl_line(std::string(R"({"id": "b", "prompt": "x", )") + field + "}", 2);
    EXPECT_NE(r.error.find(want), std::string::npos) << field << ": " << r.error;
    EXPECT_FALSE(r.prompt.has_value()) << field;
  }
  // In an OpenAI batch line, under body; and the endpoint must be the completions one.
  const ParsedRequest body =
      parse_jsonl_line(R"({"custom_id": "c", "url": "/v1/completions", "body": {"prompt": "x", "n": 2}})", 3);
  EXPECT_NE(body.error.find("field 'body.n' = 2 is not supported"), std::string::npos) << body.error;
  const ParsedRequest url =
      parse_jsonl_line(R"({"custom_id": "d", "url": "/v1/embeddings", "body": {"prompt": "x"}})", 4);
  EXPECT_EQ(
      url.error,
      "line 4: field 'url' = \"/v1/embeddings\" is not supported (the completions endpoint, /v1/completions, is)");
}

// vLLM's logit controls as read: logit_bias by token id (OpenAI's string keys), sorted and
// clamped to [-100, 100] as vLLM's server does; min_tokens; allowed_token_ids as given.
TEST(JsonlLine, LogitControls) {
  const ParsedRequest r = parse_jsonl_line(
      R"({"id": "l", "prompt": "x", "logit_bias": {"50256": -1000, "7": 2.5, "12": 100.5}, "min_tokens": 4,
          "allowed_token_ids": [9, 3, 9000]})",
      1);
  ASSERT_EQ(r.error, "");
  const std::vector<std::pair<int32_t, float>> bias = {{7, 2.5f}, {12, 100.0f}, {50256, -100.0f}};
  EXPECT_EQ(r.overrides.logit_bias, bias);
  EXPECT_EQ(r.overrides.min_tokens, 4);
  EXPECT_EQ(r.overrides.allowed_token_ids, (std::vector<int32_t>{9, 3, 9000}));
  const ParsedRequest none = parse_jsonl_line(R"({"id": "n", "prompt": "x", "logit_bias": {}, "min_tokens": 0})", 1);
  ASSERT_EQ(none.error, "");
  EXPECT_TRUE(none.overrides.logit_bias->empty());
  EXPECT_FALSE(none.overrides.allowed_token_ids.has_value());
  // Under an OpenAI batch line's body too.
  const ParsedRequest body = parse_jsonl_line(
      R"({"custom_id": "c", "url": "/v1/completions", "body": {"prompt": "x", "logit_bias": {"1": -5}}})", 2);
  ASSERT_EQ(body.error, "");
  EXPECT_EQ(body.overrides.logit_bias, (std::vector<std::pair<int32_t, float>>{{1, -5.0f}}));
}

TEST(JsonlLine, BadUtf8InAnIgnoredFieldIsTolerated) {
  const ParsedRequest r = parse_jsonl_line("{\"id\": \"k\", \"note\": \"\xFF\", \"prompt\": \"fine\"}", 1);
  EXPECT_EQ(r.error, "");
  EXPECT_EQ(*r.prompt, "fine");
}

// Random byte edits of valid lines: every result is either a request or an error, never a throw.
TEST(JsonlLine, MutatedLinesNeverThrow) {
  const std::vector<std::string> seeds = {
      R"({"id": "q1", "prompt": "Once upon a time", "max_tokens": 32, "temperature": 0.7, "stop": ["\n"]})",
      R"({"custom_id": "r", "body": {"prompt": ["café"], "top_p": 0.5, "seed": 3}})",
      R"({"prompt_token_ids": [1, 2, 3], "top_k": -1, "ignore_eos": true, "min_p": 0.1})",
  };
  std::mt19937 rng(1234);
  const char alphabet[] = "{}[]\":,.-+eE0123456789 \\u\xC3\xA9\xFF\x80tfn";
  int ok = 0, errors = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string line = seeds[iter % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !line.empty(); ++e) {
      const size_t pos = rng() % line.size();
      switch (rng() % 3) {
        case 0: line[pos] = alphabet[rng() % (sizeof alphabet - 1)]; break;
        case 1: line.erase(pos, 1 + rng() % 3); break;
        default: line.insert(pos, 1, alphabet[rng() % (sizeof alphabet - 1)]); break;
      }
    }
    ParsedRequest r;
    ASSERT_NO_THROW(r = parse_jsonl_line(line, iter + 1)) << line;
    ASSERT_EQ(r.line, iter + 1);
    if (r.error.empty()) {
      ++ok;
      ASSERT_TRUE(r.prompt.has_value() != r.prompt_token_ids.has_value()) << line;
    } else {
      ++errors;
      ASSERT_EQ(r.error.rfind("line " + std::to_string(iter + 1) + ": ", 0), 0u) << r.error;
      ASSERT_FALSE(r.prompt.has_value() || r.prompt_token_ids.has_value()) << line;
    }
  }
  EXPECT_GT(ok, 100);
  EXPECT_GT(errors, 100);
}

TEST(JsonlLine, ParseErrorMessagesStayShortAndUtf8) {
  std::string line = R"({"prompt": ")";
  for (int i = 0; i < 400; ++i) line += "\xC3\xA9";  // é
  line += "\x01\"}";                                 // a raw control character: invalid JSON
  const ParsedRequest r = parse_jsonl_line(line, 3);
  EXPECT_EQ(r.error.rfind("line 3: not valid JSON (", 0), 0u) << r.error;
  EXPECT_LT(r.error.size(), 260u);
  EXPECT_TRUE(is_valid_utf8(r.error)) << r.error;
}

TEST(JsonlLine, DeepNestingIsAnErrorNotACrash) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_EQ(parse_jsonl_line(deep, 1).error, "line 1: expected a JSON object, got array");
  const std::string nested = R"({"prompt": "x", "extra": )" + deep + "}";
  EXPECT_EQ(parse_jsonl_line(nested, 2).error, "");
}

}  // namespace
}  // namespace shardlm
