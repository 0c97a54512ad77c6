// CUDA sampling against the host Sampler (src/engine/sampler.cpp): for the same logits, params,
// seed and position the same token, and the same logprob within 1e-5 (the fp64 sums run in
// another order). Greedy, temperature, top-k, top-p, min-p and their combinations, on V = 1000
// and V = 151936 (Qwen), many seeds and positions, rows with exact ties. Skipped without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <random>
#include <vector>

#include "common/gpu.h"
#include "engine/sampler.h"
#include "engine/sampling_params.h"

#ifdef SHARDLM_HAVE_CUDA
#include "cuda/device_buffer_moe.h"
#include "cuda/logit_edits.h"
#include "cuda/sampling.h"
#include "cpu/logit_edits.h"
#endif

namespace shardlm {
namespace {

#ifdef SHARDLM_HAVE_CUDA
using testmoe::DevArray;
using testmoe::expect_kernel_ok;

constexpr double kLogprobTol = 1e-5;

struct Setting {
  double temperature, top_p, min_p;
  int64_t top_k;
};

// Logits like an LM head's: a normal body, a few strong tokens; quantum > 0 rounds them to a grid
// so that many tokens tie exactly.
std::vector<float> make_logits(int64_t R, int64_t V, uint32_t seed, float quantum) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> body(0.0f, 2.5f);
  std::uniform_int_distribution<int64_t> pos(0, V - 1);
  std::vector<float> l(static_cast<size_t>(R * V));
  for (auto& v : l) v = body(gen);
  for (int64_t r = 0; r < R; ++r)
    for (int i = 0; i < 5; ++i) l[r * V + pos(gen)] += 8.0f + static_cast<float>(i);
  if (quantum > 0)
    for (auto& v : l) v = std::round(v / quantum) * quantum;
  return l;
}

// Logprobs agree when both are NaN (a row holding NaN) or within the tolerance.
bool logprobs_agree(float got, float want) {
  if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got);
  return std::fabs(got - want) <= kLogprobTol * std::max(1.0f, std::fabs(want));
}

// Rows r use settings[r % n], seed and position varied per row; compares every row with the host.
void check_rows(const std::vector<float>& logits, int64_t R, int64_t V, const std::vector<Setting>& settings,
                uint32_t seed) {
  std::vector<cuda::SamplingRow> rows(static_cast<size_t>(R));
  std::vector<Sample> want(static_cast<size_t>(R));
  Sampler sampler;
  std::mt19937_64 gen(seed * 7919u + 1);
  for (int64_t r = 0; r < R; ++r) {
    const Setting& s = settings[static_cast<size_t>(r) % settings.size()];
    SamplingParams p;
    p.temperature = s.temperature;
    p.top_p = s.top_p;
    p.min_p = s.min_p;
    p.top_k = s.top_k;
    p.seed = r % 3 == 0 ? static_cast<uint64_t>(r) : gen();
    const int64_t position = static_cast<int64_t>(gen() % 100000);
    want[r] = sampler.sample(logits.data() + r * V, V, p, position);
    cuda::SamplingRow& g = rows[r];
    g.temperature = p.temperature;
    g.top_p = p.top_p;
    g.min_p = p.min_p;
    g.top_k = p.top_k;
    g.seed = p.seed;
    g.position = position;
  }
  DevArray<float> d_logits(logits), d_scratch(logits.size()), d_lp(static_cast<size_t>(R));
  DevArray<cuda::SamplingRow> d_rows(rows);
  DevArray<int32_t> d_tok(static_cast<size_t>(R));
  cuda::launch_sample(d_logits.get(), R, V, d_rows.get(), d_scratch.get(), d_tok.get(), d_lp.get(), nullptr);
  expect_kernel_ok();
  const std::vector<int32_t> tok = d_tok.download();
  const std::vector<float> lp = d_lp.download();
  for (int64_t r = 0; r < R; ++r) {
    const Setting& s = settings[static_cast<size_t>(r) % settings.size()];
    ASSERT_EQ(tok[r], want[r].token) << "row " << r << " T " << s.temperature << " top_k " << s.top_k << " top_p "
                                     << s.top_p << " min_p " << s.min_p;
    ASSERT_TRUE(logprobs_agree(lp[r], want[r].logprob))
        << "row " << r << ": " << lp[r] << " against " << want[r].logprob;
  }

  // The logprob-only kernel on the same rows and tokens.
  DevArray<float> d_lp2(static_cast<size_t>(R));
  cuda::launch_logprobs(d_logits.get(), R, V, d_tok.get(), d_lp2.get(), nullptr);
  expect_kernel_ok();
  const std::vector<float> lp2 = d_lp2.download();
  for (int64_t r = 0; r < R; ++r)
    ASSERT_TRUE(logprobs_agree(lp2[r], log_softmax_at(logits.data() + r * V, V, tok[r]))) << "row " << r;
}

