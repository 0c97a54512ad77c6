// Decode steps as captured graphs (--cuda-graphs) against eager steps, on the CPU: the recording
// backend (tests/common/recording_backend.h) captures and replays the way a CUDA graph does, so
// the decoder's graph path (padding to a bucket, inputs written before capture, recapture after
// scratch growth) runs here exactly as on the GPU. Tokens and logprobs must be bit-identical to
// eager runs on the plain CPU backend: the CPU kernels compute every row independently of the
// row count, so padding changes nothing.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "arch/model.h"
#include "arch/step_graphs.h"
#include "common/engine_harness.h"
#include "common/recording_backend.h"
#include "common/tiny_model.h"
#include "compute/backend.h"
#include "engine/engine.h"
#include "model/checkpoint.h"
#include "model/make_model.h"
#include "model/model_spec.h"
#include "tokenizer/tokenizer.h"

namespace shardlm {
namespace {

std::string model_dir(const std::string& config) { return test::tiny_model_dir(config, DType::F32, 7); }

// Two copies of a model: eager on the CPU backend, and with graphs on the recording backend.
struct Pair {
  explicit Pair(const std::string& config)
      : dir(model_dir(config)),
        spec(ModelSpec::load(dir)),
        ckpt(Checkpoint::open(dir)),
        cpu(make_backend("cpu")),
        eager(build_model(spec, *ckpt, *cpu)),
        graphed(build_model(spec, *ckpt, rec)) {
    EXPECT_EQ(graphed->enable_step_graphs(), "");
  }
  std::string dir;
  ModelSpec spec;
  std::unique_ptr<Checkpoint> ckpt;
  std::unique_ptr<ComputeBackend> cpu;
  test::RecordingBackend rec;
  std::unique_ptr<Model> eager, graphed;
};

// ---- Model level: exact logits and the capture counters ----

constexpr int64_t kBlockSize = 4, kBlocksPerSeq = 16;

// A sequence of the test: its tokens so far and its own block list.
struct Seq {
  std::vector<int32_t> tokens;
  std::vector<int32_t> table;
};

Seq make_seq(int index, int64_t prompt_len) {
  Seq s;
  for (int64_t i = 0; i < prompt_len; ++i) s.tokens.push_back(static_cast<int32_t>((index * 37 + i * 11) % 500));
  for (int64_t b = 0; b < kBlocksPerSeq; ++b) s.table.push_back(static_cast<int32_t>(index * kBlocksPerSeq + b));
  return s;
}

// Runs a step on both models and checks the logits are the same bits; returns them.
std::vector<float> step_both(Pair& p, const ForwardBatch& batch) {
  const size_t n = batch.logit_rows.size() * static_cast<size_t>(p.spec.vocab_size);
  std::vector<float> a(n), b(n, -1.0f);
  p.eager->forward(batch, a.data());
  p.graphed->forward(batch, b.data());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), n * sizeof(float)), 0) << "logits differ";
  return a;
}

// Prefill of whole prompts (several tokens per sequence: never a graph step).
ForwardBatch prefill(const std::vector<Seq*>& seqs) {
  ForwardBatch b;
  b.clear();
  for (Seq* s : seqs) {
    b.add_chunk(s->tokens.data(), 0, static_cast<int64_t>(s->tokens.size()), s->table, kBlockSize, true);
  }
  return b;
}

// One decode token per sequence: the last token of each, whose KV entry is not written yet.
ForwardBatch decode(const std::vector<Seq*>& seqs) {
  ForwardBatch b;
  b.clear();
  for (Seq* s : seqs) {
    b.add_chunk(s->tokens.data(), static_cast<int64_t>(s->tokens.size()) - 1, 1, s->table, kBlockSize, true);
  }
  return b;
}

// Greedy next token of each row; appended to the sequences.
void advance(Pair& p, const std::vector<Seq*>& seqs, const std::vector<float>& logits) {
  const int64_t V = p.spec.vocab_size;
  for (size_t r = 0; r < seqs.size(); ++r) {
    const float* row = logits.data() + r * V;
    int32_t best = 0;
    for (int64_t v = 1; v < V; ++v) best = row[v] > row[best] ? static_cast<int32_t>(v) : best;
    seqs[r]->tokens.push_back(best);
  }
}

