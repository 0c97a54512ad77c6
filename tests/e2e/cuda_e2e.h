// Shared by the --backend cuda end-to-end tests (test_cuda_backend.cpp, test_cuda_backend_fp8.cpp):
// the prompt count, the random models they run and prompts given as token ids.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "common/cli_runner.h"
#include "common/test_dirs.h"

namespace shardlm::test {

// Over the emulated runtime (shardlm-emulated) every kernel thread is a fiber on one host core, and
// a run takes some 200 times the CPU backend's time: 6 prompts there, still long and short, greedy
// and sampled, and more than --max-seqs 5, so that a request joins a running batch. 12 on a GPU.
#ifdef SHARDLM_EMULATED_BINARY
constexpr int kCudaE2ePrompts = 6;
#else
constexpr int kCudaE2ePrompts = 12;
#endif

// A random model of inputs/models/CONFIG.json in dtype (fp32, bf16 or fp8), made for this test.
inline std::string make_model(const std::string& config, const std::string& dtype) {
  const std::filesystem::path d = fresh_dir("cuda-model-" + config + "-" + dtype);
  const std::string dir = (d / "m").string();
  Proc made = sh(shardlm_bin() + " make-model --config " + std::string(SHARDLM_SOURCE_DIR) + "/inputs/models/" +
                 config + ".json --out " + dir + " --dtype " + dtype + " --seed 5");
  EXPECT_EQ(made.code, 0) << made.out;
  return dir;
}

// A prompts file of n requests given as token ids: request i is PREFIX + i, with len(i) ids, id j
// being tok(i, j), and the further JSON fields fields(i) (e.g. "\"max_tokens\": 5").
template <class Len, class Tok, class Fields>
inline std::string token_id_prompts(int n, const std::string& prefix, Len len, Tok tok, Fields fields) {
  std::string lines;
  for (int i = 0; i < n; ++i) {
    std::string ids;
    for (int j = 0; j < len(i); ++j) ids += (j ? ", " : "") + std::to_string(tok(i, j));
    lines +=
        "{\"id\": \"" + prefix + std::to_string(i) + "\", \"prompt_token_ids\": [" + ids + "], " + fields(i) + "}\n";
  }
  return lines;
}

}  // namespace shardlm::test
