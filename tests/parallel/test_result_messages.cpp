// The messages that carry finished requests and step rows from a replica's leader to the writer:
// every field comes back as it was packed, and a cut message is refused.
#include "parallel/result_messages.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace shardlm {
namespace {

// Each field its own value, so that two read in each other's place (the three times) show.
TEST(ResultMessages, ResultRoundTripsEveryField) {
  RequestResult r;
  r.id = "req-\xC3\xA9-7";
  r.line = 1234567890123;
  r.prompt_tokens = {1, 403, 2147483647};
  r.output_tokens = {0, 9, 8, 7};
  r.output_text = std::string("text with a \0 inside", 21);
  r.finish_reason = FinishReason::kLength;
  r.token_logprobs = {-0.5f, -1.0f / 3.0f, 0.0f, -20.25f};
  r.error = "line 3: an error";
  r.replica = 5;
  r.t_queued = 0.125;
  r.t_first_token = 1.0 / 3.0;
  r.t_finished = 2.0 / 7.0 + 1;
  const RequestResult t = unpack_result(pack_result(r));
  EXPECT_EQ(t.id, r.id);
  EXPECT_EQ(t.line, r.line);
  EXPECT_EQ(t.prompt_tokens, r.prompt_tokens);
  EXPECT_EQ(t.output_tokens, r.output_tokens);
  EXPECT_EQ(t.output_text, r.output_text);
  EXPECT_EQ(t.finish_reason, r.finish_reason);
  EXPECT_EQ(t.token_logprobs, r.token_logprobs);
  EXPECT_EQ(t.error, r.error);
  EXPECT_EQ(t.replica, r.replica);
  EXPECT_EQ(t.t_queued, r.t_queued);
  EXPECT_EQ(t.t_first_token, r.t_first_token);
  EXPECT_EQ(t.t_finished, r.t_finished);
  // An empty result (a line whose id could not be read) too.
  const RequestResult e = unpack_result(pack_result(RequestResult{}));
  EXPECT_EQ(e.id, "");
  EXPECT_TRUE(e.output_tokens.empty());
}

TEST(ResultMessages, CutOrLongerResultIsRefused) {
  RequestResult r;
  r.id = "x";
  r.output_tokens = {1, 2, 3};
  const std::string bytes = pack_result(r);
  for (size_t cut : {size_t{1}, size_t{8}, bytes.size() - 1})
    EXPECT_THROW(unpack_result(bytes.substr(0, bytes.size() - cut)), Error) << cut;
  EXPECT_THROW(unpack_result(bytes + "x"), Error);
}

TEST(ResultMessages, StepRoundTripsEveryField) {
  StepRecord s;
  s.step = 41;
  s.replica = 3;
  s.batch_size = 7;
  s.prefill_tokens = 100;
  s.decode_tokens = 6;
  s.kv_blocks_used = 12;
  s.running = 9;
  s.waiting = 4;
  s.t_start = 1.0 / 3.0;
  s.wall_s = 0.125;
  s.moe_dispatch_s = 0.01;
  s.moe_combine_s = 0.02;
  s.moe_dispatch_bytes = 1 << 20;
  s.moe_combine_bytes = 3 << 20;
  s.expert_tokens = {5, 0, 7};
  s.stage_compute_s = {0.25, 1.0 / 7.0};
  s.stage_comm_s = {0.5, 2.0 / 9.0};
  const StepRecord t = unpack_step(pack_step(s));
  EXPECT_EQ(t.step, s.step);
  EXPECT_EQ(t.replica, s.replica);
  EXPECT_EQ(t.batch_size, s.batch_size);
  EXPECT_EQ(t.prefill_tokens, s.prefill_tokens);
  EXPECT_EQ(t.decode_tokens, s.decode_tokens);
  EXPECT_EQ(t.kv_blocks_used, s.kv_blocks_used);
  EXPECT_EQ(t.running, s.running);
  EXPECT_EQ(t.waiting, s.waiting);
  EXPECT_EQ(t.t_start, s.t_start);
  EXPECT_EQ(t.wall_s, s.wall_s);
  EXPECT_EQ(t.moe_dispatch_s, s.moe_dispatch_s);
  EXPECT_EQ(t.moe_combine_s, s.moe_combine_s);
  EXPECT_EQ(t.moe_dispatch_bytes, s.moe_dispatch_bytes);
  EXPECT_EQ(t.moe_combine_bytes, s.moe_combine_bytes);
  EXPECT_EQ(t.expert_tokens, s.expert_tokens);
  EXPECT_EQ(t.stage_compute_s, s.stage_compute_s);
  EXPECT_EQ(t.stage_comm_s, s.stage_comm_s);
}

TEST(ResultMessages, CutStepIsRefused) {
  StepRecord s;
  s.stage_compute_s = {0.25, 0.5};
  s.stage_comm_s = {0.5, 0.25};
  const std::string bytes = pack_step(s);
  EXPECT_THROW(unpack_step(bytes.substr(0, bytes.size() - 8)), Error);
}

}  // namespace
}  // namespace shardlm
