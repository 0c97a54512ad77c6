#include <gtest/gtest.h>

#include "core/error.h"
#include "model/model_spec.h"
#include "parallel/rank_report.h"
#include "parallel/topology.h"

namespace shardlm {
namespace {

ModelSpec spec(int64_t heads = 8, int64_t kv = 4, int64_t layers = 5) {
  ModelSpec s;
  s.architecture = "LlamaForCausalLM";
  s.hidden_size = 64;
  s.intermediate_size = 172;
  s.num_layers = layers;
  s.num_heads = heads;
  s.num_kv_heads = kv;
  s.head_dim = 8;
  s.vocab_size = 512;
  return s;
}

std::string error_of(const Layout& l, int world, const ModelSpec& s) {
  try {
    Topology t(l, 0, world, s);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Topology, TpInnermostThenStagesThenReplicas) {
  const Layout l{2, 2, 2};
  Topology t(l, 5, 8, spec());
  EXPECT_EQ(t.coords().tp, 1);
  EXPECT_EQ(t.coords().pp, 0);
  EXPECT_EQ(t.coords().replica, 1);
  EXPECT_EQ(t.tp_group(), (std::vector<int>{4, 5}));
  EXPECT_EQ(t.pp_group(), (std::vector<int>{5, 7}));
  EXPECT_EQ(t.replica_group(), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(t.replica_leaders(), (std::vector<int>{0, 4}));
  EXPECT_EQ(t.replica_leader(), 4);
  EXPECT_FALSE(t.is_replica_leader());
  for (int r = 0; r < 8; ++r) EXPECT_EQ(t.rank_of(t.coords_of(r)), r);
}

TEST(Topology, BalancedStagesEarlierTakeTheRemainder) {
  Topology t(Layout{1, 3, 1}, 0, 3, spec(8, 4, 5));
  EXPECT_EQ(t.stage_layers(0), (std::pair<int, int>{0, 2}));
  EXPECT_EQ(t.stage_layers(1), (std::pair<int, int>{2, 4}));
  EXPECT_EQ(t.stage_layers(2), (std::pair<int, int>{4, 5}));
  t.set_stage_layers(parse_stage_layers("1,1,3", 3, 5), 5);
  EXPECT_EQ(t.stage_layers(2), (std::pair<int, int>{2, 5}));
}

TEST(Topology, RefusesWhatDoesNotDivideNamingTheNumbers) {
  EXPECT_NE(error_of({3, 1, 1}, 3, spec()).find("--tp 3 does not divide the 8 attention heads"), std::string::npos);
  EXPECT_NE(error_of({2, 1, 1}, 3, spec()).find("needs 2 ranks but the job has 3"), std::string::npos);
  EXPECT_NE(error_of({8, 1, 1}, 8, spec(8, 4)).find("does not divide intermediate_size 172"), std::string::npos);
  EXPECT_NE(error_of({1, 6, 1}, 6, spec()).find("--pp 6 exceeds the model's 5 layers"), std::string::npos);
  ModelSpec odd_kv = spec(12, 3);
  odd_kv.intermediate_size = 176;
  EXPECT_NE(error_of({4, 1, 1}, 4, odd_kv).find("3 KV heads"), std::string::npos);
  EXPECT_EQ(error_of({4, 1, 1}, 4, spec(8, 2)), "");  // KV heads replicated: tp 4 over 2 KV heads
  EXPECT_THROW(parse_stage_layers("2,2", 3, 5), Error);
  EXPECT_THROW(parse_stage_layers("2,x,1", 3, 5), Error);
  EXPECT_THROW(parse_stage_layers("2,2,2", 3, 5), Error);
  EXPECT_THROW(parse_stage_layers("0,3,2", 3, 5), Error);
}

TEST(RankReport, LocalRanksCountPerHost) {
  std::vector<RankRecord> r(5);
  const char* hosts[] = {"a", "b", "a", "a", "b"};
  for (int i = 0; i < 5; ++i) r[i].host = hosts[i];
  assign_local_ranks(&r);
  EXPECT_EQ(r[0].local_rank, 0);
  EXPECT_EQ(r[1].local_rank, 0);
  EXPECT_EQ(r[2].local_rank, 1);
  EXPECT_EQ(r[3].local_rank, 2);
  EXPECT_EQ(r[4].local_rank, 1);
}

}  // namespace
}  // namespace shardlm