void check(int64_t R, int64_t V, const std::vector<Setting>& settings, uint32_t seed, float quantum) {
  check_rows(make_logits(R, V, seed, quantum), R, V, settings, seed);
}

const std::vector<Setting> kGreedy = {{0.0, 1.0, 0.0, 0}, {0.0, 0.9, 0.1, 40}};
const std::vector<Setting> kMixed = {
    {1.0, 1.0, 0.0, 0},   {0.7, 1.0, 0.0, 0},    {1.3, 1.0, 0.0, 50},   {1.0, 1.0, 0.0, 1},
    {0.8, 0.9, 0.0, 0},   {1.0, 0.5, 0.0, 0},    {1.0, 0.95, 0.0, 100}, {0.6, 1.0, 0.05, 0},
    {1.0, 1.0, 0.2, 20},  {1.0, 0.9, 0.02, 0},   {0.9, 0.8, 0.01, 64},  {2.0, 0.99, 0.0, 0},
    {0.3, 1.0, 0.0, 0},   {1.0, 0.0, 0.0, 0},    {1.0, 1.0, 1.0, 0},    {1.0, 1.0, 0.0, 999},
};
#endif

TEST(CudaSampling, GreedyMatchesHost) {
  SHARDLM_REQUIRE_GPU();
#ifdef SHARDLM_HAVE_CUDA
  check(64, 1000, kGreedy, 1, 0);
  check(64, 1000, kGreedy, 2, 2.0f);  // ties: the lowest id
  check(16, 151936, kGreedy, 3, 0);
#endif
}

TEST(CudaSampling, FilteredSamplingMatchesHostSmallVocab) {
  SHARDLM_REQUIRE_GPU();
#ifdef SHARDLM_HAVE_CUDA
  for (uint32_t seed = 10; seed < 20; ++seed) check(160, 1000, kMixed, seed, 0);
  check(160, 1000, kMixed, 30, 0.5f);  // exact ties inside the candidate list
  check(160, 1000, kMixed, 31, 8.0f);  // huge tie groups
#endif
}

TEST(CudaSampling, FilteredSamplingMatchesHostQwenVocab) {
  SHARDLM_REQUIRE_GPU();
#ifdef SHARDLM_HAVE_CUDA
  check(64, 151936, kMixed, 40, 0);
  check(32, 151936, kMixed, 41, 0.25f);
#endif
}

// Rows without a finite maximum or with NaN, -inf and +inf entries: the host's argmax where the
// tempered probabilities are undefined, its draw among the finite logits otherwise.
TEST(CudaSampling, SpecialRowsMatchHost) {
  SHARDLM_REQUIRE_GPU();
#ifdef SHARDLM_HAVE_CUDA
  constexpr int64_t V = 40;
  const float nan = std::nanf(""), inf = INFINITY;
  std::vector<std::vector<float>> rows(8, std::vector<float>(V));
  std::mt19937 gen(9);
  std::normal_distribution<float> body(0.0f, 3.0f);
  for (auto& row : rows)
    for (auto& v : row) v = body(gen);
  rows[0][0] = nan;                                         // NaN first, a finite maximum later
  for (auto& v : rows[1]) v = nan;                          // all NaN
  for (auto& v : rows[2]) v = -inf;                         // all -inf
  rows[3].assign(V, -inf);
  rows[3][0] = nan;                                         // NaN first, the rest -inf
  rows[4][7] = inf;                                         // one +inf
  rows[4][21] = inf;                                        // and a second
  for (int64_t i = 0; i < V; i += 3) rows[5][i] = -inf;     // -inf among finite logits
  for (int64_t i = 1; i < V; i += 4) rows[6][i] = nan;      // NaN among finite logits
  rows[7].assign(V, 1.5f);                                  // one value everywhere
  std::vector<Setting> settings = kGreedy;
  settings.insert(settings.end(), kMixed.begin(), kMixed.end());
  const int64_t R = static_cast<int64_t>(rows.size() * settings.size());
  std::vector<float> logits;
  // Row r has pattern r / |settings| and setting r % |settings|.
  for (const auto& row : rows)
    for (size_t k = 0; k < settings.size(); ++k) logits.insert(logits.end(), row.begin(), row.end());
  check_rows(logits, R, V, settings, 5);
#endif
}

