// The op profile (compute/op_profile.h): its arithmetic on a scripted timeline (self times of
// nested sections, calls, kinds, what is ignored outside steps and while paused, the table), then
// the decoder's sections on tiny models through the engine (every section of every layer once a
// step, the profiled tokens equal to the unprofiled ones) and a captured decode step (one "graph
// replay", no marks inside the capture: the recording backend refuses them as CUDA's capture does).
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "arch/model.h"
#include "common/engine_harness.h"
#include "common/recording_backend.h"
#include "common/tiny_model.h"
#include "compute/cpu_backend.h"
#include "compute/op_profile.h"
#include "core/error.h"

namespace shardlm {
namespace {

// A timeline whose marks read a clock the test sets (microseconds).
class ScriptedTimeline final : public CpuBackend {
 public:
  double now_us = 0;
  int syncs = 0, clears = 0;
  std::vector<double> marks;
  int64_t mark_timeline() override {
    marks.push_back(now_us);
    return static_cast<int64_t>(marks.size()) - 1;
  }
  double timeline_seconds(int64_t a, int64_t b) const override { return (marks.at(b) - marks.at(a)) * 1e-6; }
  void clear_timeline() override {
    marks.clear();
    ++clears;
  }
  void synchronize() override { ++syncs; }
};

double us(double s) { return s * 1e6; }

const OpProfile::Row* row(const OpProfile::Totals& t, const std::string& name) {
  for (const OpProfile::Row& r : t.rows)
    if (r.name == name) return &r;
  return nullptr;
}

TEST(OpProfile, SelfTimesCallsAndKinds) {
  ScriptedTimeline b;
  OpProfile p(b);
  b.set_op_profile(&p);
  {
    OpSection s(b, "before any step");  // not timed
  }
  EXPECT_TRUE(b.marks.empty());
  p.begin_step("decode");  // t = 0
  {
    b.now_us = 1;
    OpSection outer(b, "outer");
    {
      b.now_us = 2;
      OpSection inner(b, "inner");
      b.now_us = 5;
    }
    {
      b.now_us = 6;
      OpSection inner(b, "inner");
      b.now_us = 7;
    }
    {
      OpProfile::Pause pause(&p);
      const size_t marks = b.marks.size();
      OpSection captured(b, "captured");
      EXPECT_EQ(b.marks.size(), marks);
    }
    b.now_us = 9;
  }
  {
    OpSection x(b, "x");
    b.now_us = 10;
  }
  {
    std::optional<OpSection> late;  // begun while paused, ended after: never marked, ends nothing
    {
      OpProfile::Pause pause(&p);
      late.emplace(b, "begun paused");
    }
    late.reset();
  }
  b.now_us = 12;
  p.end_step();
  EXPECT_EQ(b.syncs, 1);
  EXPECT_EQ(b.clears, 1);
  EXPECT_FALSE(p.in_step());

  const OpProfile::Totals d = p.totals("decode");
  EXPECT_EQ(d.steps, 1);
  EXPECT_DOUBLE_EQ(us(d.step_seconds), 12);
  ASSERT_EQ(d.rows.size(), 3u);  // outer, inner, x: in the order first seen
  EXPECT_EQ(d.rows[0].name, "outer");
  EXPECT_EQ(row(d, "outer")->calls, 1);
  EXPECT_NEAR(us(row(d, "outer")->seconds), 8 - 3 - 1, 1e-9);
  EXPECT_EQ(row(d, "inner")->calls, 2);
  EXPECT_NEAR(us(row(d, "inner")->seconds), 4, 1e-9);
  EXPECT_NEAR(us(row(d, "x")->seconds), 1, 1e-9);
  EXPECT_EQ(row(d, "captured"), nullptr);
  EXPECT_NEAR(us(d.section_seconds()), 9, 1e-9);

  // A second kind keeps its own totals; a second decode step adds to the first's.
  b.now_us = 100;
  p.begin_step("prefill");
  {
    OpSection s(b, "x");
    b.now_us = 130;
  }
  p.end_step();
  p.begin_step("decode");
  {
    OpSection s(b, "x", 6000);  // 6000 weight bytes in 3 us: 2 GB/s over this call
    b.now_us = 133;
  }
  p.end_step();
  EXPECT_EQ(p.kinds(), (std::vector<std::string>{"decode", "prefill"}));
  EXPECT_NEAR(us(row(p.totals("prefill"), "x")->seconds), 30, 1e-9);
  const OpProfile::Totals d2 = p.totals("decode");
  EXPECT_EQ(d2.steps, 2);
  EXPECT_EQ(row(d2, "x")->calls, 2);
  EXPECT_NEAR(us(row(d2, "x")->seconds), 4, 1e-9);
  EXPECT_NEAR(us(d2.step_seconds), 15, 1e-9);
  EXPECT_EQ(row(d2, "x")->bytes, 6000);  // over 4 us of the row: 1.5 GB/s in the table
  EXPECT_EQ(row(d2, "inner")->bytes, 0);
  EXPECT_EQ(p.totals("none").steps, 0);

  // The table: per step, largest first (ties as first seen), then what no section covered.
  const std::string table = format_op_profile(d2, "decode");
  EXPECT_NE(table.find("decode: 2 steps, 7.5 us a step"), std::string::npos) << table;
  EXPECT_LT(table.find("  outer "), table.find("  inner "));
  EXPECT_LT(table.find("  inner "), table.find("  x "));
  EXPECT_NE(table.find("  outer                           0.5          2.0                26.7%"), std::string::npos)
      << table;
  EXPECT_NE(table.find("  x                                 1          2.0          1.5   26.7%"), std::string::npos)
      << table;
  EXPECT_NE(table.find("  (outside sections)                           1.5                20.0%"), std::string::npos)
      << table;
  EXPECT_EQ(format_op_profile(p.totals("none"), "none"), "");
  p.reset();
  EXPECT_TRUE(p.kinds().empty());
  b.set_op_profile(nullptr);
}

TEST(OpProfile, RefusesUnpairedSectionsAndSteps) {
  ScriptedTimeline b;
  OpProfile p(b);
  EXPECT_THROW(p.end_step(), Error);
  p.begin_step("decode");
  EXPECT_THROW(p.begin_step("decode"), Error);
  EXPECT_THROW(p.end(), Error);
  p.begin("open");
  EXPECT_THROW(p.end_step(), Error);
  EXPECT_THROW(p.reset(), Error);
}

// ---- The decoder's sections ----

std::vector<ParsedRequest> one_request(int prompt_len, int max_tokens) {
  std::vector<int32_t> ids;
  for (int k = 0; k < prompt_len; ++k) ids.push_back(static_cast<int32_t>((k * 29 + 3) % 500));
  ParsedRequest r = test::ids_request("r", ids, max_tokens);
  r.overrides.ignore_eos = true;
  return {r};
}

// Runs one request unprofiled, then profiled, on the CPU backend; the tokens must agree.
std::map<std::string, OpProfile::Totals> profile_run(const std::string& config, int prompt_len, int64_t* steps_out) {
  test::LoadedModel m(test::tiny_model_dir(config, DType::F32, 5));
  const test::CollectSink plain = m.run(one_request(prompt_len, 6));
  OpProfile p(*m.backend);
  m.backend->set_op_profile(&p);
  const test::CollectSink profiled = m.run(one_request(prompt_len, 6));
  m.backend->set_op_profile(nullptr);
  EXPECT_EQ(plain.results.at(0).output_tokens, profiled.results.at(0).output_tokens);
  EXPECT_EQ(plain.results.at(0).token_logprobs, profiled.results.at(0).token_logprobs);
  *steps_out = static_cast<int64_t>(profiled.steps.size());
  std::map<std::string, OpProfile::Totals> out;
  for (const std::string& k : p.kinds()) out[k] = p.totals(k);
  return out;
}

void expect_calls(const OpProfile::Totals& t, const std::map<std::string, int64_t>& per_step) {
  for (const auto& [name, n] : per_step) {
    const OpProfile::Row* r = row(t, name);
    ASSERT_NE(r, nullptr) << name;
    EXPECT_EQ(r->calls, n * t.steps) << name;
    EXPECT_GE(r->seconds, 0) << name;
  }
  EXPECT_EQ(t.rows.size(), per_step.size());
  EXPECT_LE(t.section_seconds(), t.step_seconds * (1 + 1e-9));
}

TEST(OpProfile, DenseDecoderNamesEachLayersSections) {
  int64_t steps = 0;
  const auto k = profile_run("tiny-llama", 9, &steps);  // 4 layers
  ASSERT_EQ(k.size(), 2u);
  EXPECT_EQ(k.at("prefill").steps, 1);
  EXPECT_EQ(k.at("decode").steps, 5);  // 6 tokens: the prefill step samples the first
  EXPECT_EQ(steps, 6);
  const int64_t L = 4;
  std::map<std::string, int64_t> want = {
      {"step inputs", 1}, {"embedding", 1}, {"norm", 2 * L + 1}, {"attn qkv", L},       {"attn rope + cache write", L},
      {"attn core", L},   {"attn out", L},  {"mlp gate/up", L},  {"mlp activation", L}, {"mlp down", L},
      {"lm head", 1},     {"sampling", 1}};
  expect_calls(k.at("prefill"), want);
  expect_calls(k.at("decode"), want);
}

TEST(OpProfile, MlaAndMoeDecoderNamesEachLayersSections) {
  int64_t steps = 0;
  const auto k = profile_run("tiny-deepseek-v3", 40, &steps);  // 3 layers, the first dense
  const std::map<std::string, int64_t> want = {
      {"step inputs", 1}, {"embedding", 1},   {"norm", 7},        {"attn qkv", 3},    {"attn rope + cache write", 3},
      {"attn absorb", 6}, {"attn core", 3},   {"attn out", 3},    {"mlp gate/up", 1}, {"mlp activation", 1},
      {"mlp down", 1},    {"moe routing", 2}, {"moe experts", 2}, {"moe combine", 2}, {"moe shared expert", 2},
      {"lm head", 1},     {"sampling", 1}};
  // Prefill of 40 tokens x top-4 = 160 rows, past the routed path's 8 an expert: the layer reads
  // its offsets back, a second "moe routing" section; a decode token's experts read them on the
  // device (the routed path).
  std::map<std::string, int64_t> prefill = want;
  prefill["moe routing"] = 4;
  expect_calls(k.at("prefill"), prefill);
  expect_calls(k.at("decode"), want);
}

TEST(OpProfile, CapturedDecodeStepIsOneReplay) {
  const std::string dir = test::tiny_model_dir("tiny-llama", DType::F32, 5);
  const ModelSpec spec = ModelSpec::load(dir);
  auto ckpt = Checkpoint::open(dir);
  auto tok = Tokenizer::load(dir);
  test::RecordingBackend rec;
  auto model = build_model(spec, *ckpt, rec);
  ASSERT_EQ(model->enable_step_graphs(), "");
  OpProfile p(rec);
  rec.set_op_profile(&p);
  EngineConfig cfg;
  cfg.progress_interval_s = 0;
  cfg.kv_cache_bytes = 32LL << 20;
  Engine engine(*model, *tok, cfg);
  test::VectorSource src(one_request(9, 6));
  test::CollectSink sink;
  engine.run(src, sink);
  rec.set_op_profile(nullptr);
  ASSERT_EQ(sink.results.size(), 1u);
  EXPECT_GT(rec.captures(), 0);
  const OpProfile::Totals d = p.totals("decode");
  EXPECT_EQ(d.steps, 5);
  expect_calls(d, {{"graph replay", 1}, {"sampling", 1}});
}

}  // namespace
}  // namespace shardlm
