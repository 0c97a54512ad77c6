#include "cli/run_options.h"

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cmath>
#include <fstream>
#include <iostream>
#include <sstream>

#include "arch/expert_wire.h"
#include "cli/generation_defaults.h"
#include "cli/kv_budget.h"
#include "core/error.h"
#include "engine/kv_cache.h"
#include "io/request_reader.h"

namespace po = boost::program_options;

namespace shardlm {

namespace {

uint64_t parse_seed(const std::string& v) {
  const bool digits = !v.empty() && v.size() <= 20 && v.find_first_not_of("0123456789") == std::string::npos;
  errno = 0;
  const unsigned long long x = digits ? std::strtoull(v.c_str(), nullptr, 10) : 0;
  SHARDLM_CHECK(digits && errno == 0, "--seed must be an integer from 0 to 2^64-1, not '" << v << "'");
  return static_cast<uint64_t>(x);
}

// A stop string as a job file keeps it: JSON-quoted, '#' (which starts a comment there) escaped.
std::string ini_quoted(const std::string& stop) {
  std::string q = nlohmann::json(stop).dump();
  std::string out;
  for (const char c : q) out += c == '#' ? std::string("\\u0023") : std::string(1, c);
  return out;
}

// The stop strings given as JSON string literals, decoded.
void decode_stops(std::vector<std::string>* stops) {
  for (std::string& s : *stops) {
    if (s.size() < 2 || s.front() != '"' || s.back() != '"') continue;
    try {
      s = nlohmann::json::parse(s).get<std::string>();
    } catch (const nlohmann::json::exception&) {
      SHARDLM_FAIL("--stop " << s << ": not a valid JSON string");
    }
  }
}

// A switch: --name alone sets it; --name=false turns off one a job file sets (a bool_switch could not).
po::typed_value<bool>* flag(bool* v) {
  return po::value(v)->default_value(false, "false")->implicit_value(true, "true")->value_name("BOOL");
}

po::options_description describe(RunOptions& o) {
  po::options_description d(
      "shardlm run options (also readable from an INI job file; the command line wins, --switch=false included)");
  // clang-format off
  d.add_options()
    ("model", po::value(&o.model), "Hugging Face model directory (config.json, *.safetensors, tokenizer.json)")
    ("prompts", po::value(&o.prompts), "prompt file: JSONL, plain text (one prompt per line) or OpenAI batch JSONL")
    ("out", po::value(&o.out), "output HDF5 file")
    ("format", po::value(&o.format)->default_value(o.format), "prompt file format: auto|jsonl|text|openai")
    ("config", po::value(&o.config), "INI job file with any of these options")
    ("backend", po::value(&o.backend)->default_value(o.backend), "compute backend")
    ("cuda-graphs", flag(&o.cuda_graphs), "capture decode steps (one token per sequence, padded to 1, 2, 4 .. 256 rows) as CUDA graphs and replay them; --backend cuda, dense and MoE models, tp and ep only over --comm nccl (other steps run eagerly)")
    ("op-profile", flag(&o.op_profile), "time each rank's part of every step by op group (attention, MLP, MoE, norms, all-reduces, LM head, sampling; on CUDA device time between events on the stream, which costs an event per group boundary): rank 0's tables on stderr at the end, every rank's in /op_profile; a step replayed from a CUDA graph is one group")
    ("ep-graph-capacity", po::value(&o.ep_graph_capacity)->default_value(o.ep_graph_capacity), "with --cuda-graphs and ep: the rows a captured MoE exchange reserves per peer, as a multiple of the mean load (tokens x top-k / ep) plus one token's; a step that overflows them is redone eagerly (/ranks/graph_reruns); 0: the worst case, never redone")
    ("ep-wire", po::value(&o.ep_wire)->default_value(o.ep_wire), "expert-parallel MoE rows between ranks (dispatch rows and combine results): fp32 (every layout gives the single-rank bits), bf16 (half the bytes; each row rounded to bf16 once: the ep layouts give the same bits as each other, tp ones within tolerance, and differ from a layout without ep by that rounding) or fp8 (DeepEP's format: dispatch rows quantised once to e4m3 with a scale per 128 values, about a quarter of their bytes, and combine results in bf16; the ep layouts give each other's bits as with bf16)")
    ("max-new-tokens", po::value(&o.max_new_tokens)->default_value(o.max_new_tokens), "default max tokens generated per request")
    ("temperature", po::value(&o.temperature)->default_value(o.temperature), "sampling temperature (0 = greedy)")
    ("top-p", po::value(&o.top_p)->default_value(o.top_p), "nucleus sampling mass (1 = off)")
    ("top-k", po::value(&o.top_k)->default_value(o.top_k), "keep the k most likely tokens (0 = off)")
    ("min-p", po::value(&o.min_p)->default_value(o.min_p), "drop tokens below min-p times the most likely (0 = off)")
    ("repetition-penalty", po::value(&o.repetition_penalty)->default_value(o.repetition_penalty), "vLLM's repetition penalty on the tokens of the prompt and the output so far: a positive logit divided by it, any other multiplied (> 0; 1 = off)")
    ("frequency-penalty", po::value(&o.frequency_penalty)->default_value(o.frequency_penalty), "subtracted from a token's logit once per time it is in the output so far (OpenAI's and vLLM's; in [-2, 2], 0 = off)")
    ("presence-penalty", po::value(&o.presence_penalty)->default_value(o.presence_penalty), "subtracted from the logit of every token in the output so far (OpenAI's and vLLM's; in [-2, 2], 0 = off)")
    ("generation-config", po::value(&o.generation_config)->default_value(o.generation_config), "auto: the model's generation_config.json sets the defaults of --temperature, --top-p, --top-k, --min-p, --repetition-penalty and --max-new-tokens where they are not given (vLLM's default); none: shardlm's (greedy, 128 tokens)")
    // As text: the number conversion would take "-1" as 2^64 - 1.
    ("seed", po::value<std::string>()->default_value(std::to_string(o.seed))->notifier([&o](const std::string& v) { o.seed = parse_seed(v); }), "run seed, 0 to 2^64-1; a request without its own seed derives one from this and its id")
    // Not composing: stop strings given on the command line replace the job file's. A value that is
    // a JSON string ("\" Answer:\"") is decoded, so that spaces and '#' (a job file's comment) survive.
    ("stop", po::value(&o.stop), "default stop string (repeatable; a JSON string literal is decoded)")
    ("ignore-eos", flag(&o.ignore_eos), "keep generating past EOS")
    ("max-batch-tokens", po::value(&o.max_batch_tokens)->default_value(o.max_batch_tokens), "tokens per scheduler step (prefill chunks included)")
    ("max-seqs", po::value(&o.max_seqs)->default_value(o.max_seqs), "sequences running at once")
    ("max-logit-rows", po::value(&o.max_logit_rows)->default_value(o.max_logit_rows), "logit rows a step may carry, 0 for --max-seqs: a sampling sequence takes one, a request with prompt_logprobs one per prompt position (its prefill goes in chunks that fit). The profile steps size the logits and the sampler's buffers for it ([rows x vocab] fp32, several times over), so raise it (e.g. to --max-batch-tokens) for runs that mostly score prompts")
    ("max-model-len", po::value(&o.max_model_len)->default_value(o.max_model_len), "context limit in tokens, prompt and output of one request (as vLLM's): a longer prompt is a per-request error, generation stops for length at it. At most the model's max_position_embeddings; the run fails at start where the KV cache cannot hold one sequence of it. 0: the model's max_position_embeddings, or what the KV cache holds where that is less (said at start). The run records the limit it kept, and --resume keeps the file's")
    ("kv-cache-gb", po::value(&o.kv_cache_gb)->default_value(o.kv_cache_gb), "KV cache memory budget per rank, GiB, or auto: on a GPU --kv-cache-free-fraction of the device memory free once the weights are loaded and the profile steps (the largest a step can be: --max-batch-tokens over --max-seqs sequences) have run, on the CPU 4")
    ("kv-cache-free-fraction", po::value(&o.kv_cache_free_fraction)->default_value(o.kv_cache_free_fraction), "with --kv-cache-gb auto on a GPU: the share of the device memory free after the profile steps that the KV cache takes (the rest stays for CUDA graphs, NCCL and allocator slack)")
    ("kv-dtype", po::value(&o.kv_dtype)->default_value(o.kv_dtype), "KV cache elements: fp32, bf16 (half the memory and the bytes decode attention reads), fp8 (e4m3, a quarter; scaled by the checkpoint's k_scale / v_scale, else 1), or auto: bf16 for a bfloat16 checkpoint, else fp32")
    ("kv-scales", po::value(&o.kv_scales), "safetensors file of per-layer model.layers.N.self_attn.k_scale / v_scale (as --kv-calibrate-out writes them) that an fp8 KV cache uses instead of the checkpoint's")
    ("kv-calibrate-out", po::value(&o.kv_calibrate_out), "record every layer's largest key and value magnitudes over the run (steps run eagerly) and write fp8 KV scales (magnitude / 448) to this safetensors file, for --kv-scales")
    ("fp8-weights", po::value(&o.fp8_weights)->default_value(o.fp8_weights), "an fp8 block-quantised checkpoint's linear weights with --backend cuda: fp8 (kept as e4m3 codes plus block scales, half the memory of bf16; a linear of a few rows reads them directly, a larger one dequantises the weight into a bf16 workspace for cuBLAS) or bf16 (dequantised once at load: twice the memory, no dequantisation per step). Either way every weight has the same bf16 value")
    ("fp8-prefill", po::value(&o.fp8_prefill)->default_value(o.fp8_prefill), "with --fp8-weights fp8 on --backend cuda, how a linear of more than 16 rows (prefill, large batches) runs: w8a8 (the activations quantised to e4m3 per token and 128 features, then cuBLASLt's block-scaled fp8 GEMM on fp8 tensor cores, twice bf16's peak: DeepSeek-V3's own inference recipe, as vLLM and SGLang run such checkpoints; needs cuBLAS 12.9+ on a Hopper GPU, and falls back to bf16 per shape where cuBLASLt declines) or bf16 (the weight dequantised into a bf16 workspace and a bf16 GEMM: unquantised activations, every weight the CPU backend's value)")
    ("fp8-expert-gemm", po::value(&o.fp8_expert_gemm)->default_value(o.fp8_expert_gemm), "with --fp8-prefill w8a8, how the routed experts' GEMMs of more than 16 rows run: grouped (every local expert in one launch of shardlm's grouped W8A8 kernel on fp8 tensor cores, as DeepGEMM's grouped GEMMs serve DeepSeek-V3's MoE, while they average up to 96 rows an expert; more, one cuBLASLt GEMM each) or per-expert (one cuBLASLt block-scaled GEMM per expert always)")
    ("grouped-gemm-core", po::value(&o.grouped_gemm_core)->default_value(o.grouped_gemm_core), "with --backend cuda, the tensor-core products the grouped expert GEMMs (--fp8-expert-gemm grouped, and bf16 experts in CUDA graphs) run on: auto (Hopper's warpgroup wgmma on an sm_90 GPU, the fp8 tensor cores at their own rate, once a self-check before the first use agrees with mma.sync; mma.sync elsewhere) or mma-sync (always mma.sync, on which Hopper runs e4m3 products at the bf16 rate)")
    ("prefill-attention", po::value(&o.prefill_attention)->default_value(o.prefill_attention), "with --backend cuda, how the attention of prefill chunks runs: bf16 (flash attention on tensor cores: the query, the keys and values, and the softmax weights rounded to bf16, fp32 accumulation, as vLLM and TensorRT-LLM run it; up to the bf16 tensor peak), fp32 (the CUDA-core kernels decode uses: every score and weight in fp32, up to the fp32 peak) or auto: bf16 for a bfloat16 or fp8 checkpoint, whose linears already run bf16, fp32 for an fp32 one. MLA models (DeepSeek-V3, Kimi K2) attend on their latent cache the same way")
    ("decode-attention", po::value(&o.decode_attention)->default_value(o.decode_attention), "with --backend cuda, how an MLA model's decode tokens (DeepSeek-V3, Kimi K2) attend on their latent cache: fp32 (a warp a head on the CUDA cores, every score and weight in fp32) or bf16 (on tensor cores with --prefill-attention's bf16 numerics, each token's heads 16 at a time in one pass over its latent rows, as FlashMLA runs DeepSeek-V3 decode in vLLM and SGLang; needs --prefill-attention bf16, or auto on a bfloat16 or fp8 checkpoint). GQA decode stays fp32")
    ("block-size", po::value(&o.block_size)->default_value(o.block_size), "tokens per KV cache block")
    ("threads", po::value(&o.threads)->default_value(o.threads), "CPU threads per rank (0 = all cores)")
    ("flush-every", po::value(&o.flush_every)->default_value(o.flush_every), "flush the HDF5 file every N finished requests")
    ("flush-seconds", po::value(&o.flush_seconds)->default_value(o.flush_seconds), "... and at least every S seconds (0 = off)")
    ("resume", flag(&o.resume), "append to an existing --out, skipping the request ids it already holds (a fresh run when it does not exist)")
    ("progress-interval", po::value(&o.progress_interval)->default_value(o.progress_interval), "seconds between progress lines (0 = none)")
    ("tp", po::value(&o.tp)->default_value(o.tp), "tensor-parallel ranks per pipeline stage")
    ("pp", po::value(&o.pp)->default_value(o.pp), "pipeline stages per replica")
    ("replicas", po::value(&o.replicas)->default_value(o.replicas), "model copies splitting the prompts (0 = ranks / (tp x pp x dp))")
    ("dp", po::value(&o.dp)->default_value(o.dp), "attention data-parallel groups per pipeline stage, each with its own batch (MoE: with --ep they share the experts)")
    ("ep", po::value(&o.ep)->default_value(o.ep), "expert-parallel ranks per stage: 1 (every expert split over tp) or dp x tp (each rank holds 1/ep of the experts); 0 = dp x tp for an MoE model with dp > 1, else 1")
    ("pp-layers", po::value(&o.pp_layers), "layers per pipeline stage, e.g. 3,3,2 (default: balanced)")
    ("comm", po::value(&o.comm)->default_value(o.comm), "communicator of the tp, pp and ep groups: mpi, fabric (libfabric: efa on AWS) or nccl (GPU buffers)")
    ("comm-timeout", po::value(&o.comm_timeout)->default_value(o.comm_timeout), "seconds a rank waits on another before failing the job")
    ("metrics-port", po::value(&o.metrics_port)->default_value(o.metrics_port), "serve Prometheus metrics at http://BIND:PORT/metrics on the writer rank (-1 = off, 0 = any free port)")
    ("metrics-bind", po::value(&o.metrics_bind)->default_value(o.metrics_bind), "address the metrics endpoint listens on")
    ("metrics-file", po::value(&o.metrics_file), "write the metrics to this file every few seconds (node_exporter textfile collector)")
    ("require-efa", flag(&o.require_efa), "fail at start, on every rank, unless every node's libfabric lists the efa provider (the report names the nodes and what they have instead)")
    ("fabric-report", po::value(&o.fabric_report)->default_value(o.fabric_report), "network preflight report: auto (one line per kind of node and the warnings with several ranks, one line alone) | on | line | off")
    ("quiet,q", flag(&o.quiet), "no progress lines");
  // clang-format on
  return d;
}

}  // namespace

bool parse_run_options(int argc, char** argv, RunOptions* out) {
  RunOptions o;
  po::options_description d = describe(o);
  po::options_description all;
  all.add(d).add_options()("help,h", "show this help");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(all).run(), vm);
    if (vm.count("help")) {
      std::cout << "usage: shardlm run --model DIR --prompts FILE --out FILE.h5 [options]\n\n" << d << "\n";
      return false;
    }
    if (vm.count("config")) {
      const std::string path = vm["config"].as<std::string>();
      std::ifstream f(path);
      SHARDLM_CHECK(f, "cannot read job file " << path);
      // Values already set on the command line are kept: po::store never overwrites.
      po::store(po::parse_config_file(f, d, /*allow_unregistered=*/false), vm);
    }
    po::notify(vm);
    decode_stops(&o.stop);
    for (const auto& [name, value] : vm)
      if (!value.defaulted()) o.given.insert(name);
  } catch (const po::error& e) {
    SHARDLM_FAIL("shardlm run: " << e.what() << " (see shardlm run --help)");
  }
  SHARDLM_CHECK(!o.model.empty(), "shardlm run: --model is required");
  SHARDLM_CHECK(!o.prompts.empty(), "shardlm run: --prompts is required");
  SHARDLM_CHECK(!o.out.empty(), "shardlm run: --out is required");
  SHARDLM_CHECK(o.max_seqs >= 1, "--max-seqs must be >= 1, not " << o.max_seqs);
  SHARDLM_CHECK(o.max_batch_tokens >= 1, "--max-batch-tokens must be >= 1, not " << o.max_batch_tokens);
  SHARDLM_CHECK(o.max_logit_rows >= 0, "--max-logit-rows must be >= 0 (0: --max-seqs), not " << o.max_logit_rows);
  SHARDLM_CHECK(o.max_model_len >= 0, "--max-model-len must be >= 0 (0: the model's context), not " << o.max_model_len);
  // Each pipeline micro-batch runs at least one sequence, and the KV cache is sized for --max-seqs.
  SHARDLM_CHECK(o.max_seqs >= o.pp, "--max-seqs " << o.max_seqs << " is below --pp " << o.pp << ": each of the " << o.pp
                                                  << " pipeline micro-batches runs at least one sequence");
  apply_generation_config(&o);
  // What would otherwise fail only once every rank has loaded its weights.
  const std::string bad_sampling = sampling_defaults(o).validate();
  SHARDLM_CHECK(bad_sampling.empty(), "shardlm run: the sampling options: " << bad_sampling);
  SHARDLM_CHECK(o.max_new_tokens >= 1, "--max-new-tokens must be >= 1");
  prompt_format_from_name(o.format);  // throws on an unknown name
  SHARDLM_CHECK(std::ifstream(o.prompts).is_open(), "shardlm run: cannot open --prompts '" << o.prompts << "'");
  parse_kv_cache_gib(o.kv_cache_gb);  // throws on anything but auto or a positive number
  SHARDLM_CHECK(o.kv_cache_free_fraction > 0 && o.kv_cache_free_fraction <= 1,
                "--kv-cache-free-fraction must be in (0, 1], not " << o.kv_cache_free_fraction);
  resolve_kv_dtype(o.kv_dtype, DType::F32);  // the one list of names: throws on any other
  SHARDLM_CHECK(o.fp8_weights == "fp8" || o.fp8_weights == "bf16",
                "--fp8-weights must be fp8 or bf16, not '" << o.fp8_weights << "'");
  SHARDLM_CHECK(o.fp8_prefill == "w8a8" || o.fp8_prefill == "bf16",
                "--fp8-prefill must be w8a8 or bf16, not '" << o.fp8_prefill << "'");
  SHARDLM_CHECK(o.fp8_expert_gemm == "grouped" || o.fp8_expert_gemm == "per-expert",
                "--fp8-expert-gemm must be grouped or per-expert, not '" << o.fp8_expert_gemm << "'");
  SHARDLM_CHECK(o.grouped_gemm_core == "auto" || o.grouped_gemm_core == "mma-sync",
                "--grouped-gemm-core must be auto or mma-sync, not '" << o.grouped_gemm_core << "'");
  prefill_attention_bf16(o.prefill_attention, DType::F32, false);  // throws on an unknown name
  decode_attention_bf16(o.decode_attention, true);                 // likewise
  SHARDLM_CHECK(o.block_size >= 1 && o.block_size <= 1024, "--block-size must be in [1, 1024]");
  SHARDLM_CHECK(o.threads >= 0, "--threads must be >= 0");
  SHARDLM_CHECK(o.flush_every >= 1, "--flush-every must be >= 1");
  SHARDLM_CHECK(o.flush_seconds >= 0, "--flush-seconds must be >= 0");
  SHARDLM_CHECK(o.comm_timeout > 0, "--comm-timeout must be positive");
  SHARDLM_CHECK(o.metrics_port >= -1 && o.metrics_port <= 65535, "--metrics-port must be -1 (off) or in [0, 65535]");
  SHARDLM_CHECK(o.fabric_report == "auto" || o.fabric_report == "on" || o.fabric_report == "line" ||
                    o.fabric_report == "off",
                "--fabric-report must be auto, on, line or off, not '" << o.fabric_report << "'");
  SHARDLM_CHECK(o.ep_graph_capacity >= 0 && std::isfinite(o.ep_graph_capacity),
                "--ep-graph-capacity must be a finite number >= 0");
  parse_expert_wire(o.ep_wire);  // throws on anything but fp32, bf16 or fp8
  SHARDLM_CHECK(!o.cuda_graphs || o.backend == "cuda",
                "--cuda-graphs needs --backend cuda (backend '" << o.backend << "' cannot capture graphs)");
  SHARDLM_CHECK(o.tp >= 1 && o.pp >= 1 && o.replicas >= 0 && o.dp >= 1 && o.ep >= 0,
                "--tp, --pp and --dp must be >= 1, --replicas and --ep >= 0");
  *out = o;
  return true;
}

