// --backend cuda end to end against the CPU backend on the same weights and prompts. With fp32
// checkpoints the GPU runs fp32 GEMMs (no TF32), so the tokens must be the CPU's and the logprobs
// within the layout tolerance; bf16 checkpoints run bf16 GEMMs on the GPU (fp32 activations on the
// CPU), so there only the greedy first tokens are compared. On one rank the tokens are chosen on
// the device (ComputeBackend::sample on the logits the LM head left there), so these comparisons
// cover device sampling against the CPU backend's host Sampler too. Every test skips without a GPU.
#include <gtest/gtest.h>

#include <filesystem>
#include <iomanip>
#include <map>
#include <memory>
#include <sstream>
#include <regex>
#include <string>
#include <utility>

#include "common/bench_report.h"
#include "common/cli_runner.h"
#include "common/gpu.h"
#include "common/h5_read.h"
#include "common/layout_check.h"
#include "common/shared_data.h"
#include "common/test_files.h"
#include "e2e/cuda_e2e.h"
#include "model/checkpoint.h"

namespace fs = std::filesystem;

namespace shardlm {
namespace {

using test::make_model;
using test::Proc;
using test::sh;
using test::shardlm_bin;

constexpr int kPrompts = test::kCudaE2ePrompts;

std::vector<std::string> check_runs(const std::string& model, const std::vector<test::LayoutRun>& runs,
                                    bool long_prompts, const std::string& tag) {
  return test::check_layout_runs(model, runs, long_prompts, tag, "", kPrompts);
}

TEST(CudaBackend, Stories260kMatchesCpu) {
  SHARDLM_REQUIRE_GPU();
  SHARDLM_REQUIRE_SHARED(model, "models/stories260K");
  // One rank on the GPU, then two ranks sharing it (tensor and pipeline parallel, MPI or
  // libfabric staged through host memory).
  std::vector<test::LayoutRun> runs = {{1, "--backend cuda"},
                                       {2, "--backend cuda --tp 2 --comm mpi"},
                                       {2, "--backend cuda --pp 2 --comm mpi"}};
#ifdef SHARDLM_HAVE_LIBFABRIC
  runs.push_back({2, "--backend cuda --tp 2 --comm fabric"});
#endif
  check_runs(model, runs, true, "cuda-stories260k");
}

// /ranks says how much device memory each rank had in use at the end (the device's total less its
// free): at least its weights and KV cache, at most the device; the CPU backend has none, and the
// report shows the column only where a rank had a device.
TEST(CudaBackend, RanksRecordTheDeviceMemoryInUse) {
  SHARDLM_REQUIRE_GPU();
  const fs::path d = test::fresh_dir("cuda-device-used");
  test::write_file(d / "p.jsonl", "{\"id\": \"a\", \"prompt_token_ids\": [1, 2, 3], \"max_tokens\": 4}\n");
  const std::string common = " run --model " + make_model("tiny-llama", "fp32") + " --prompts " +
                             (d / "p.jsonl").string() + " -q --kv-cache-gb 0.01 --out ";
  Proc gpu = sh(shardlm_bin() + common + (d / "gpu.h5").string() + " --backend cuda");
  Proc cpu = sh(shardlm_bin() + common + (d / "cpu.h5").string());
  ASSERT_EQ(gpu.code, 0) << gpu.out;
  ASSERT_EQ(cpu.code, 0) << cpu.out;
  test::H5Reader hg(d / "gpu.h5"), hc(d / "cpu.h5");
  const auto used = hg.scalars<int64_t>("/ranks/device_used_bytes", H5T_NATIVE_INT64);
  const auto weights = hg.scalars<int64_t>("/ranks/device_weight_bytes", H5T_NATIVE_INT64);
  ASSERT_EQ(used.size(), 1u);
  ASSERT_EQ(weights.size(), 1u);
  EXPECT_GT(weights[0], 0);
  EXPECT_GE(used[0], weights[0] + int64_t{10} * 1000 * 1000) << "weights and the 0.01 GB KV cache at least";
  EXPECT_EQ(hc.scalars<int64_t>("/ranks/device_used_bytes", H5T_NATIVE_INT64), std::vector<int64_t>{0});
  // The GPU each rank ran on (one rank on a one-GPU host: device 0); none on the CPU backend.
  EXPECT_EQ(hg.scalars<int32_t>("/ranks/device", H5T_NATIVE_INT32), std::vector<int32_t>{0});
  EXPECT_EQ(hc.scalars<int32_t>("/ranks/device", H5T_NATIVE_INT32), std::vector<int32_t>{-1});
  Proc report = sh(shardlm_bin() + " report " + (d / "gpu.h5").string());
  ASSERT_EQ(report.code, 0) << report.out;
  EXPECT_NE(report.out.find("dev used"), std::string::npos) << report.out;
  Proc cpu_report = sh(shardlm_bin() + " report " + (d / "cpu.h5").string());
  EXPECT_EQ(cpu_report.out.find("dev used"), std::string::npos) << cpu_report.out;
}

TEST(CudaBackend, DenseArchitecturesMatchCpu) {
  SHARDLM_REQUIRE_GPU();
  for (const char* config : {"tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-mistral"}) {
    check_runs(make_model(config, "fp32"), {{1, "--backend cuda"}}, true, std::string("cuda-") + config);
  }
}

TEST(CudaBackend, MoeAndMlaMatchCpu) {
  SHARDLM_REQUIRE_GPU();
  check_runs(make_model("tiny-mixtral", "fp32"), {{1, "--backend cuda"}, {2, "--backend cuda --dp 2 --ep 2"}}, false,
             "cuda-mixtral");
  check_runs(make_model("tiny-deepseek-v3", "fp32"), {{1, "--backend cuda"}, {2, "--backend cuda --tp 2 --comm mpi"}},
             true, "cuda-deepseek-v3");
  check_runs(make_model("tiny-qwen2-moe", "fp32"), {{1, "--backend cuda"}}, false, "cuda-qwen2-moe");
}

// NCCL refuses two ranks of one communicator on one GPU: a run of n ranks over --comm nccl needs n
// GPUs (over the emulated runtime, n emulated ones: 8 by default).
#ifdef SHARDLM_HAVE_CUDA
#define SHARDLM_REQUIRE_GPU_PER_RANK(n)                                                           \
  do {                                                                                           \
    SHARDLM_REQUIRE_GPU();                                                                       \
    if (cuda::device_count() < (n))                                                              \
      GTEST_SKIP() << "--comm nccl with " << (n) << " ranks needs a GPU per rank; this host has " \
                   << cuda::device_count();                                                      \
  } while (0)
#else
#define SHARDLM_REQUIRE_GPU_PER_RANK(n) SHARDLM_REQUIRE_GPU()
#endif

// --comm nccl: the activations of the tp and pp groups (stories260K) and the MoE all-to-all of the
// ep group (Mixtral, dp 2 x ep 2) travel through NCCL on device buffers; with the CPU backend every
// buffer is host memory and takes the communicator's MPI path. NCCL refuses two ranks of one
// communicator on one GPU, so this needs a GPU per rank: over the emulated runtime every rank has
// its own emulated GPU (kernels/cuda_emu/nccl.h); a one-GPU machine skips it.
TEST(CudaBackend, NcclLayoutsMatchCpu) {
  SHARDLM_REQUIRE_GPU_PER_RANK(2);
  SHARDLM_REQUIRE_SHARED(model, "models/stories260K");
  check_runs(
      model,
      {{2, "--backend cuda --tp 2 --comm nccl"}, {2, "--backend cuda --pp 2 --comm nccl"}, {2, "--tp 2 --comm nccl"}},
      true, "nccl-stories260k");
  check_runs(make_model("tiny-mixtral", "fp32"), {{2, "--backend cuda --dp 2 --ep 2 --comm nccl"}}, false,
             "nccl-mixtral");
}

// Steps each rank ran by a graph replay (/ranks/graph_steps), in world-rank order.
std::vector<int64_t> graph_steps(const std::string& h5) {
  return test::H5Reader(h5).scalars<int64_t>("/ranks/graph_steps", H5T_NATIVE_INT64);
}

// --cuda-graphs with tp over NCCL: each tp rank captures its decode steps with the layers' NCCL
// all-reduces queued on the captured stream, and replays them in step with the others; the tokens
// and logprobs must be the eager run's, for stories260K and for DeepSeek-V3 (MLA, MoE, fp8). Over
// MPI the tp all-reduce cannot be captured: the run says so and runs eagerly.
TEST(CudaBackend, CudaGraphsWithTpOverNcclMatchEager) {
  SHARDLM_REQUIRE_GPU_PER_RANK(2);
  SHARDLM_REQUIRE_SHARED(stories, "models/stories260K");
  const fs::path d = test::fresh_dir("cuda-graphs-tp");
  test::write_layout_prompts(d / "p.jsonl", kPrompts, true);
  const std::string common = " run --model " + stories + " --prompts " + (d / "p.jsonl").string() +
                             " --threads 1 --seed 3 --max-seqs 5 --max-batch-tokens 48 --backend cuda --tp 2";
  Proc eager = sh(test::mpirun(2) + shardlm_bin() + common + " --comm nccl -q --out " + (d / "eager.h5").string());
  Proc graphs = sh(test::mpirun(2) + shardlm_bin() + common +
                   " --comm nccl --cuda-graphs --progress-interval 0 --out " + (d / "graphs.h5").string());
  ASSERT_EQ(eager.code, 0) << eager.out;
  ASSERT_EQ(graphs.code, 0) << graphs.out;
  EXPECT_NE(graphs.out.find("(CUDA graphs)"), std::string::npos) << graphs.out;
  EXPECT_EQ(graphs.out.find("every step runs eagerly"), std::string::npos) << graphs.out;
  test::expect_same_run(test::read_run((d / "eager.h5").string()), test::read_run((d / "graphs.h5").string()),
                        "cuda graphs tp 2 over nccl");
  for (int64_t n : graph_steps((d / "graphs.h5").string())) EXPECT_GT(n, 0);
  for (int64_t n : graph_steps((d / "eager.h5").string())) EXPECT_EQ(n, 0);
  {
    test::H5Reader h(d / "graphs.h5");
    EXPECT_EQ(h.scalar_attr<int64_t>("cuda_graphs", H5T_NATIVE_INT64), 1);
    EXPECT_FALSE(h.has_attr("cuda_graphs_not_used"));
  }
  // DeepSeek-V3 with its experts kept fp8, as one node runs it (tp over NCCL): each tp rank routes
  // every token to its slices of the experts on the device, inside the graph.
  // (Four short prompts finishing at different steps, for CI's time.)
  const std::string ds = make_model("tiny-deepseek-v3", "fp8");
  test::write_layout_prompts(d / "ds.jsonl", 4, false);
  const std::string ds_common = " run --model " + ds + " --prompts " + (d / "ds.jsonl").string() +
                                " --threads 1 --seed 3 --max-seqs 5 --max-batch-tokens 48 --backend cuda --tp 2 "
                                "--comm nccl -q --out ";
  Proc ds_eager = sh(test::mpirun(2) + shardlm_bin() + ds_common + (d / "ds-eager.h5").string());
  Proc ds_graphs = sh(test::mpirun(2) + shardlm_bin() + ds_common + (d / "ds-graphs.h5").string() + " --cuda-graphs");
  ASSERT_EQ(ds_eager.code, 0) << ds_eager.out;
  ASSERT_EQ(ds_graphs.code, 0) << ds_graphs.out;
  test::expect_same_run(test::read_run((d / "ds-eager.h5").string()), test::read_run((d / "ds-graphs.h5").string()),
                        "cuda graphs tp 2 over nccl, deepseek-v3 fp8");
  for (int64_t n : graph_steps((d / "ds-graphs.h5").string())) EXPECT_GT(n, 0);
  test::write_file(d / "one.jsonl", "{\"id\": \"a\", \"prompt_token_ids\": [1, 403], \"max_tokens\": 2}\n");
  Proc mpi =
      sh(test::mpirun(2) + shardlm_bin() + " run --model " + stories + " --prompts " + (d / "one.jsonl").string() +
         " --backend cuda --tp 2 --comm mpi --cuda-graphs --max-batch-tokens 16 --max-seqs 2 --out " +
         (d / "mpi.h5").string());
  ASSERT_EQ(mpi.code, 0) << mpi.out;
  EXPECT_NE(mpi.out.find("every step runs eagerly: graphs with tp need --comm nccl"), std::string::npos) << mpi.out;
  // The file records what ran, not what was asked.
  test::H5Reader h(d / "mpi.h5");
  EXPECT_EQ(h.scalar_attr<int64_t>("cuda_graphs", H5T_NATIVE_INT64), 0);
  EXPECT_EQ(h.string_attr("cuda_graphs_not_used").rfind("graphs with tp need --comm nccl", 0), 0u)
      << h.string_attr("cuda_graphs_not_used");
}

// Steps each rank replayed and then redid eagerly (/ranks/graph_reruns).
std::vector<int64_t> graph_reruns(const std::string& h5) {
  return test::H5Reader(h5).scalars<int64_t>("/ranks/graph_reruns", H5T_NATIVE_INT64);
}

// --cuda-graphs with ep over NCCL (arch/expert_exchange.h): the MoE layers' all-to-alls are
// captured with blocks of a fixed size, and the ranks of the ep group, whose dp groups schedule
// their own batches, agree on each step's bucket. The tokens and logprobs must be the eager
// run's bit for bit (the exchange sums the same unsummed pairs in the same order, and eager
// decode steps take the same routed GEMMs), for Mixtral over pp 2 x dp 2 (ep 2 on each stage) and
// for DeepSeek-V3 with its experts fp8 over tp 2 x dp 2 (ep 4: each tp rank sends its share of the
// tokens), Kimi K2 fp8 over dp 4 and Qwen2-MoE over tp 2 x ep 2, and DeepSeek-V3 again with its
// rows on a bf16 wire. With blocks too small for the routing
// (--ep-graph-capacity 0.3) steps overflow: every rank of the group redoes the same steps eagerly (a later stage from
// the hidden states it received for the replay), and the result is still the eager one. Over MPI nothing can be queued
// on the stream: the run says so and runs eagerly.
TEST(CudaBackend, CudaGraphsWithEpOverNcclMatchEager) {
  SHARDLM_REQUIRE_GPU_PER_RANK(4);
  const fs::path d = test::fresh_dir("cuda-graphs-ep");
  test::write_layout_prompts(d / "p.jsonl", 6, false);
  auto check = [&](const std::string& model, int np, const std::string& layout, const std::string& name) {
    const std::string common = test::mpirun(np) + shardlm_bin() + " run --model " + model + " --prompts " +
                               (d / "p.jsonl").string() +
                               " --threads 1 --seed 3 --max-seqs 5 --max-batch-tokens 48 --backend cuda --comm nccl "
                               "--comm-timeout 120 -q " +
                               layout + " --out ";
    const std::string eager_out = (d / (name + "-eager.h5")).string(),
                      graphs_out = (d / (name + "-graphs.h5")).string(),
                      small_out = (d / (name + "-small.h5")).string();
    Proc eager = sh(common + eager_out);
    Proc graphs = sh(common + graphs_out + " --cuda-graphs");
    Proc small = sh(common + small_out + " --cuda-graphs --ep-graph-capacity 0.3");
    ASSERT_EQ(eager.code, 0) << eager.out;
    ASSERT_EQ(graphs.code, 0) << graphs.out;
    ASSERT_EQ(small.code, 0) << small.out;
    EXPECT_EQ(graphs.out.find("every step runs eagerly"), std::string::npos) << graphs.out;
    const test::RunOutput want = test::read_run(eager_out);
    for (const std::string& out : {graphs_out, small_out}) {
      const test::RunOutput got = test::read_run(out);
      test::expect_same_run(want, got, name + " " + out);
      EXPECT_EQ(want.logprobs, got.logprobs) << name << " " << out << ": logprobs not bit-identical";
    }
    for (int64_t n : graph_steps(graphs_out)) EXPECT_GT(n, 0) << name;
    for (int64_t n : graph_reruns(graphs_out)) EXPECT_EQ(n, 0) << name << ": default blocks overflowed";
    // Each stage's ep group redoes the same steps; another stage's group decides for itself.
    const std::vector<int64_t> reruns = graph_reruns(small_out);
    const std::vector<int32_t> stage = test::H5Reader(small_out).scalars<int32_t>("/ranks/pp", H5T_NATIVE_INT32);
    ASSERT_EQ(reruns.size(), static_cast<size_t>(np));
    ASSERT_EQ(stage.size(), static_cast<size_t>(np));
    for (int q = 0; q < np; ++q) {
      EXPECT_GT(reruns[q], 0) << name << ": blocks of 0.3 x the mean never overflowed on rank " << q;
      for (int r = 0; r < np; ++r) {
        if (stage[r] == stage[q]) {
          EXPECT_EQ(reruns[r], reruns[q]) << name << ": ranks " << q << " and " << r;
        }
      }
    }
  };
  check(make_model("tiny-mixtral", "fp32"), 4, "--pp 2 --dp 2 --ep 2", "mixtral-pp2-dp2-ep2");
  check(make_model("tiny-deepseek-v3", "fp8"), 4, "--tp 2 --dp 2 --ep 4", "deepseek-tp2-dp2-ep4");
  // Kimi K2's top-8 over 6 experts a rank: the blocks hold several times an owner's usual rows, and
  // the expert GEMMs must still be chosen on the usual load (the direct fp8 kernel), not on the
  // blocks (the W8A8 GEMM, other numerics).
  check(make_model("tiny-kimi-k2", "fp8"), 4, "--dp 4 --ep 4", "kimi-dp4-ep4");
  // Qwen2-MoE's gated shared expert over tp 2: each tp rank adds its partial sum of it to its share
  // of the routed sums before the tp all-reduce, so a token must be routed by the same tp rank in
  // the padded graph step as in the eager step (the shares are of the real rows).
  check(make_model("tiny-qwen2-moe", "fp32"), 2, "--tp 2 --ep 2", "qwen2moe-tp2-ep2");
  // Rows on a bf16 wire (--ep-wire bf16): the captured dispatch rounds its records' rows and sends
  // their int32 meta whole; the graphs must round exactly what the eager exchange rounds.
  check(make_model("tiny-deepseek-v3", "fp8"), 4, "--tp 2 --dp 2 --ep 4 --ep-wire bf16", "deepseek-tp2-dp2-ep4-bf16");
  // And on an fp8 wire: the captured dispatch quantises its records' rows (a scale per 128 values)
  // and sends the meta whole, the combine rounds to bf16.
  check(make_model("tiny-mixtral", "fp32"), 2, "--dp 2 --ep 2 --ep-wire fp8", "mixtral-dp2-ep2-fp8");
  test::write_file(d / "one.jsonl", "{\"id\": \"a\", \"prompt_token_ids\": [1, 403], \"max_tokens\": 2}\n");
  Proc mpi = sh(test::mpirun(2) + shardlm_bin() + " run --model " + make_model("tiny-mixtral", "fp32") + " --prompts " +
                (d / "one.jsonl").string() +
                " --backend cuda --dp 2 --ep 2 --comm mpi --cuda-graphs --max-batch-tokens 16 --max-seqs 2 --out " +
                (d / "mpi.h5").string());
  ASSERT_EQ(mpi.code, 0) << mpi.out;
  EXPECT_NE(mpi.out.find("every step runs eagerly: graphs with ep need --comm nccl"), std::string::npos) << mpi.out;
}

// --cuda-graphs with pp: each stage replays its own graph of the step's bucket, the hidden states
// passing between stages outside the graphs; the tokens and logprobs must be the eager run's, and
// every rank must have replayed steps. Over MPI (2 ranks sharing one GPU, staged through host
// memory), and tp 2 x pp 2 over NCCL (a GPU per rank), whose stages' graphs hold the tp all-reduces.
TEST(CudaBackend, CudaGraphsWithPpMatchEager) {
  SHARDLM_REQUIRE_GPU();
  SHARDLM_REQUIRE_SHARED(stories, "models/stories260K");
  const fs::path d = test::fresh_dir("cuda-graphs-pp");
  test::write_layout_prompts(d / "p.jsonl", kPrompts, true);
  const std::string common = " run --model " + stories + " --prompts " + (d / "p.jsonl").string() +
                             " --threads 1 --seed 3 --max-seqs 5 --max-batch-tokens 48 --backend cuda";
  auto check = [&](int np, const std::string& layout, const std::string& name) {
    const std::string eager_out = (d / (name + "-eager.h5")).string(), graphs_out = (d / (name + "-graphs.h5")).string();
    Proc eager = sh(test::mpirun(np) + shardlm_bin() + common + layout + " -q --out " + eager_out);
    Proc graphs =
        sh(test::mpirun(np) + shardlm_bin() + common + layout + " --cuda-graphs --progress-interval 0 --out " + graphs_out);
    ASSERT_EQ(eager.code, 0) << eager.out;
    ASSERT_EQ(graphs.code, 0) << graphs.out;
    EXPECT_NE(graphs.out.find("(CUDA graphs)"), std::string::npos) << graphs.out;
    EXPECT_EQ(graphs.out.find("every step runs eagerly"), std::string::npos) << graphs.out;
    test::expect_same_run(test::read_run(eager_out), test::read_run(graphs_out), "cuda graphs " + name);
    const std::vector<int64_t> replayed = graph_steps(graphs_out);
    EXPECT_EQ(replayed.size(), static_cast<size_t>(np));
    for (int64_t n : replayed) EXPECT_GT(n, 0) << name;
    for (int64_t n : graph_steps(eager_out)) EXPECT_EQ(n, 0) << name;
  };
  check(2, " --pp 2 --comm mpi", "pp2-mpi");
#ifdef SHARDLM_HAVE_CUDA
  if (cuda::device_count() >= 4) check(4, " --tp 2 --pp 2 --comm nccl", "tp2-pp2-nccl");
#endif
}

// Profile steps larger than the memory left beside the weights fail at start, naming the limits
// that size them and the allocation that failed. Needs a device small enough to fill: the emulated
// runtime's (skips on a GPU).
TEST(CudaBackend, ProfileStepsTooLargeFailNamingTheLimits) {
  SHARDLM_REQUIRE_GPU();
#ifndef SHARDLM_EMULATED_BINARY
  GTEST_SKIP() << "needs the emulated runtime's small device (SHARDLM_EMULATED_GPU_MEMORY_MIB)";
#else
  const fs::path d = test::fresh_dir("cuda-profile-oom");
  test::write_file(d / "p.jsonl", "{\"id\": \"a\", \"prompt_token_ids\": [1, 2], \"max_tokens\": 2}\n");
  Proc p = sh("SHARDLM_EMULATED_GPU_MEMORY_MIB=16 " + shardlm_bin() + " run --model " +
              make_model("tiny-llama", "fp32") + " --prompts " + (d / "p.jsonl").string() +
              " --backend cuda --max-batch-tokens 200000 --max-seqs 4" + " --out " + (d / "o.h5").string());
  EXPECT_NE(p.code, 0) << p.out;
  EXPECT_NE(p.out.find("the profile steps, the largest a step can be (4096 tokens by --max-batch-tokens, 4 sequences "
                       "by --max-seqs), do not fit beside the weights"),
            std::string::npos)
      << p.out;
  EXPECT_NE(p.out.find("cudaMalloc of "), std::string::npos) << p.out;
#endif
}

// --kv-cache-gb auto on a GPU: every rank first runs the profile steps (the largest step
// --max-batch-tokens and --max-seqs allow), then the budget is --kv-cache-free-fraction of the
// device memory free, and the cache holds as many blocks as fit in it (up to the context cap); the
// tokens are those of a fixed budget. Over the emulated runtime the device has 8 MiB
// (SHARDLM_EMULATED_GPU_MEMORY_MIB), so the budget, not the cap, sets the block count; on a real
// GPU the same checks hold with its own memory.
TEST(CudaBackend, KvCacheAutoBudgetTakesTheFreeMemoryShare) {
  SHARDLM_REQUIRE_GPU();
  SHARDLM_REQUIRE_SHARED(stories, "models/stories260K");
#ifdef SHARDLM_EMULATED_BINARY
  const std::string env = "SHARDLM_EMULATED_GPU_MEMORY_MIB=8 ";
  const double device_bytes = 8.0 * (1 << 20);
#else
  const std::string env;
  const double device_bytes = 0;  // the device's own: only the relations below are checked
#endif
  const fs::path d = test::fresh_dir("cuda-kv-auto");
  test::write_layout_prompts(d / "p.jsonl", kPrompts / 2, true);
  const std::string base = " run --model " + stories + " --prompts " + (d / "p.jsonl").string() +
                           " --threads 1 --seed 3 --backend cuda --kv-dtype fp32";
  // 64 tokens a step over up to 8 sequences: the profile steps are 64 tokens, then 8 decode tokens.
  const std::string common = base + " --max-batch-tokens 64 --max-seqs 8";
  // stories260K, fp32 cache: 5 layers x (K + V) x 4 KV heads x 8 dims x 4 bytes, 16 tokens a block.
  const int64_t block_bytes = 5 * 2 * 4 * 8 * 4 * 16;
  std::map<std::string, std::pair<int64_t, int64_t>> blocks_and_budget;
  for (const char* fraction : {"0.25", "0.5"}) {
    const std::string out = (d / (std::string("auto-") + fraction + ".h5")).string();
    Proc r = sh(env + shardlm_bin() + common + " --kv-cache-free-fraction " + fraction + " --out " + out);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find(std::string("auto: ") + fraction + " of the "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(" free after loading and the profile steps (64 tokens, "), std::string::npos) << r.out;
    test::H5Reader h(out);
    const auto blocks = h.scalar_attr<int64_t>("kv_cache_blocks", H5T_NATIVE_INT64);
    const auto budget = h.scalar_attr<int64_t>("kv_cache_budget_bytes", H5T_NATIVE_INT64);
    EXPECT_EQ(h.scalar_attr<int64_t>("kv_cache_profile_tokens", H5T_NATIVE_INT64), 64);
    // The activation scratch alone: 64 rows of the hidden state in three slots.
    EXPECT_GE(h.scalar_attr<int64_t>("kv_cache_profile_bytes", H5T_NATIVE_INT64), 3 * 64 * 64 * 4);
    EXPECT_GE(blocks, 1);
    EXPECT_LE(blocks * block_bytes, budget) << fraction;
    if (device_bytes > 0) {  // the budget set the count: the weights and scratch take under 2 MiB
      EXPECT_EQ(blocks, budget / block_bytes) << fraction;
      EXPECT_LE(budget, std::stod(fraction) * device_bytes) << fraction;
      EXPECT_GE(budget, std::stod(fraction) * (device_bytes - 2.0 * (1 << 20))) << fraction;
    }
    blocks_and_budget[fraction] = {blocks, budget};
    test::expect_same_run(test::read_run(out), test::read_run((d / "auto-0.25.h5").string()), "kv auto");
  }
  // Twice the share, twice the budget (the free memory is the same at both starts).
  EXPECT_NEAR(double(blocks_and_budget["0.5"].second) / double(blocks_and_budget["0.25"].second), 2.0, 1e-2);
  Proc fixed = sh(env + shardlm_bin() + common + " --kv-cache-gb 0.001 --out " + (d / "fixed.h5").string());
  ASSERT_EQ(fixed.code, 0) << fixed.out;
  EXPECT_NE(fixed.out.find("(budget 1.0 MiB, --kv-cache-gb)"), std::string::npos) << fixed.out;
  EXPECT_EQ(fixed.out.find("profile steps"), std::string::npos) << "a set budget profiles nothing: " << fixed.out;
  test::expect_same_run(test::read_run((d / "fixed.h5").string()), test::read_run((d / "auto-0.25.h5").string()),
                        "kv fixed");
#ifdef SHARDLM_EMULATED_BINARY
  // Two ranks bound to one GPU (an emulated node of one) split its free memory.
  const std::string shared_out = (d / "shared.h5").string();
  Proc shared = sh("SHARDLM_EMULATED_GPUS=1 " + env + test::mpirun(2) + shardlm_bin() + common +
                   " --tp 2 --comm mpi --kv-cache-free-fraction 0.5 --out " + shared_out);
  ASSERT_EQ(shared.code, 0) << shared.out;
  EXPECT_NE(shared.out.find(" kept), shared by 2 ranks)"), std::string::npos) << shared.out;
  const auto shared_budget = test::H5Reader(shared_out).scalar_attr<int64_t>("kv_cache_budget_bytes", H5T_NATIVE_INT64);
  EXPECT_LE(shared_budget, 0.5 * device_bytes / 2);
  EXPECT_GE(shared_budget, 0.5 * (device_bytes - 2.0 * (1 << 20)) / 2);
  test::expect_same_run(test::read_run(shared_out), test::read_run((d / "auto-0.25.h5").string()), "kv shared");
  // All of the free memory to the cache, on a 4 MiB device where the budget binds: the profile
  // steps have grown every buffer a step needs, so the run needs no more.
  const std::string small = "SHARDLM_EMULATED_GPU_MEMORY_MIB=4 ";
  const std::string full_out = (d / "full.h5").string();
  Proc full = sh(small + shardlm_bin() + common + " --kv-cache-free-fraction 1 --out " + full_out);
  ASSERT_EQ(full.code, 0) << full.out;
  test::H5Reader fh(full_out);
  const auto full_blocks = fh.scalar_attr<int64_t>("kv_cache_blocks", H5T_NATIVE_INT64);
  const auto full_budget = fh.scalar_attr<int64_t>("kv_cache_budget_bytes", H5T_NATIVE_INT64);
  const auto profile_bytes = fh.scalar_attr<int64_t>("kv_cache_profile_bytes", H5T_NATIVE_INT64);
  EXPECT_EQ(full_blocks, full_budget / block_bytes);
  EXPECT_LT(full_blocks, 8 * 512 / 16) << "the context cap set the count, not the budget";
  test::expect_same_run(test::read_run(full_out), test::read_run((d / "auto-0.25.h5").string()), "kv full");
  // What the share would be without the profile (the free memory after loading, the steps' buffers
  // not yet grown), set as a fixed budget: the first steps find no memory, and the error says what
  // to lower.
  std::ostringstream unprofiled;
  unprofiled << std::setprecision(9) << double(full_budget + profile_bytes) / double(1 << 30);
  Proc over =
      sh(small + shardlm_bin() + common + " --kv-cache-gb " + unprofiled.str() + " --out " + (d / "over.h5").string());
  EXPECT_NE(over.code, 0);
  EXPECT_NE(over.out.find("failed on device 0 (out of memory; "), std::string::npos) << over.out;
  EXPECT_NE(over.out.find(" of 4194304 bytes free; the KV cache takes --kv-cache-gb, or with auto "
                          "--kv-cache-free-fraction of what loading and the profile steps left: lower it)"),
            std::string::npos)
      << over.out;
  // Profile steps larger than the device: the error names them and the options that size them.
  Proc huge = sh(env + shardlm_bin() + base + " --max-batch-tokens 30000 --out " + (d / "huge.h5").string());
  EXPECT_NE(huge.code, 0);
  EXPECT_NE(huge.out.find("the profile steps, the largest a step can be (30000 tokens by --max-batch-tokens, "),
            std::string::npos)
      << huge.out;
#endif
  Proc bad = sh(env + shardlm_bin() + common + " --kv-cache-gb lots --out " + (d / "bad.h5").string());
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("--kv-cache-gb must be auto or a positive number of GiB, not 'lots'"), std::string::npos)
      << bad.out;
}

// --kv-calibrate-out on the CUDA backend (abs_max on the device, folded per layer): the CPU's
// magnitudes, within the GEMMs' rounding; an fp8 cache with those scales gives the CPU's tokens.
TEST(CudaBackend, KvCalibrationMatchesCpu) {
  SHARDLM_REQUIRE_GPU();
  SHARDLM_REQUIRE_SHARED(stories, "models/stories260K");
  const fs::path d = test::fresh_dir("cuda-kv-calibration");
  test::write_layout_prompts(d / "p.jsonl", 3, true);
  const std::string common = " run --model " + stories + " --prompts " + (d / "p.jsonl").string() +
                             " --threads 1 -q --seed 3 --max-seqs 5 --max-batch-tokens 48 --max-new-tokens 6";
  std::vector<std::vector<float>> scales;
  for (const char* backend : {"cpu", "cuda"}) {
    const std::string file = (d / (std::string(backend) + ".safetensors")).string();
    Proc p = sh(shardlm_bin() + common + " --backend " + backend + " --kv-calibrate-out " + file + " --out " +
                (d / (std::string(backend) + ".h5")).string());
    ASSERT_EQ(p.code, 0) << p.out;
    const fs::path dir = d / (std::string("read-") + backend);
    fs::create_directories(dir);
    fs::copy_file(file, dir / "model.safetensors");
    auto ckpt = Checkpoint::open(dir.string());
    std::vector<float>& s = scales.emplace_back();
    for (const std::string& name : ckpt->names()) s.push_back(*static_cast<const float*>(ckpt->get(name).data));
    EXPECT_EQ(s.size(), 10u) << backend << ": k_scale and v_scale of 5 layers";
  }
  ASSERT_EQ(scales[0].size(), scales[1].size());
  for (size_t i = 0; i < scales[0].size(); ++i) EXPECT_NEAR(scales[1][i], scales[0][i], 1e-4 * scales[0][i]) << i;
  std::vector<std::string> outs;
  for (const char* backend : {"cpu", "cuda"}) {
    outs.push_back((d / (std::string("fp8-") + backend + ".h5")).string());
    Proc p = sh(shardlm_bin() + common + " --backend " + backend + " --kv-dtype fp8 --kv-scales " +
                (d / "cpu.safetensors").string() + " --out " + outs.back());
    ASSERT_EQ(p.code, 0) << p.out;
  }
  test::expect_same_run(test::read_run(outs[0]), test::read_run(outs[1]), "calibrated fp8 cache cpu/cuda");
}

// bf16 weights: the GPU multiplies bf16 activations, the CPU fp32 ones, so sampled continuations
// may part after a while; the greedy first token of each prompt must still agree.
TEST(CudaBackend, Bf16GreedyFirstTokensMatchCpu) {
  SHARDLM_REQUIRE_GPU();
  for (const char* config : {"tiny-llama", "tiny-deepseek-v3"}) {
    const std::string model = make_model(config, "bf16");
    const fs::path d = test::fresh_dir(std::string("cuda-bf16-") + config);
    std::string prompts;
    for (int i = 0; i < 16; ++i)
      prompts += "{\"id\": \"g" + std::to_string(i) + "\", \"prompt\": \"Once upon a time " + std::to_string(i * 7) +
                 "\", \"max_tokens\": 1}\n";
    test::write_file(d / "p.jsonl", prompts);
    // Sizes that hold all 16 prompts in one step (the emulated profile steps stay small).
    const std::string common = " run --model " + model + " --prompts " + (d / "p.jsonl").string() +
                               " -q --seed 3 --max-batch-tokens 128 --max-seqs 16";
    Proc cpu = sh(shardlm_bin() + common + " --out " + (d / "cpu.h5").string());
    Proc gpu = sh(shardlm_bin() + common + " --backend cuda --out " + (d / "gpu.h5").string());
    ASSERT_EQ(cpu.code, 0) << cpu.out;
    ASSERT_EQ(gpu.code, 0) << gpu.out;
    const test::RunOutput a = test::read_run((d / "cpu.h5").string()), b = test::read_run((d / "gpu.h5").string());
    int same = 0;
    for (const auto& [id, toks] : a.tokens) same += b.tokens.count(id) && b.tokens.at(id) == toks;
    // Near-ties between the two best logits may flip under bf16 activations; most must not.
    EXPECT_GE(same, 14) << config << ": " << same << " of 16 greedy first tokens agree";
    // --prefill-attention auto: tensor cores for a bf16 checkpoint (GQA, and MLA's latent cache).
    EXPECT_EQ(test::H5Reader((d / "gpu.h5").string()).string_attr("prefill_attention"), "bf16");
    EXPECT_EQ(test::H5Reader((d / "cpu.h5").string()).string_attr("prefill_attention"), "fp32");
  }
}

// --cuda-graphs: decode steps padded to a bucket and replayed as CUDA graphs give the eager GPU
// run's tokens (greedy and sampled; batches of up to 5 rows, so buckets 1, 2, 4 and 8, with
// admissions in between). Logprobs within the layout tolerance: cuBLAS may pick another GEMM
// algorithm for a padded row count. The run header says graphs are on. MoE models capture too
// (their routing stays on the device, padding rows routed to no expert): Mixtral in fp32 and
// DeepSeek-V3 (MLA, sigmoid routing, a shared expert) with its experts kept fp8; every step's
// per-expert token counts (/steps/expert_tokens) must be the eager run's.
TEST(CudaBackend, CudaGraphsMatchEager) {
  SHARDLM_REQUIRE_GPU();
  SHARDLM_REQUIRE_SHARED(stories, "models/stories260K");
  int n = 0;
  for (const std::string& model : {stories, make_model("tiny-llama", "fp32"), make_model("tiny-mixtral", "fp32"),
                                   make_model("tiny-deepseek-v3", "fp8")}) {
    const fs::path d = test::fresh_dir("cuda-graphs-" + std::to_string(n++));
    // The MoE models on four short prompts finishing at different steps (buckets 4, 2, 1), for CI's time.
    const bool moe =
        model.find("tiny-mixtral") != std::string::npos || model.find("tiny-deepseek") != std::string::npos;
    test::write_layout_prompts(d / "p.jsonl", moe ? 4 : kPrompts, !moe);
    const std::string common = " run --model " + model + " --prompts " + (d / "p.jsonl").string() +
                               " --threads 1 --seed 3 --max-seqs 5 --max-batch-tokens 48 --backend cuda";
    Proc eager = sh(shardlm_bin() + common + " -q --out " + (d / "eager.h5").string());
    // Not quiet: the run header says whether graphs are on.
    Proc graphs =
        sh(shardlm_bin() + common + " --cuda-graphs --progress-interval 0 --out " + (d / "graphs.h5").string());
    ASSERT_EQ(eager.code, 0) << eager.out;
    ASSERT_EQ(graphs.code, 0) << graphs.out;
    EXPECT_NE(graphs.out.find("(CUDA graphs)"), std::string::npos) << graphs.out;
    EXPECT_EQ(graphs.out.find("every step runs eagerly"), std::string::npos) << graphs.out;
    test::expect_same_run(test::read_run((d / "eager.h5").string()), test::read_run((d / "graphs.h5").string()),
                          "cuda graphs " + model);
    EXPECT_GT(graph_steps((d / "graphs.h5").string()).at(0), 0) << model;
    if (moe) {
      const auto want =
          test::H5Reader((d / "eager.h5").string()).lists<int32_t>("/steps/expert_tokens", H5T_NATIVE_INT32);
      const auto got =
          test::H5Reader((d / "graphs.h5").string()).lists<int32_t>("/steps/expert_tokens", H5T_NATIVE_INT32);
      ASSERT_FALSE(want.empty()) << model;
      EXPECT_EQ(got, want) << model;
    }
  }
}

// Prompts of 600 to 1000 tokens, at most two sequences at a time: decode steps have few tokens
// with contexts past the first attention partitions (256 positions), so the CUDA backend launches
// attention split along the positions (kernels/cuda/attention_partitions.h): eager steps into the
// partitions their tokens have, captured ones into those the context limit (1024) allows. GQA
// (tiny-llama) and MLA (tiny-deepseek-v3, its MoE layers routed on the device when captured): the
// tokens must be the CPU backend's, and the graph run's the eager run's. Then once more with a
// bf16 and with an fp8 KV cache (--kv-dtype) on both backends, log-probabilities within the
// narrow cache's layout tolerance (tests/common/layout_check.h).
//
// Over the emulated runtime (shardlm-emulated) the contexts are shorter, still past 512, and one
// case stands for the six: GQA over fp32, whose --cuda-graphs run captures the split launches (the
// MLA and narrow-cache launches are in the kernel and backend tests), and three prompts stand for
// four (still more than --max-seqs 2). The full test takes over 15 minutes there, this one about
// a minute.
#ifdef SHARDLM_EMULATED_BINARY
constexpr int kLongPrompts = 3, kLongBase = 520, kLongStep = 20, kLongTokens = 6;
const std::pair<const char*, const char*> kLongCases[] = {{"fp32", "tiny-llama"}};
#else
constexpr int kLongPrompts = 4, kLongBase = 600, kLongStep = 130, kLongTokens = 12;
const std::pair<const char*, const char*> kLongCases[] = {{"fp32", "tiny-llama"}, {"fp32", "tiny-deepseek-v3"},
                                                          {"bf16", "tiny-llama"}, {"bf16", "tiny-deepseek-v3"},
                                                          {"fp8", "tiny-llama"},  {"fp8", "tiny-deepseek-v3"}};
#endif
TEST(CudaBackend, LongContextsMatchCpuAndGraphs) {
  SHARDLM_REQUIRE_GPU();
  for (auto [kv, config] : kLongCases) {
    const std::string model = make_model(config, "fp32");
    const fs::path d = test::fresh_dir(std::string("cuda-long-") + config + "-" + kv);
    test::write_file(d / "p.jsonl", test::token_id_prompts(
                                        kLongPrompts, "l", [](int i) { return kLongBase + kLongStep * i; },
                                        [](int i, int j) { return 3 + (j * 37 + i * 11) % 500; },
                                        [](int i) {
                                          return "\"max_tokens\": " + std::to_string(kLongTokens) +
                                                 (i % 2 ? ", \"temperature\": 0.8" : "");
                                        }));
    const std::string common = " run --model " + model + " --prompts " + (d / "p.jsonl").string() +
                               " --threads 1 -q --seed 3 --max-seqs 2 --max-batch-tokens 512 --kv-dtype " + kv;
    Proc cpu = sh(shardlm_bin() + common + " --out " + (d / "cpu.h5").string());
    Proc gpu = sh(shardlm_bin() + common + " --backend cuda --out " + (d / "gpu.h5").string());
    Proc graphs = sh(shardlm_bin() + common + " --backend cuda --cuda-graphs --out " + (d / "graphs.h5").string());
    ASSERT_EQ(cpu.code, 0) << cpu.out;
    ASSERT_EQ(gpu.code, 0) << gpu.out;
    ASSERT_EQ(graphs.code, 0) << graphs.out;
    const test::RunOutput gpu_run = test::read_run((d / "gpu.h5").string());
    test::expect_same_run(test::read_run((d / "cpu.h5").string()), gpu_run,
                          std::string("long cpu/gpu ") + config + ", " + kv + " cache");
    test::expect_same_run(gpu_run, test::read_run((d / "graphs.h5").string()),
                          std::string("long eager/graphs ") + config + ", " + kv + " cache");
  }
}

// shardlm bench --backend cuda, the GPU benchmark of tests/gpu/run_gpu_checks.sh, at small sizes on
// stories260K: the device's ceilings (copy bandwidth, cuBLAS GEMMs at the model's shapes and one
// square one, fp8- and bf16-weight linears at decode's row counts and W8A8 at prefill's), the KV budget from the
// device's free memory, every scenario (decode and batched also with --cuda-graphs), device sampling and the attention
// op alone for each cache dtype, with positive figures. Over the emulated runtime the device is not in the spec table,
// and its bandwidth probe copies an eighth of its 64 MiB.
TEST(CudaBackend, BenchReportsEveryPart) {
  SHARDLM_REQUIRE_GPU();
  SHARDLM_REQUIRE_SHARED(stories, "models/stories260K");
#ifdef SHARDLM_EMULATED_BINARY
  const std::string env = "SHARDLM_EMULATED_GPU_MEMORY_MIB=64 ";
#else
  const std::string env;
#endif
  Proc r = sh(env + shardlm_bin() + " bench --model " + stories +
              " --backend cuda --threads 1 --prompt-len 32 --decode-tokens 4 --batch 2 --batch-in 8 --batch-out 2"
              " --attention-context 64 --peak-gemm 64 --cuda-graphs --op-profile");
  ASSERT_EQ(r.code, 0) << r.out;
  // --op-profile: the eager steps timed between events on the stream (stories260K: 5 layers).
  test::expect_op_profile(r.out, 32, 4, 5, 2, 8, 2);
  // --cuda-graphs: the decode and batched scenarios again, replayed, beside the eager figures.
  for (const std::regex& line :
       {std::regex("decode   batch 1, CUDA graphs: +[0-9.]+ tok/s .*eager [0-9.]+ tok/s: x[0-9.]+; "
                   "replayed steps: [1-9]"),
        std::regex("batched  2 x \\(8 in \\+ 2 out\\), CUDA graphs: +[0-9.]+ tok/s total.*eager "
                   "[0-9.]+ tok/s total: x[0-9.]+; replayed steps: [1-9]"),
        std::regex("  a batch-1 step's graph: [1-9][0-9]* nodes \\(kernels, copies, library calls\\), [0-9.]+ us a "
                   "node")})
    EXPECT_TRUE(std::regex_search(r.out, line)) << r.out;
  // stories260K: 8 heads / 4 KV heads, head_dim 8; the model's three GEMM shapes and --peak-gemm's.
  const test::BenchShape s{.gpu = true, .prompt_len = 32, .batch = 2, .batch_in = 8, .batch_out = 2,
                           .attention_context = 64, .gemm_lines = 4, .heads = 8, .kv_heads = 4, .head_dim = 8};
  test::expect_bench_report(r.out, s);
  EXPECT_NE(r.out.find("cuBLAS bf16 GEMM 64 x 64 x 64: "), std::string::npos) << r.out;
  // fp8- and bf16-weight linears at 1, 16 and 64 rows, on the gate/up shape (2 x 172 x 64) and the square one.
  for (const char* line : {"  linear 1 x 344 x 64, fp8 weights: ", "  linear 16 x 344 x 64, fp8 weights: ",
                           "  linear 64 x 344 x 64, fp8 weights: ", "  linear 1 x 64 x 64, fp8 weights: ",
                           "  linear 64 x 64 x 64, fp8 weights: "})
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  // And at prefill's rows (the prompt length; --peak-gemm's side), W8A8 against the dequantised weight.
  for (const char* line : {"  linear 32 x 344 x 64, fp8 weights as fp8 w8a8: [0-9.e+-]+ TFLOP/s .*dequantised to bf16: "
                           "[0-9.e+-]+ TFLOP/s .*; [0-9.]+x",
                           "  linear 64 x 64 x 64, fp8 weights as fp8 w8a8: [0-9.e+-]+ TFLOP/s"})
    EXPECT_TRUE(std::regex_search(r.out, std::regex(line))) << line << "\n" << r.out;
  EXPECT_NE(r.out.find("KV cache budget "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(auto: 0.9 of the "), std::string::npos) << r.out;
#ifdef SHARDLM_EMULATED_BINARY
  EXPECT_NE(r.out.find("device: host emulation of an sm_90 device, not in the spec table; measured "
                       "device-to-device copy "),
            std::string::npos)
      << r.out;
  // A device without a datasheet peak gets no share of one (a made-up peak would print nonsense).
  EXPECT_NE(r.out.find("compute-bound tokens: no bf16 tensor peak known for this device"), std::string::npos) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("prefill +32-token prompt: .*no bf16 tensor peak known"))) << r.out;
  EXPECT_EQ(r.out.find("% of bf16 tensor peak"), std::string::npos) << r.out;
#endif
}

}  // namespace
}  // namespace shardlm