// Which steps may replay, and at which bucket: decode rows only, each its own sequence in order,
// each sampling, at most the largest bucket.
TEST(DecodeGraphs, BucketOfAStep) {
  std::vector<Seq> seqs;
  for (int i = 0; i < 300; ++i) seqs.push_back(make_seq(i, 5));
  const auto decode_of = [&](int n) {
    std::vector<Seq*> v;
    for (int i = 0; i < n; ++i) v.push_back(&seqs[i]);
    return decode(v);
  };
  EXPECT_EQ(graph_bucket(ForwardBatch{}), 0) << "an empty step";
  const std::pair<int, int64_t> sizes[] = {{1, 1}, {2, 2}, {3, 4}, {5, 8}, {8, 8}, {9, 16}, {100, 128}, {256, 256}};
  for (const auto& [n, bucket] : sizes) EXPECT_EQ(graph_bucket(decode_of(n)), bucket) << n << " decode rows";
  EXPECT_EQ(graph_bucket(decode_of(257)), 0) << "more rows than the largest bucket";

  Seq* two[] = {&seqs[0], &seqs[1]};
  EXPECT_EQ(graph_bucket(prefill({two[0]})), 0) << "a prompt of 5 tokens";
  ForwardBatch mixed = decode({two[0]});
  mixed.add_chunk(seqs[1].tokens.data(), 0, 5, seqs[1].table, kBlockSize, true);
  EXPECT_EQ(graph_bucket(mixed), 0) << "a decode row with a prefill chunk";

  ForwardBatch no_logits;
  no_logits.clear();
  no_logits.add_chunk(seqs[0].tokens.data(), 4, 1, seqs[0].table, kBlockSize, true);
  no_logits.add_chunk(seqs[1].tokens.data(), 4, 1, seqs[1].table, kBlockSize, false);
  EXPECT_EQ(graph_bucket(no_logits), 0) << "a row without logits";

  ForwardBatch reordered = decode({two[0], two[1]});
  std::swap(reordered.logit_rows[0], reordered.logit_rows[1]);
  EXPECT_EQ(graph_bucket(reordered), 0) << "logit rows out of row order";
  ForwardBatch ok = decode({two[0], two[1]});
  EXPECT_EQ(graph_bucket(ok), 2);
}

TEST(DecodeGraphs, BucketsCapturesAndRecapture) {
  Pair p("tiny-llama");
  for (Model* m : {p.eager.get(), p.graphed.get()}) m->allocate_kv_cache(64LL << 20, kBlockSize, 9 * kBlocksPerSeq);
  std::vector<Seq> seqs;
  for (int i = 0; i < 8; ++i) seqs.push_back(make_seq(i, 3 + 2 * i));
  auto ptrs = [&](int from, int to) {
    std::vector<Seq*> v;
    for (int i = from; i < to; ++i) v.push_back(&seqs[i]);
    return v;
  };

  // Prefill runs eagerly.
  advance(p, ptrs(0, 3), step_both(p, prefill(ptrs(0, 3))));
  EXPECT_EQ(p.rec.captures(), 0);
  EXPECT_EQ(p.rec.replays(), 0);

  // 3 decode rows: bucket 4, captured once, replayed every step.
  for (int s = 0; s < 3; ++s) advance(p, ptrs(0, 3), step_both(p, decode(ptrs(0, 3))));
  EXPECT_EQ(p.rec.captures(), 1);
  EXPECT_EQ(p.rec.replays(), 3);

  // 1 row: bucket 1; 2 rows: bucket 2; 3 rows again: bucket 4's graph is reused.
  advance(p, ptrs(0, 1), step_both(p, decode(ptrs(0, 1))));
  advance(p, ptrs(1, 3), step_both(p, decode(ptrs(1, 3))));
  advance(p, ptrs(0, 3), step_both(p, decode(ptrs(0, 3))));
  EXPECT_EQ(p.rec.captures(), 3);
  EXPECT_EQ(p.rec.replays(), 6);
  EXPECT_EQ(p.rec.drops(), 0);

  // 5 more sequences prefilled together: a larger step than any before grows the scratch, so
  // every graph is dropped; 3 rows (bucket 4, captured before) and then 8 rows (bucket 8) are
  // captured again.
  advance(p, ptrs(3, 8), step_both(p, prefill(ptrs(3, 8))));
  EXPECT_EQ(p.rec.captures(), 3);
  advance(p, ptrs(0, 3), step_both(p, decode(ptrs(0, 3))));
  EXPECT_EQ(p.rec.drops(), 1);
  EXPECT_EQ(p.rec.captures(), 4);
  // Bucket 8's warm-up grows the head's slots (8 rows; no step before had more than 5 logit
  // rows): bucket 4's new graph is dropped too, and captured once more after.
  for (int s = 0; s < 2; ++s) advance(p, ptrs(0, 8), step_both(p, decode(ptrs(0, 8))));
  EXPECT_EQ(p.rec.captures(), 5);
  EXPECT_EQ(p.rec.drops(), 2);
  EXPECT_EQ(p.rec.live_graphs(), 1);
  advance(p, ptrs(2, 5), step_both(p, decode(ptrs(2, 5))));
  advance(p, ptrs(2, 5), step_both(p, decode(ptrs(2, 5))));
  EXPECT_EQ(p.rec.captures(), 6);
  EXPECT_EQ(p.rec.live_graphs(), 2);  // buckets 8 and 4
  EXPECT_EQ(p.rec.replays(), 11);

  // A step mixing a decode token and a prefill chunk runs eagerly.
  ForwardBatch mixed;
  mixed.clear();
  Seq extra = make_seq(8, 3);
  mixed.add_chunk(seqs[0].tokens.data(), static_cast<int64_t>(seqs[0].tokens.size()) - 1, 1, seqs[0].table,
                  kBlockSize, true);
  mixed.add_chunk(extra.tokens.data(), 0, 3, extra.table, kBlockSize, true);
  step_both(p, mixed);
  EXPECT_EQ(p.rec.captures(), 6);
  EXPECT_EQ(p.rec.replays(), 11);
}