SamplingParams sampling_defaults(const RunOptions& o) {
  SamplingParams d;
  d.max_tokens = o.max_new_tokens;
  d.temperature = o.temperature;
  d.top_p = o.top_p;
  d.top_k = o.top_k;
  d.min_p = o.min_p;
  d.repetition_penalty = o.repetition_penalty;
  d.frequency_penalty = o.frequency_penalty;
  d.presence_penalty = o.presence_penalty;
  d.seed = o.seed;
  d.stop = o.stop;
  d.ignore_eos = o.ignore_eos;
  return d;
}

std::string to_ini(const RunOptions& o) {
  std::ostringstream s;
  // Numbers as the shortest text that reads back as the same double: the recorded config is compared
  // on --resume and read back as a job file.
  const auto num = [](double v) {
    char buf[32];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    return std::string(buf, r.ptr);
  };
  s << "model = " << o.model << "\nprompts = " << o.prompts << "\nout = " << o.out << "\nformat = " << o.format
    << "\nbackend = " << o.backend << "\ncuda-graphs = " << (o.cuda_graphs ? "true" : "false")
    << "\nop-profile = " << (o.op_profile ? "true" : "false") << "\nep-graph-capacity = " << num(o.ep_graph_capacity)
    << "\nep-wire = " << o.ep_wire << "\nmax-new-tokens = " << o.max_new_tokens
    << "\ntemperature = " << num(o.temperature) << "\ntop-p = " << num(o.top_p) << "\ntop-k = " << o.top_k
    << "\nmin-p = " << num(o.min_p);
  // Only where they penalize: a file written before they existed compares equal to a run without.
  if (o.repetition_penalty != 1.0) s << "\nrepetition-penalty = " << num(o.repetition_penalty);
  if (o.frequency_penalty != 0.0) s << "\nfrequency-penalty = " << num(o.frequency_penalty);
  if (o.presence_penalty != 0.0) s << "\npresence-penalty = " << num(o.presence_penalty);
  s << "\nseed = " << o.seed << "\ngeneration-config = " << o.generation_config;
  for (const auto& st : o.stop) s << "\nstop = " << ini_quoted(st);
  s << "\nignore-eos = " << (o.ignore_eos ? "true" : "false") << "\nmax-batch-tokens = " << o.max_batch_tokens
    << "\nmax-seqs = " << o.max_seqs << "\nmax-logit-rows = " << o.max_logit_rows
    << "\nmax-model-len = " << o.max_model_len << "\nkv-cache-gb = " << o.kv_cache_gb
    << "\nkv-cache-free-fraction = " << num(o.kv_cache_free_fraction) << "\nkv-dtype = " << o.kv_dtype;
  if (!o.kv_scales.empty()) s << "\nkv-scales = " << o.kv_scales;
  if (!o.kv_calibrate_out.empty()) s << "\nkv-calibrate-out = " << o.kv_calibrate_out;
  s << "\nfp8-weights = " << o.fp8_weights << "\nfp8-prefill = " << o.fp8_prefill
    << "\nfp8-expert-gemm = " << o.fp8_expert_gemm << "\ngrouped-gemm-core = " << o.grouped_gemm_core
    << "\nprefill-attention = " << o.prefill_attention << "\ndecode-attention = " << o.decode_attention
    << "\nblock-size = " << o.block_size << "\nthreads = " << o.threads << "\nflush-every = " << o.flush_every
    << "\nflush-seconds = " << num(o.flush_seconds) << "\nresume = " << (o.resume ? "true" : "false")
    << "\ntp = " << o.tp << "\npp = " << o.pp << "\nreplicas = " << o.replicas << "\ndp = " << o.dp
    << "\nep = " << o.ep;
  if (!o.pp_layers.empty()) s << "\npp-layers = " << o.pp_layers;
  s << "\ncomm = " << o.comm << "\ncomm-timeout = " << num(o.comm_timeout)
    << "\nrequire-efa = " << (o.require_efa ? "true" : "false") << "\nfabric-report = " << o.fabric_report << "\n";
  return s.str();
}

bool prefill_attention_bf16(const std::string& choice, DType checkpoint_dtype, bool fp8_block) {
  SHARDLM_CHECK(choice == "auto" || choice == "bf16" || choice == "fp32",
                "--prefill-attention must be auto, bf16 or fp32, not '" << choice << "'");
  if (choice == "auto") return checkpoint_dtype == DType::BF16 || fp8_block;
  return choice == "bf16";
}

bool decode_attention_bf16(const std::string& choice, bool prefill_bf16) {
  SHARDLM_CHECK(choice == "fp32" || choice == "bf16",
                "--decode-attention must be fp32 or bf16, not '" << choice << "'");
  SHARDLM_CHECK(choice == "fp32" || prefill_bf16,
                "--decode-attention bf16 needs prefill attention on bf16 tensor cores too (--prefill-attention "
                "bf16; auto keeps fp32 for an fp32 checkpoint)");
  return choice == "bf16";
}

}  // namespace shardlm
