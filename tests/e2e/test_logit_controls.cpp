// vLLM's logit controls through the whole engine on stories260K: allowed_token_ids, logit_bias and
// min_tokens. Each greedy choice must be the argmax of the model's own logits (computed here one
// prefix at a time, no sampler) with the controls applied as vLLM's sampler applies them; stop
// tokens and stop strings must not end a request before min_tokens; ids past the vocabulary and
// min_tokens above max_tokens are per-request errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/engine_harness.h"
#include "common/model_steps.h"
#include "common/shared_data.h"

namespace shardlm {
namespace {

constexpr int32_t kEos = 2;  // stories260K's

const std::vector<int32_t> kPrompt = {1, 403, 407, 261, 378};

// The choice each output token must be: the argmax of the logits after the tokens before it, with
// the bias added and tokens outside `allowed` (when not empty) or in `barred` left out. Counts
// choices within 1e-5 of the runner-up (which fp32 and double may order differently) in *ties.
void expect_edited_argmax(Model& m, const RequestResult& r, const std::map<int32_t, float>& bias,
                          const std::set<int32_t>& allowed, const std::set<int32_t>& barred_before, int64_t min_tokens,
                          int* ties, int* checked) {
  std::vector<int32_t> seq = r.prompt_tokens;
  for (size_t i = 0; i < r.output_tokens.size(); ++i) {
    const std::vector<float> logits = test::prefill_then_decode(m, {seq});
    std::vector<double> edited(logits.begin(), logits.end());
    for (size_t t = 0; t < edited.size(); ++t) {
      const auto b = bias.find(static_cast<int32_t>(t));
      if (b != bias.end()) edited[t] += b->second;
      if (!allowed.empty() && !allowed.count(static_cast<int32_t>(t))) edited[t] = -INFINITY;
      if (static_cast<int64_t>(i) < min_tokens && barred_before.count(static_cast<int32_t>(t))) edited[t] = -INFINITY;
    }
    const auto best = std::max_element(edited.begin(), edited.end()) - edited.begin();
    const std::string what = r.id + " output " + std::to_string(i);
    if (r.output_tokens[i] != best) {
      EXPECT_NEAR(edited[r.output_tokens[i]], edited[best], 1e-5) << what;
      ++*ties;
    }
    ++*checked;
    seq.push_back(r.output_tokens[i]);
  }
}

TEST(LogitControls, GreedyChoicesAreTheEditedArgmax) {
  SHARDLM_REQUIRE_SHARED(dir, "models/stories260K");
  test::LoadedModel engine_model(dir), ref_model(dir);
  const std::vector<int32_t> allowed = {261, 288, 302, 377, 403, 410, 450};
  const std::vector<std::pair<int32_t, float>> bias = {{263, 2.5f}, {267, -100.0f}, {282, 4.0f}, {399, 1.25f}};
  std::vector<ParsedRequest> reqs;
  ParsedRequest a = test::ids_request("allowed", kPrompt, 12);
  a.overrides.allowed_token_ids = allowed;
  reqs.push_back(a);
  ParsedRequest b = test::ids_request("bias", kPrompt, 12);
  b.overrides.logit_bias = bias;
  reqs.push_back(b);
  ParsedRequest all = test::ids_request("all", kPrompt, 12);
  all.overrides.allowed_token_ids = allowed;
  all.overrides.logit_bias = {{288, 3.0f}, {410, -1.5f}};
  all.overrides.min_tokens = 6;
  all.overrides.repetition_penalty = 1.0;  // neutral: no penalty read
  reqs.push_back(all);
  // A sampled request keeps to its allowed tokens too.
  ParsedRequest s = test::ids_request("sampled", kPrompt, 24);
  s.overrides.allowed_token_ids = allowed;
  s.overrides.temperature = 1.0;
  s.overrides.ignore_eos = true;
  reqs.push_back(s);
  ParsedRequest plain = test::ids_request("plain", kPrompt, 12);
  reqs.push_back(plain);
  const auto out = engine_model.run(reqs);
  int ties = 0, checked = 0;
  const std::set<int32_t> allowed_set(allowed.begin(), allowed.end());
  for (const std::string id : {"allowed", "all", "sampled"}) {
    const RequestResult& r = out.by_id(id);
    ASSERT_TRUE(r.error.empty()) << r.error;
    ASSERT_FALSE(r.output_tokens.empty()) << id;
    for (int32_t t : r.output_tokens) EXPECT_TRUE(allowed_set.count(t)) << id << ": token " << t << " is not allowed";
  }
  EXPECT_EQ(out.by_id("sampled").output_tokens.size(), 24u);
  expect_edited_argmax(*ref_model.model, out.by_id("allowed"), {}, allowed_set, {}, 0, &ties, &checked);
  expect_edited_argmax(*ref_model.model, out.by_id("bias"), std::map<int32_t, float>(bias.begin(), bias.end()), {}, {},
                       0, &ties, &checked);
  expect_edited_argmax(*ref_model.model, out.by_id("all"), {{288, 3.0f}, {410, -1.5f}}, allowed_set, {kEos}, 6, &ties,
                       &checked);
  expect_edited_argmax(*ref_model.model, out.by_id("plain"), {}, {}, {}, 0, &ties, &checked);
  EXPECT_GE(checked, 40);
  EXPECT_LE(ties, 1);
  // The controls changed the choices: the bias and the allowed set each give another output.
  EXPECT_NE(out.by_id("bias").output_tokens, out.by_id("plain").output_tokens);
  EXPECT_NE(out.by_id("allowed").output_tokens, out.by_id("plain").output_tokens);
}

// EOS (and a stop token id) made the likeliest token by a bias: without min_tokens the request ends
// at its first token; with min_tokens N the stop token is barred for the first N tokens and ends the
// request at token N + 1, kept in the output as vLLM keeps it. With ignore_eos, EOS is no stop
// token, so min_tokens does not bar it.
TEST(LogitControls, MinTokensBarsTheStopTokens) {
  SHARDLM_REQUIRE_SHARED(dir, "models/stories260K");
  test::LoadedModel m(dir);
  std::vector<ParsedRequest> reqs;
  for (int64_t min_tokens : {0, 1, 5}) {
    ParsedRequest r = test::ids_request("eos" + std::to_string(min_tokens), kPrompt, 16);
    r.overrides.logit_bias = {{kEos, 100.0f}};
    r.overrides.min_tokens = min_tokens;
    reqs.push_back(r);
  }
  ParsedRequest stop_id = test::ids_request("stop-id", kPrompt, 16);
  stop_id.overrides.logit_bias = {{300, 100.0f}};
  stop_id.overrides.stop_token_ids = std::vector<int32_t>{300};
  stop_id.overrides.min_tokens = 3;
  reqs.push_back(stop_id);
  ParsedRequest ignored = test::ids_request("ignore-eos", kPrompt, 4);
  ignored.overrides.logit_bias = {{kEos, 100.0f}};
  ignored.overrides.min_tokens = 4;
  ignored.overrides.ignore_eos = true;
  reqs.push_back(ignored);
  const auto out = m.run(reqs);
  for (int64_t min_tokens : {0, 1, 5}) {
    const RequestResult& r = out.by_id("eos" + std::to_string(min_tokens));
    ASSERT_TRUE(r.error.empty()) << r.error;
    ASSERT_EQ(static_cast<int64_t>(r.output_tokens.size()), min_tokens + 1) << r.id;
    EXPECT_EQ(r.output_tokens.back(), kEos) << r.id;
    EXPECT_EQ(r.finish_reason, FinishReason::kStop) << r.id;
    for (size_t i = 0; i + 1 < r.output_tokens.size(); ++i) EXPECT_NE(r.output_tokens[i], kEos) << r.id;
  }
  const RequestResult& s = out.by_id("stop-id");
  ASSERT_EQ(s.output_tokens.size(), 4u);
  EXPECT_EQ(s.output_tokens.back(), 300);
  EXPECT_EQ(s.finish_reason, FinishReason::kStop);
  const RequestResult& g = out.by_id("ignore-eos");
  EXPECT_EQ(g.output_tokens, std::vector<int32_t>(4, kEos));
  EXPECT_EQ(g.finish_reason, FinishReason::kLength);
}

// A stop string found in the first min_tokens tokens does not end the request (vLLM checks stop
// strings only once the output is longer than min_tokens, on the newest text).
TEST(LogitControls, StopStringsWaitForMinTokens) {
  SHARDLM_REQUIRE_SHARED(dir, "models/stories260K");
  test::LoadedModel m(dir);
  const auto plain = m.run({test::ids_request("plain", kPrompt, 10)});
  const RequestResult& p = plain.by_id("plain");
  ASSERT_EQ(p.output_tokens.size(), 10u);
  // The text of the first two tokens, as the stop string.
  const auto two = m.run({test::ids_request("two", kPrompt, 2)});
  const std::string stop = two.by_id("two").output_text;
  ASSERT_FALSE(stop.empty());
  ASSERT_EQ(p.output_text.rfind(stop, 0), 0u);
  ASSERT_EQ(p.output_text.find(stop, 1), std::string::npos) << "the stop string occurs once";
  std::vector<ParsedRequest> reqs;
  for (int64_t min_tokens : {0, 4}) {
    ParsedRequest r = test::ids_request("min" + std::to_string(min_tokens), kPrompt, 10);
    r.overrides.stop = std::vector<std::string>{stop};
    r.overrides.min_tokens = min_tokens;
    reqs.push_back(r);
  }
  const auto out = m.run(reqs);
  const RequestResult& early = out.by_id("min0");
  EXPECT_EQ(early.output_tokens.size(), 2u);
  EXPECT_EQ(early.finish_reason, FinishReason::kStop);
  EXPECT_EQ(early.output_text, "");
  const RequestResult& late = out.by_id("min4");
  EXPECT_EQ(late.output_tokens, p.output_tokens);
  EXPECT_EQ(late.output_text, p.output_text);
  EXPECT_EQ(late.finish_reason, FinishReason::kLength);
}

// Ids past the vocabulary and min_tokens above max_tokens: an error row each, the rest run.
TEST(LogitControls, BadValuesAreRequestErrors) {
  SHARDLM_REQUIRE_SHARED(dir, "models/stories260K");
  test::LoadedModel m(dir);
  std::vector<ParsedRequest> reqs;
  ParsedRequest a = test::ids_request("allowed", kPrompt, 4);
  a.overrides.allowed_token_ids = std::vector<int32_t>{5, 512};
  reqs.push_back(a);
  ParsedRequest b = test::ids_request("bias", kPrompt, 4);
  b.overrides.logit_bias = {{7, 1.0f}, {600, -1.0f}};
  reqs.push_back(b);
  ParsedRequest c = test::ids_request("min", kPrompt, 4);
  c.overrides.min_tokens = 5;
  reqs.push_back(c);
  reqs.push_back(test::ids_request("fine", kPrompt, 4));
  const auto out = m.run(reqs);
  EXPECT_NE(out.by_id("allowed").error.find("allowed_token_ids: token id 512 is outside the vocabulary [0, 512)"),
            std::string::npos)
      << out.by_id("allowed").error;
  EXPECT_NE(out.by_id("bias").error.find("logit_bias: token id 600 is outside the vocabulary [0, 512)"),
            std::string::npos)
      << out.by_id("bias").error;
  EXPECT_NE(out.by_id("min").error.find("min_tokens (5) must be at most max_tokens (4)"), std::string::npos)
      << out.by_id("min").error;
  EXPECT_EQ(out.by_id("fine").error, "");
  EXPECT_EQ(out.by_id("fine").output_tokens.size(), 4u);
}

}  // namespace
}  // namespace shardlm
