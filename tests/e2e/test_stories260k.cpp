// End to end on a real trained model: stories260K against llama2.c's own greedy output.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "common/engine_harness.h"
#include "common/expect_error.h"
#include "common/shared_data.h"
#include "common/test_files.h"

namespace shardlm {
namespace {


TEST(Stories260K, GreedyFromBosMatchesReference) {
  SHARDLM_REQUIRE_SHARED(dir, "models/stories260K");
  const auto expected = test::read_ids(dir + "/expected_greedy_from_bos.ids");
  ASSERT_EQ(expected.size(), 200u);
  test::LoadedModel m(dir);
  auto out = m.run({test::ids_request("bos", {1}, 200)});
  ASSERT_EQ(out.results.size(), 1u);
  const RequestResult& r = out.results[0];
  EXPECT_TRUE(r.error.empty()) << r.error;
  EXPECT_EQ(r.output_tokens, expected);
  EXPECT_EQ(r.output_text, test::read_file(dir + "/expected_greedy_from_bos.txt"));
  EXPECT_EQ(r.finish_reason, FinishReason::kLength);
  ASSERT_EQ(r.token_logprobs.size(), 200u);
  for (float lp : r.token_logprobs) {
    EXPECT_LE(lp, 0.0f);
    EXPECT_GT(lp, -20.0f);
  }
}

TEST(Stories260K, TextPromptGetsBosAndContinuesTheReference) {
  SHARDLM_REQUIRE_SHARED(dir, "models/stories260K");
  const auto expected = test::read_ids(dir + "/expected_greedy_from_bos.ids");
  test::LoadedModel m(dir);
  auto out = m.run({test::text_request("t", "Once upon a time", 50)});
  const RequestResult& r = out.results[0];
  ASSERT_TRUE(r.error.empty()) << r.error;
  EXPECT_EQ(r.prompt_tokens, (std::vector<int32_t>{1, 403, 407, 261, 378}));
  EXPECT_EQ(r.output_tokens, std::vector<int32_t>(expected.begin() + 4, expected.begin() + 54));
}

// As vLLM's detokenizer, the output decodes as the prompt's continuation: after "Once upon a time,"
// the text is " there was", where decode() of the output alone drops SentencePiece's first space,
// and a stop string " there" matches the first token (text and figures from tokenizers' DecodeStream
// primed with the prompt, as vLLM primes it).
TEST(Stories260K, OutputTextContinuesThePrompt) {
  SHARDLM_REQUIRE_SHARED(dir, "models/stories260K");
  test::LoadedModel m(dir);
  ParsedRequest stop = test::text_request("stop", "Once upon a time,", 20);
  stop.overrides.stop = std::vector<std::string>{" there"};
  auto out = m.run({test::text_request("t", "Once upon a time,", 8), stop});
  const RequestResult& r = out.by_id("t");
  ASSERT_EQ(r.output_tokens, (std::vector<int32_t>{383, 286, 261, 376, 298, 315, 421, 395}));
  EXPECT_EQ(m.tok->decode(r.output_tokens), "there was a little girl named");
  EXPECT_EQ(r.output_text, " there was a little girl named");
  const RequestResult& s = out.by_id("stop");
  EXPECT_EQ(s.finish_reason, FinishReason::kStop);
  EXPECT_EQ(s.output_tokens, (std::vector<int32_t>{383}));
  EXPECT_EQ(s.output_text, "");
}

// Many requests with different prompts, sampled at temperature > 0: every request gives the same
// tokens and bit-identical logprobs alone, inside a batch of 64 others, with tiny prefill chunks,
// and with a KV cache so small that sequences are preempted and recomputed.
TEST(Stories260K, BatchInvariance) {
  SHARDLM_REQUIRE_SHARED(dir, "models/stories260K");
  test::LoadedModel m(dir);
  std::vector<ParsedRequest> reqs;
  const char* starts[] = {"Once upon a time", "The little dog", "Lily and Ben", "One day, a bird", "Tom had a red"};
  for (int i = 0; i < 65; ++i) {
    ParsedRequest r = test::text_request(std::string("r").append(std::to_string(i)), starts[i % 5], 40 + (i % 7) * 5);
    r.overrides.temperature = 0.9;
    r.overrides.top_p = 0.95;
    r.overrides.seed = 1000 + i;
    reqs.push_back(r);
  }
  auto alone = m.run({reqs[17]});
  EngineConfig batched;
  batched.scheduler.max_seqs = 65;
  auto all = m.run(reqs, batched);
  EngineConfig chunked;
  chunked.scheduler.max_seqs = 8;
  chunked.scheduler.max_batch_tokens = 3;
  auto small_chunks = m.run(reqs, chunked);
  EngineConfig tight;
  tight.scheduler.max_seqs = 32;
  tight.scheduler.block_size = 4;
  tight.kv_cache_bytes = 5LL * 2 * 4 * 4 * 8 * 4 * 40;  // 40 blocks of 4 tokens (5 layers, 4 KV heads, head_dim 8)
  auto preempted = m.run(reqs, tight);
  ASSERT_EQ(all.results.size(), 65u);
  ASSERT_EQ(small_chunks.results.size(), 65u);
  ASSERT_EQ(preempted.results.size(), 65u);
  const RequestResult& a = alone.results[0];
  const RequestResult& b = all.by_id("r17");
  EXPECT_EQ(a.output_tokens, b.output_tokens);
  EXPECT_EQ(a.token_logprobs, b.token_logprobs);
  for (const auto& r : all.results) {
    const auto& c = small_chunks.by_id(r.id);
    const auto& p = preempted.by_id(r.id);
    EXPECT_EQ(r.output_tokens, c.output_tokens) << r.id;
    EXPECT_EQ(r.token_logprobs, c.token_logprobs) << r.id;
    EXPECT_EQ(r.output_tokens, p.output_tokens) << r.id;
    EXPECT_EQ(r.token_logprobs, p.token_logprobs) << r.id;
  }
  // The tight cache did preempt (and recompute) sequences; the others had room.
  EXPECT_GT(preempted.stats.preemptions, 0);
  EXPECT_EQ(all.stats.preemptions, 0);
  // The batched run really batched: some step ran more than 32 sequences.
  int max_batch = 0;
  for (const auto& s : all.steps) max_batch = std::max(max_batch, s.batch_size);
  EXPECT_GT(max_batch, 32);
  // Requests with different seeds and prompts produce different texts.
  EXPECT_NE(all.by_id("r0").output_tokens, all.by_id("r5").output_tokens);
}

// vLLM's stop_token_ids: the first of them generated ends the request with finish reason stop
// and stays in output_tokens, its text out of output_text; ignore_eos does not switch them off.
TEST(Stories260K, StopTokenIdsEndTheRequest) {
  SHARDLM_REQUIRE_SHARED(dir, "models/stories260K");
  test::LoadedModel m(dir);
  ParsedRequest free_run = test::ids_request("free", {1}, 12);
  free_run.overrides.ignore_eos = true;
  const std::vector<int32_t> want = m.run({free_run}).by_id("free").output_tokens;
  ASSERT_EQ(want.size(), 12u);
  const int32_t stop_id = want[4];
  const size_t first = static_cast<size_t>(std::find(want.begin(), want.end(), stop_id) - want.begin());
  ParsedRequest stopped = free_run;
  stopped.id = "stopped";
  stopped.overrides.stop_token_ids = std::vector<int32_t>{999999, stop_id};
  const auto out = m.run({stopped});
  const auto& got = out.by_id("stopped");
  EXPECT_EQ(got.finish_reason, FinishReason::kStop);
  EXPECT_EQ(got.output_tokens, std::vector<int32_t>(want.begin(), want.begin() + first + 1));
  EXPECT_EQ(got.output_text, m.tok->decode(std::vector<int32_t>(want.begin(), want.begin() + first)));
  EXPECT_NE(got.output_text, m.tok->decode(got.output_tokens));  // the stop token's text is not empty
}

TEST(Stories260K, StopStringsEosAndErrors) {
  SHARDLM_REQUIRE_SHARED(dir, "models/stories260K");
  test::LoadedModel m(dir);
  ParsedRequest stop = test::ids_request("stop", {1}, 200);
  stop.overrides.stop = std::vector<std::string>{"Lily"};
  ParsedRequest bad_id = test::ids_request("bad", {1, 9999}, 5);
  ParsedRequest empty = test::text_request("empty", "", 5);
  ParsedRequest parse_error;
  parse_error.id = "7";
  parse_error.line = 7;
  parse_error.error = "line 7: not JSON";
  ParsedRequest too_long = test::ids_request("long", std::vector<int32_t>(600, 5), 5);
  ParsedRequest good = test::ids_request("good", {1}, 10);
  ParsedRequest none = test::ids_request("none", {1, 403}, 0);
  auto out = m.run({stop, bad_id, empty, parse_error, too_long, good, none});
  ASSERT_EQ(out.results.size(), 7u);
  // max_tokens 0 is refused, as vLLM refuses it: an error row, the other requests unaffected.
  EXPECT_NE(out.by_id("none").error.find("max_tokens must be >= 1"), std::string::npos) << out.by_id("none").error;
  EXPECT_EQ(out.by_id("none").finish_reason, FinishReason::kError);
  EXPECT_TRUE(out.by_id("none").output_tokens.empty());
  const auto& s = out.by_id("stop");
  EXPECT_EQ(s.finish_reason, FinishReason::kStop);
  EXPECT_EQ(s.output_text, "Once upon a time, there was a little girl named ");
  EXPECT_NE(out.by_id("bad").error.find("outside the vocabulary"), std::string::npos);
  EXPECT_NE(out.by_id("empty").error.find("empty prompt"), std::string::npos);
  EXPECT_EQ(out.by_id("7").error, "line 7: not JSON");
  EXPECT_NE(out.by_id("long").error.find("no room to generate within the context of 512 tokens"), std::string::npos)
      << out.by_id("long").error;
  EXPECT_EQ(out.by_id("long").error.find("kv-cache-gb"), std::string::npos) << out.by_id("long").error;
  // With a KV cache smaller than the model's context, the error names the cache as the limit.
  EngineConfig small;
  small.kv_cache_bytes = 256 << 10;
  ParsedRequest over_cache = test::ids_request("over", std::vector<int32_t>(400, 5), 5);
  auto capped = m.run({over_cache}, small);
  ASSERT_EQ(capped.results.size(), 1u);
  const std::string& e = capped.by_id("over").error;
  EXPECT_NE(e.find("prompt of 400 tokens leaves no room"), std::string::npos) << e;
  EXPECT_NE(e.find("the model's context is 512 tokens: a larger --kv-cache-gb raises it"), std::string::npos) << e;
  // A budget that holds no block fails at once, naming it.
  EngineConfig no_block;
  no_block.kv_cache_bytes = 100;
  test::expect_error([&] { m.run({over_cache}, no_block); },
                     {"KV cache: this rank's budget of 100 bytes holds no block of", "raise --kv-cache-gb"});
  const auto& g = out.by_id("good");
  EXPECT_TRUE(g.error.empty());
  EXPECT_EQ(g.output_tokens.size(), 10u);
}

// --max-model-len: a prompt that leaves no room is an error naming the option, generation stops for
// length at the limit with the tokens of an unlimited run, the cache is capped at max_seqs sequences
// of the limit, and a limit the cache cannot hold stops the engine before it starts.
TEST(Stories260K, MaxModelLenIsKeptOrTheEngineDoesNotStart) {
  SHARDLM_REQUIRE_SHARED(dir, "models/stories260K");
  const auto expected = test::read_ids(dir + "/expected_greedy_from_bos.ids");
  test::LoadedModel m(dir);
  EngineConfig cfg;
  cfg.scheduler.max_model_len = 64;
  EXPECT_EQ(kv_block_cap(m.spec, cfg.scheduler), 64 / 16 * cfg.scheduler.max_seqs);
  auto out = m.run({test::ids_request("bos", {1}, 200), test::ids_request("full", std::vector<int32_t>(64, 5), 5),
                    test::ids_request("room", std::vector<int32_t>(63, 5), 5)},
                   cfg);
  const RequestResult& bos = out.by_id("bos");
  EXPECT_EQ(bos.finish_reason, FinishReason::kLength);
  EXPECT_EQ(bos.output_tokens, std::vector<int32_t>(expected.begin(), expected.begin() + 63));
  const std::string& e = out.by_id("full").error;
  EXPECT_NE(e.find("prompt of 64 tokens leaves no room to generate within the context of 64 tokens "
                   "(--max-model-len; the model's context is 512 tokens)"),
            std::string::npos)
      << e;
  EXPECT_EQ(out.by_id("room").output_tokens.size(), 1u);
  EXPECT_EQ(out.by_id("room").finish_reason, FinishReason::kLength);
  // 256 KiB hold 12 blocks of 16 tokens: 5 layers x 16 tokens x 64 floats of key and value.
  EngineConfig small = cfg;
  small.kv_cache_bytes = 256 << 10;
  small.scheduler.max_model_len = 300;
  test::expect_error([&] { m.run({test::ids_request("bos", {1}, 5)}, small); },
                     {"--max-model-len 300: the KV cache holds 192 tokens", "raise --kv-cache-gb"});
  small.scheduler.max_model_len = 192;
  EXPECT_EQ(m.run({test::ids_request("bos", {1}, 500)}, small).by_id("bos").output_tokens.size(), 191u);
}

}  // namespace
}  // namespace shardlm
