// The messages that carry finished requests and step rows from a replica's leader to the writer:
// every field comes back as it was packed, and a cut message is refused.
#include "parallel/result_messages.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace shardlm {
namespace {

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
