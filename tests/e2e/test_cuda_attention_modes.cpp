// --backend cuda with attention on bf16 tensor cores, end to end against the CPU backend: prefill
// chunks (--prefill-attention bf16, GQA) and an MLA model's decode tokens (--decode-attention bf16),
// eager and replayed from CUDA graphs, and the bench lines that time those kernels beside the fp32
// ones. Every test skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include "common/cli_runner.h"
#include "common/gpu.h"
#include "common/h5_read.h"
#include "common/layout_check.h"
#include "common/test_files.h"
#include "e2e/cuda_e2e.h"

namespace fs = std::filesystem;

namespace shardlm {
namespace {

using test::make_model;
using test::Proc;
using test::sh;
using test::shardlm_bin;

// --prefill-attention bf16: prefill chunks attend on tensor cores (kernels/cuda/prefill_attention_mma.h:
// bf16 query, keys, values and weights, fp32 accumulation). On an fp32 checkpoint (where auto keeps
// fp32 attention, and the GPU otherwise gives the CPU's results to rounding) the attention's bf16
// rounding is then the only difference from the CPU backend: over 16 prompts of 40 to 160 tokens,
// prefilled in chunks of several sequences, the greedy first tokens must agree (a near-tie may
// flip one) and their log-probabilities stay within 4e-2 of the CPU's (1.3e-2 seen over the emulated
// runtime: about 2^-9 relative on each attention output, through 4 layers of a random model). The
// run header and /prefill_attention say which ran.
TEST(CudaBackend, PrefillAttentionOnTensorCoresMatchesCpu) {
  SHARDLM_REQUIRE_GPU();
  const std::string model = make_model("tiny-llama", "fp32");
  const fs::path d = test::fresh_dir("cuda-prefill-attention");
  test::write_file(d / "p.jsonl", test::token_id_prompts(
                                      16, "a", [](int i) { return 40 + 8 * i; },
                                      [](int i, int j) { return 3 + (j * 29 + i * 13) % 500; },
                                      [](int) { return std::string("\"max_tokens\": 1"); }));
  const std::string common = " run --model " + model + " --prompts " + (d / "p.jsonl").string() +
                             " --seed 3 --max-batch-tokens 256 --max-seqs 16 --progress-interval 0";
  Proc cpu = sh(shardlm_bin() + common + " -q --out " + (d / "cpu.h5").string());
  Proc fp32 = sh(shardlm_bin() + common + " --backend cuda --out " + (d / "fp32.h5").string());
  Proc bf16 = sh(shardlm_bin() + common + " --backend cuda --prefill-attention bf16 --out " + (d / "bf16.h5").string());
  ASSERT_EQ(cpu.code, 0) << cpu.out;
  ASSERT_EQ(fp32.code, 0) << fp32.out;
  ASSERT_EQ(bf16.code, 0) << bf16.out;
  const std::string said = "prefill attention on bf16 tensor cores";
  EXPECT_EQ(fp32.out.find(said), std::string::npos) << fp32.out;
  EXPECT_NE(bf16.out.find(said), std::string::npos) << bf16.out;
  EXPECT_EQ(test::H5Reader((d / "fp32.h5").string()).string_attr("prefill_attention"), "fp32");
  EXPECT_EQ(test::H5Reader((d / "bf16.h5").string()).string_attr("prefill_attention"), "bf16");
  const test::RunOutput want = test::read_run((d / "cpu.h5").string());
  test::expect_same_run(want, test::read_run((d / "fp32.h5").string()), "auto (fp32) prefill attention");
  const test::RunOutput got = test::read_run((d / "bf16.h5").string());
  ASSERT_EQ(want.tokens.size(), 16u);
  int same = 0;
  float most = 0;
  for (const auto& [id, toks] : want.tokens) {
    ASSERT_TRUE(got.tokens.count(id)) << id;
    if (got.tokens.at(id) != toks) continue;
    ++same;
    most = std::max(most, std::abs(got.logprobs.at(id).at(0) - want.logprobs.at(id).at(0)));
  }
  EXPECT_GE(same, 15) << same << " of 16 greedy first tokens agree";
  EXPECT_LT(most, 4e-2f) << "largest log-probability difference of an agreeing token";
  EXPECT_GT(most, 0.0f) << "bf16 attention left every log-probability as the CPU's: did it run?";
}

// --decode-attention bf16 on an MLA model: decode tokens attend on tensor cores too
// (kernels/cuda/decode_latent_attention_mma.h), with prefill's bf16 numerics. On an fp32
// tiny-deepseek-v3 with --prefill-attention bf16 (so the attention's bf16 rounding is the only
// difference from the CPU backend), 8 greedy requests of 5 tokens: each request's tokens follow
// the CPU's up to a first near-tie, at least 6 of 8 all the way, and the log-probabilities of the
// agreeing tokens stay within 4e-2 of the CPU's, as prefill attention on tensor cores does (a
// decode token's 2^-9 relative error per attention output). Replayed from CUDA graphs (the decode
// kernel split along the context limit's partitions rather than the step's), the eager run's
// tokens and log-probabilities. Against --prefill-attention bf16 alone: the same first tokens,
// bit for bit, and other decode log-probabilities. The run header and /decode_attention say which
// ran; bf16 beside prefill attention in fp32 is refused.
TEST(CudaBackend, MlaDecodeAttentionOnTensorCoresMatchesCpuAndGraphs) {
  SHARDLM_REQUIRE_GPU();
  const std::string model = make_model("tiny-deepseek-v3", "fp32");
  const fs::path d = test::fresh_dir("cuda-mla-decode-attention");
  test::write_file(d / "p.jsonl", test::token_id_prompts(
                                      8, "m", [](int i) { return 30 + 40 * i; },
                                      [](int i, int j) { return 3 + (j * 31 + i * 17) % 500; },
                                      [](int) { return std::string("\"max_tokens\": 5"); }));
  const std::string common = " run --model " + model + " --prompts " + (d / "p.jsonl").string() +
                             " --threads 1 --seed 3 --max-batch-tokens 128 --max-seqs 8 --progress-interval 0";
  const std::string bf16 = " --backend cuda --prefill-attention bf16 --decode-attention bf16";
  Proc cpu = sh(shardlm_bin() + common + " -q --out " + (d / "cpu.h5").string());
  Proc eager = sh(shardlm_bin() + common + bf16 + " --out " + (d / "eager.h5").string());
  Proc graphs = sh(shardlm_bin() + common + bf16 + " -q --cuda-graphs --out " + (d / "graphs.h5").string());
  ASSERT_EQ(cpu.code, 0) << cpu.out;
  ASSERT_EQ(eager.code, 0) << eager.out;
  ASSERT_EQ(graphs.code, 0) << graphs.out;
  EXPECT_NE(eager.out.find("prefill and decode attention on bf16 tensor cores"), std::string::npos) << eager.out;
  EXPECT_EQ(test::H5Reader((d / "eager.h5").string()).string_attr("decode_attention"), "bf16");
  EXPECT_EQ(test::H5Reader((d / "cpu.h5").string()).string_attr("decode_attention"), "fp32");
  const test::RunOutput want = test::read_run((d / "cpu.h5").string());
  const test::RunOutput got = test::read_run((d / "eager.h5").string());
  test::expect_same_run(got, test::read_run((d / "graphs.h5").string()), "decode attention bf16, eager/graphs");
  ASSERT_EQ(want.tokens.size(), 8u);
  int whole = 0;
  float most = 0;
  for (const auto& [id, toks] : want.tokens) {
    ASSERT_TRUE(got.tokens.count(id)) << id;
    const std::vector<int32_t>& g = got.tokens.at(id);
    size_t n = 0;
    while (n < toks.size() && n < g.size() && g[n] == toks[n]) ++n;
    whole += n == toks.size() && g.size() == toks.size();
    for (size_t i = 0; i < n; ++i)
      most = std::max(most, std::abs(got.logprobs.at(id).at(i) - want.logprobs.at(id).at(i)));
  }
  EXPECT_GE(whole, 6) << whole << " of 8 requests give the CPU's 5 tokens";
  EXPECT_LT(most, 4e-2f) << "largest log-probability difference of an agreeing token";
  EXPECT_GT(most, 0.0f) << "bf16 attention left every log-probability as the CPU's: did it run?";

  // Beside prefill on tensor cores alone: the first tokens (prefill) the same bits, the decode
  // tokens' log-probabilities not.
  Proc prefill =
      sh(shardlm_bin() + common + " -q --backend cuda --prefill-attention bf16 --out " + (d / "prefill.h5").string());
  ASSERT_EQ(prefill.code, 0) << prefill.out;
  const test::RunOutput fp32_decode = test::read_run((d / "prefill.h5").string());
  int decode_differs = 0;
  for (const auto& [id, toks] : got.tokens) {
    const std::vector<int32_t>& f = fp32_decode.tokens.at(id);
    ASSERT_FALSE(toks.empty() || f.empty()) << id;
    EXPECT_EQ(toks[0], f[0]) << id;
    EXPECT_EQ(got.logprobs.at(id)[0], fp32_decode.logprobs.at(id)[0]) << id << ": prefill is the same launch";
    for (size_t i = 1; i < toks.size() && i < f.size() && toks[i - 1] == f[i - 1]; ++i)
      decode_differs += got.logprobs.at(id)[i] != fp32_decode.logprobs.at(id)[i];
  }
  EXPECT_GT(decode_differs, 0) << "decode attention in bf16 left every decode log-probability as fp32's";

  Proc refused =
      sh(shardlm_bin() + common + " --backend cuda --decode-attention bf16 --out " + (d / "refused.h5").string());
  EXPECT_NE(refused.code, 0);
  EXPECT_NE(refused.out.find("--decode-attention bf16 needs prefill attention on bf16 tensor cores too"),
            std::string::npos)
      << refused.out;
}

// shardlm bench --decode-attention bf16 on an MLA model: each attention decode line times the
// decode kernel on tensor cores and the fp32 one beside it (a bf16 checkpoint: prefill attention
// on tensor cores by auto), each with its GFLOP/s.
TEST(CudaBackend, BenchTimesMlaDecodeOnTensorCoresBesideFp32) {
  SHARDLM_REQUIRE_GPU();
  const std::string model = make_model("tiny-deepseek-v3", "bf16");
#ifdef SHARDLM_EMULATED_BINARY
  const std::string env = "SHARDLM_EMULATED_GPU_MEMORY_MIB=64 ";
#else
  const std::string env;
#endif
  Proc r = sh(env + shardlm_bin() + " bench --model " + model +
              " --backend cuda --threads 1 --prompt-len 16 --decode-tokens 2 --batch 1 --batch-in 8 --batch-out 2"
              " --attention-context 300 --peak-gemm 0 --decode-attention bf16");
  ASSERT_EQ(r.code, 0) << r.out;
  // 1 and 8 sequences at 300 positions (two partitions: split), for each cache dtype.
  // The GFLOP/s of each beside its units' peak where the device is in the spec table (the emulated
  // one is not).
  const std::regex line(
      "  [18] x +300 positions: +[0-9.]+ us +\\([0-9. ]+ GB/s, +[0-9.]+% of bandwidth; [0-9.]+ GFLOP/s(, [0-9.]+% of "
      "the bf16 tensor peak)?\\) +split 2 ways; unsplit [0-9.]+ us .*; bf16 tensor cores; fp32 kernel [0-9.]+ us "
      "\\([0-9.]+ GB/s; [0-9.]+ GFLOP/s(, [0-9.]+% of the fp32 peak)?\\), [0-9.]+x");
  const auto n = std::distance(std::sregex_iterator(r.out.begin(), r.out.end(), line), std::sregex_iterator());
  EXPECT_EQ(n, 6) << r.out;
}

}  // namespace
}  // namespace shardlm