// A new KV cache (shardlm bench runs each scenario on its own) drops the graphs, which hold the old
// cache's pointers: the next decode step captures again and still gives the eager bits.
TEST(DecodeGraphs, NewKvCacheDropsTheGraphs) {
  Pair p("tiny-llama");
  for (int round = 0; round < 2; ++round) {
    for (Model* m : {p.eager.get(), p.graphed.get()}) m->allocate_kv_cache(16LL << 20, kBlockSize, 2 * kBlocksPerSeq);
    Seq a = make_seq(0, 5), b = make_seq(1, 3 + round);
    std::vector<Seq*> both = {&a, &b};
    advance(p, both, step_both(p, prefill(both)));
    for (int s = 0; s < 2; ++s) advance(p, both, step_both(p, decode(both)));
  }
  EXPECT_EQ(p.rec.captures(), 2);
  EXPECT_EQ(p.rec.drops(), 1);
  EXPECT_EQ(p.rec.replays(), 4);
}

// Rows that do not all sample (a prefill chunk of one token that wants no logits) run eagerly.
TEST(DecodeGraphs, RowsWithoutLogitsRunEagerly) {
  Pair p("tiny-llama");
  for (Model* m : {p.eager.get(), p.graphed.get()}) m->allocate_kv_cache(16LL << 20, kBlockSize, 2 * kBlocksPerSeq);
  Seq a = make_seq(0, 1), b = make_seq(1, 1);
  ForwardBatch batch;
  batch.clear();
  batch.add_chunk(a.tokens.data(), 0, 1, a.table, kBlockSize, true);
  batch.add_chunk(b.tokens.data(), 0, 1, b.table, kBlockSize, false);
  step_both(p, batch);
  EXPECT_EQ(p.rec.captures(), 0);
  EXPECT_EQ(p.rec.replays(), 0);
}

TEST(DecodeGraphs, CpuBackendCannotCapture) {
  const std::string dir = model_dir("tiny-llama");
  const ModelSpec spec = ModelSpec::load(dir);
  auto ckpt = Checkpoint::open(dir);
  auto cpu = make_backend("cpu");
  auto model = build_model(spec, *ckpt, *cpu);
  EXPECT_NE(model->enable_step_graphs().find("cannot capture"), std::string::npos);
  EXPECT_THROW(cpu->begin_capture(), Error);
}