// The device's logit edits give the host's bits (kernels/cpu/logit_edits.h) for every kind of
// logit: positive, negative, zero, -0, infinities and NaN; seen counts 0 (a prompt token) to many
// and unseen tokens; biases of either sign and -inf (a stop token barred before min_tokens);
// penalties above and below neutral; rows that keep only their allowed tokens. Rows list distinct
// tokens, and tokens no row lists stay as they were (or -inf on an allowed-only row).
TEST(CudaSampling, LogitEditsMatchHostBits) {
  SHARDLM_REQUIRE_GPU();
#ifdef SHARDLM_HAVE_CUDA
  constexpr int64_t R = 9, V = 3000;
  std::vector<float> logits = make_logits(R, V, 77, 0);
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, std::nanf(""), 1e-30f, -1e-30f, 3e38f, -3e38f};
  for (int64_t r = 0; r < R; ++r)
    for (size_t i = 0; i < std::size(specials); ++i) logits[r * V + static_cast<int64_t>(i) * 11] = specials[i];
  const float reps[] = {1.0f, 1.3f, 0.7f, 2.0f, 1.05f, 0.25f, 1.0f, 1.17f, 9.0f};
  const float freqs[] = {0.0f, 0.4f, -0.3f, 2.0f, -2.0f, 0.1f, 1.3f, 0.0f, 0.77f};
  const float press[] = {0.0f, 0.6f, 0.2f, -2.0f, 2.0f, -0.1f, 0.0f, 1.9f, 0.33f};
  const float biases[] = {0.0f, 5.0f, -100.0f, 0.37f, -INFINITY, 100.0f, -2.5f};
  std::mt19937 gen(4);
  std::vector<cuda::LogitEditEntry> entries;
  std::vector<cuda::SamplingRow> params(static_cast<size_t>(R));
  std::vector<float> want(logits.size());
  bool any_allowed_only = false;
  for (int64_t r = 0; r < R; ++r) {
    params[r].repetition_penalty = reps[r];
    params[r].frequency_penalty = freqs[r];
    params[r].presence_penalty = press[r];
    const bool allowed_only = r % 3 == 1;
    params[r].allowed_only = allowed_only;
    any_allowed_only = any_allowed_only || allowed_only;
    std::vector<sampling::TokenEdit> edits;
    for (int64_t t = 0; t < V; ++t) {
      // Every special logit and about a third of the rest: seen with counts 0 to 40 or unseen,
      // some biased, some allowed.
      const bool special = t % 11 == 0 && t / 11 < static_cast<int64_t>(std::size(specials));
      if (!special && gen() % 3 != 0) continue;
      sampling::TokenEdit e;
      e.token = static_cast<int32_t>(t);
      e.output_count = special ? static_cast<int32_t>(t % 3) : static_cast<int32_t>(gen() % 42) - 1;
      e.bias = biases[gen() % std::size(biases)];
      e.allowed = static_cast<int32_t>(gen() % 2);
      edits.push_back(e);
    }
    cpu::edited_row(logits.data() + r * V, V, edits.data(), static_cast<int64_t>(edits.size()), allowed_only, reps[r],
                    freqs[r], press[r], want.data() + r * V);
    for (const auto& e : edits)
      entries.push_back({static_cast<int32_t>(r), e.token, e.output_count, e.bias, e.allowed});
  }
  DevArray<float> d_logits(logits);
  DevArray<float> d_edited(logits);  // the copy the edits start from
  DevArray<cuda::SamplingRow> d_params(params);
  DevArray<cuda::LogitEditEntry> d_entries(entries);
  cuda::launch_apply_logit_edits(d_logits.get(), d_edited.get(), R, V, d_params.get(), d_entries.get(),
                                 static_cast<int64_t>(entries.size()), any_allowed_only, nullptr);
  expect_kernel_ok();
  const std::vector<float> got = d_edited.download();
  int64_t changed = 0, barred = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    // NaN as NaN (a GPU's arithmetic gives the canonical NaN, not the operand's payload).
    if (std::isnan(want[i])) {
      ASSERT_TRUE(std::isnan(got[i])) << "index " << i;
      continue;
    }
    ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0) << "index " << i << ": " << got[i] << " vs " << want[i];
    changed += std::memcmp(&got[i], &logits[i], sizeof(float)) != 0;
    barred += got[i] == -INFINITY && logits[i] != -INFINITY;
  }
  EXPECT_GT(changed, R * V / 5);                       // the edits did change most listed logits
  EXPECT_GT(barred, 3 * V / 2);                        // the allowed-only rows' unlisted tokens, and the -inf biases
  const std::vector<float> raw = d_logits.download();  // the raw logits stay as they were
  EXPECT_EQ(0, std::memcmp(raw.data(), logits.data(), logits.size() * sizeof(float)));
  cuda::launch_apply_logit_edits(nullptr, nullptr, R, V, nullptr, nullptr, 0, false, nullptr);  // nothing to do
  expect_kernel_ok();
#endif
}

TEST(CudaSampling, ZeroRowsLaunchNothing) {
  SHARDLM_REQUIRE_GPU();
#ifdef SHARDLM_HAVE_CUDA
  cuda::launch_sample(nullptr, 0, 1000, nullptr, nullptr, nullptr, nullptr, nullptr);
  cuda::launch_logprobs(nullptr, 0, 1000, nullptr, nullptr, nullptr);
  expect_kernel_ok();
#endif
}

}  // namespace
}  // namespace shardlm
