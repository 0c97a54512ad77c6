// Options of `shardlm run`: one struct, one declarative table (Boost.ProgramOptions) shared by the
// command line and INI job files. The command line wins over the job file.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "engine/sampling_params.h"

namespace shardlm {

struct RunOptions {
  std::string model;              // Hugging Face checkpoint directory
  std::string prompts;            // prompt file (JSONL, text, OpenAI batch JSONL)
  std::string out;                // output HDF5 file
  std::string format = "auto";    // prompt file format
  std::string config;             // INI job file
  std::string backend = "cpu";    // compute backend
  bool cuda_graphs = false;       // replay decode steps as CUDA graphs (--backend cuda only)
  bool op_profile = false;        // each rank's step time by op group, into /op_profile
  double ep_graph_capacity = 2.0;  // a captured ep exchange's blocks, x the mean load (0: worst case)
  std::string ep_wire = "fp32";    // expert-parallel rows between ranks: fp32 | bf16 (arch/expert_wire.h)
  int64_t max_new_tokens = 128;   // default per-request max_tokens
  double temperature = 0.0;       // 0 = greedy
  double top_p = 1.0;
  int64_t top_k = 0;
  double min_p = 0.0;
  double repetition_penalty = 1.0;  // vLLM's penalties (engine/sampling_params.h); neutral 1, 0, 0
  double frequency_penalty = 0.0;
  double presence_penalty = 0.0;
  uint64_t seed = 0;              // run seed (requests without a seed derive theirs from it + id)
  // auto: generation_config.json's sampling fields are the defaults of the options not given
  // (cli/generation_defaults.h); none: shardlm's own defaults.
  std::string generation_config = "none";
  std::set<std::string> given;          // options set on the command line or in the job file
  std::string generation_config_taken;  // what auto took, for the start-up message
  std::string generation_config_not_applied;  // fields it does not read (as vLLM), for a warning
  std::vector<std::string> stop;  // default stop strings
  bool ignore_eos = false;
  int64_t max_batch_tokens = 2048;
  int64_t max_seqs = 64;
  int64_t max_logit_rows = 0;           // logit rows a step may carry; 0: max_seqs
  int64_t max_model_len = 0;            // context limit, tokens; 0 = the model's, or the KV cache's if less
  std::string kv_cache_gb = "auto";     // per rank, GiB, or auto (kv_cache_gib)
  double kv_cache_free_fraction = 0.9;  // auto on a GPU: this fraction of the memory free after loading
  std::string kv_dtype = "auto";  // KV cache elements: auto (the checkpoint's bf16, else fp32) | fp32 | bf16 | fp8
  std::string kv_scales;          // safetensors file of k_scale / v_scale over the checkpoint's (fp8 cache)
  std::string kv_calibrate_out;   // write per-layer fp8 KV scales from this run's key and value magnitudes
  std::string fp8_weights =
      "fp8";  // an fp8 checkpoint's linear weights on a GPU: fp8 (kept) | bf16 (dequantised at load)
  std::string fp8_prefill = "w8a8";  // linears on kept fp8 weights past 16 rows: w8a8 | bf16
  std::string fp8_expert_gemm = "grouped";  // W8A8 routed experts: grouped (one launch) | per-expert
  std::string grouped_gemm_core = "auto";   // the grouped expert GEMMs' products: auto (wgmma on sm_90) | mma-sync
  std::string prefill_attention = "auto";  // prefill chunks' attention on a GPU: auto | bf16 | fp32
  std::string decode_attention = "fp32";   // MLA decode tokens' attention on a GPU: fp32 | bf16
  int64_t block_size = 16;
  int threads = 0;                // CPU threads per rank; 0 = all cores
  int flush_every = 64;           // HDF5 flush period in finished requests
  double flush_seconds = 10;      // ... and in seconds
  bool resume = false;            // append to an existing output, skipping the ids it holds
  double progress_interval = 2.0; // seconds between progress lines
  int tp = 1;                     // tensor-parallel ranks per stage
  int pp = 1;                     // pipeline stages
  int replicas = 0;               // model copies; 0 = world / (tp * pp * dp)
  int dp = 1;                     // attention data-parallel groups per stage
  int ep = 0;                     // expert-parallel ranks per stage: 1 or dp * tp (0: dp * tp for MoE with dp > 1)
  std::string pp_layers;          // layers per stage, e.g. "3,3,2" (default: balanced)
  std::string comm = "mpi";       // communication backend
  double comm_timeout = 600;      // seconds a rank waits on another before failing the job
  int metrics_port = -1;                  // Prometheus endpoint on the writer rank (-1: off, 0: any port)
  std::string metrics_bind = "127.0.0.1";  // address it listens on
  std::string metrics_file;               // textfile-collector output, rewritten periodically
  bool quiet = false;
  bool require_efa = false;             // fail at start unless every node lists the efa libfabric provider
  std::string fabric_report = "auto";   // network preflight report: auto|on|line|off
};

// Parses `shardlm run` arguments (argv[0] is "run"). Returns false after printing help.
// Throws Error with the option's name on a bad value or a missing required option.
bool parse_run_options(int argc, char** argv, RunOptions* out);
// The resolved options as INI text (one "key = value" per line): a job file that reproduces the run.
std::string to_ini(const RunOptions& o);
// The run-wide sampling defaults the options give (request fields override them).
SamplingParams sampling_defaults(const RunOptions& o);

// --prefill-attention: whether prefill chunks attend on bf16 tensor cores. auto: where the
// checkpoint's own linears run bf16 on the GPU (a bfloat16 or fp8 block-quantised checkpoint), so
// attention rounds as they already do; fp32 checkpoints keep fp32 attention. Throws on a name other
// than auto, bf16 or fp32.
bool prefill_attention_bf16(const std::string& choice, DType checkpoint_dtype, bool fp8_block);

// --decode-attention: whether MLA decode tokens attend on bf16 tensor cores. bf16 takes prefill's
// numerics, so it needs prefill chunks there too (prefill_bf16, --prefill-attention resolved).
// Throws on a name other than fp32 or bf16, and on bf16 with prefill attention in fp32.
bool decode_attention_bf16(const std::string& choice, bool prefill_bf16);

}  // namespace shardlm