// MoE models capture too: the routing stays in backend memory (grouped_linear_routed), a padding
// row routes to no expert, and the per-expert token counts are added up there. Logits and counts
// must be the eager run's exactly: Mixtral's softmax top-2, Qwen2-MoE's shared expert with its
// gate, DeepSeek-V3's sigmoid group-limited routing with dense first layers and MLA.
TEST(DecodeGraphs, MoeModelsCaptureWithTheEagerBitsAndCounts) {
  for (const char* config : {"tiny-mixtral", "tiny-qwen2-moe", "tiny-deepseek-v3"}) {
    SCOPED_TRACE(config);
    Pair p(config);
    for (Model* m : {p.eager.get(), p.graphed.get()}) m->allocate_kv_cache(64LL << 20, kBlockSize, 6 * kBlocksPerSeq);
    std::vector<Seq> seqs;
    for (int i = 0; i < 5; ++i) seqs.push_back(make_seq(i, 4 + 3 * i));
    std::vector<Seq*> all, three;
    for (Seq& s : seqs) all.push_back(&s);
    three.assign(all.begin(), all.begin() + 3);
    auto counts = [](Model& m) {
      const MoeStepStats* st = m.last_step_moe();
      return st ? st->expert_tokens : std::vector<int64_t>{};
    };
    advance(p, all, step_both(p, prefill(all)));
    // 5 rows (bucket 8: three padding rows), then 3 (bucket 4: one), a few steps each.
    for (const auto* batch : {&all, &three}) {
      for (int s = 0; s < 3; ++s) {
        advance(p, *batch, step_both(p, decode(*batch)));
        const std::vector<int64_t> want = counts(*p.eager), got = counts(*p.graphed);
        ASSERT_FALSE(want.empty());
        EXPECT_EQ(got, want) << batch->size() << " rows, step " << s;
      }
    }
    EXPECT_EQ(p.rec.captures(), 2);
    EXPECT_EQ(p.rec.replays(), 6);
  }
}

// With bf16 twins asked for (as the CUDA backend asks for them), every linear given one finds it
// equal to its rows' rounding when it runs, eager or replayed, and the logits keep the CPU's bits
// (the CPU's GEMMs read the fp32 rows). A dense model's prefill step gives twins to each layer's
// q/k/v, gate/up and down projections and to the LM head: 3 x layers + 1 linears.
TEST(DecodeGraphs, EveryTwinALinearReadsIsItsRowsRounding) {
  for (const char* config : {"tiny-llama", "tiny-qwen2", "tiny-deepseek-v3", "tiny-qwen2-moe"}) {
    SCOPED_TRACE(config);
    Pair p(config);
    p.rec.set_twins(true);
    for (Model* m : {p.eager.get(), p.graphed.get()}) m->allocate_kv_cache(64LL << 20, kBlockSize, 6 * kBlocksPerSeq);
    std::vector<Seq> seqs;
    for (int i = 0; i < 3; ++i) seqs.push_back(make_seq(i, 5 + 2 * i));
    std::vector<Seq*> all;
    for (Seq& s : seqs) all.push_back(&s);
    advance(p, all, step_both(p, prefill(all)));
    if (!p.spec.moe.enabled()) {  // q/k/v, o_proj, gate/up and down a layer, and the LM head
      EXPECT_EQ(p.rec.twin_linears(), 4 * p.spec.num_layers + 1);
    }
    const int64_t prefill_twins = p.rec.twin_linears();
    EXPECT_GT(prefill_twins, 0);
    for (int s = 0; s < 3; ++s) advance(p, all, step_both(p, decode(all)));
    EXPECT_GT(p.rec.replays(), 0);
    EXPECT_GT(p.rec.twin_linears(), prefill_twins);
    EXPECT_EQ(p.rec.stale_twins(), 0);
  }
}

TEST(DecodeGraphs, RecorderRefusesAllocationWhileCapturing) {
  test::RecordingBackend rec;
  void* p = rec.alloc(16);
  rec.begin_capture();
  EXPECT_THROW(rec.alloc(16), Error);
  EXPECT_THROW(rec.free(p), Error);
  float host = 0;
  EXPECT_THROW(rec.copy_to_host(&host, p, sizeof host), Error);
  // A recorded op runs at replay, not before.
  const float one = 1.0f;
  rec.copy_to_device(p, &one, sizeof one);
  const int64_t g = rec.end_capture();
  rec.copy_to_host(&host, p, sizeof host);
  EXPECT_NE(host, 1.0f);
  rec.replay(g);
  rec.copy_to_host(&host, p, sizeof host);
  EXPECT_EQ(host, 1.0f);
  rec.free(p);
}

// ---- Engine level: whole runs, greedy and sampled ----

std::vector<ParsedRequest> requests(int n, int first_len, int max_tokens) {
  std::vector<ParsedRequest> reqs;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> ids;
    for (int k = 0; k < first_len + 3 * i; ++k) ids.push_back(static_cast<int32_t>((i * 53 + k * 29 + 1) % 500));
    // Lengths differ so that the batch shrinks as requests finish: the bucket changes.
    ParsedRequest r = test::ids_request("r" + std::to_string(i), ids, max_tokens + 2 * i);
    r.overrides.ignore_eos = true;
    if (i % 2) {
      r.overrides.temperature = 0.9;
      r.overrides.seed = 100 + i;
    }
    reqs.push_back(std::move(r));
  }
  return reqs;
}

void expect_same_results(const test::CollectSink& a, const test::CollectSink& b) {
  ASSERT_EQ(a.results.size(), b.results.size());
  for (const RequestResult& r : a.results) {
    const RequestResult& g = b.by_id(r.id);
    EXPECT_TRUE(r.error.empty() && g.error.empty()) << r.error << g.error;
    EXPECT_EQ(r.output_tokens, g.output_tokens) << r.id;
    ASSERT_EQ(r.token_logprobs.size(), g.token_logprobs.size()) << r.id;
    for (size_t i = 0; i < r.token_logprobs.size(); ++i)
      EXPECT_EQ(r.token_logprobs[i], g.token_logprobs[i]) << r.id << " token " << i;
  }
}

test::CollectSink run(Model& model, const Tokenizer& tok, std::vector<ParsedRequest> reqs, EngineConfig cfg) {
  cfg.progress_interval_s = 0;
  cfg.kv_cache_bytes = 32LL << 20;
  Engine engine(model, tok, cfg);
  test::VectorSource src(std::move(reqs));
  test::CollectSink sink;
  engine.run(src, sink);
  return sink;
}

class DecodeGraphsEngine : public ::testing::TestWithParam<int> {};

// Batches of 1, 3 (padded to 4) and 5 (padded to 8) sequences, half greedy, half sampled.
TEST_P(DecodeGraphsEngine, SameTokensAndLogprobsAsEager) {
  const int n = GetParam();
  for (const char* config : {"tiny-llama", "tiny-qwen2", "tiny-mixtral", "tiny-deepseek-v3"}) {
    Pair p(config);
    auto tok = Tokenizer::load(p.dir);
    EngineConfig cfg;
    cfg.scheduler.block_size = 8;
    const auto a = run(*p.eager, *tok, requests(n, 6, 12), cfg);
    const auto b = run(*p.graphed, *tok, requests(n, 6, 12), cfg);
    expect_same_results(a, b);
    EXPECT_GT(p.rec.replays(), 0) << config;
    EXPECT_GE(p.rec.captures(), 1) << config;
  }
}

INSTANTIATE_TEST_SUITE_P(Batch, DecodeGraphsEngine, ::testing::Values(1, 3, 5));

// Sequences admitted while others decode (max_seqs 2, prompts growing): mixed steps run eagerly,
// a longer prompt than any before grows the scratch and the graphs are captured again.
TEST(DecodeGraphs, EngineAdmissionsAndRecaptureMatchEager) {
  Pair p("tiny-llama");
  auto tok = Tokenizer::load(p.dir);
  EngineConfig cfg;
  cfg.scheduler.block_size = 8;
  cfg.scheduler.max_seqs = 2;
  std::vector<ParsedRequest> reqs = requests(5, 4, 6);
  const auto a = run(*p.eager, *tok, reqs, cfg);
  const auto b = run(*p.graphed, *tok, reqs, cfg);
  expect_same_results(a, b);
  EXPECT_GE(p.rec.drops(), 1);
  EXPECT_GT(p.rec.captures(), 2);
}

}  // namespace
}  // namespace shardlm
