// shardlm bench: prefill and decode tokens/s of a model on this machine, beside its ceilings
// (memory bandwidth for decode, the FLOP peak for prefill and batched decode) and a peer's
// published figure for the same shape. On the CPU the ceilings are measured (bandwidth, fp32 FMA
// peak); with --backend cuda they are the GPU's datasheet figures, with the measured device
// bandwidth and cuBLAS GEMM TFLOP/s at the model's shapes beside them. It also times the backend's
// sample op and the attention op alone, decode on long contexts and prefill chunks
// (bench_attention.h).
#include <boost/program_options.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>
#include <iostream>

#include "arch/model.h"
#include "cli/bench_attention.h"
#include "cli/commands.h"
#include "cli/kv_budget.h"
#include "cli/run_options.h"
#include "cli/subcommand.h"
#include "compute/backend.h"
#include "compute/op_profile.h"
#include "core/error.h"
#include "cpu/ceilings.h"
#include "cpu/threads.h"
#include "engine/engine.h"
#include "engine/kv_cache.h"
#include "engine/rng.h"
#include "model/checkpoint.h"
#include "model/model_spec.h"
#include "plan/gpu_specs.h"
#include "tokenizer/tokenizer.h"

namespace po = boost::program_options;

namespace shardlm {

namespace {

class SyntheticSource final : public RequestSource {
 public:
  SyntheticSource(int64_t n, int64_t prompt_len, int64_t max_tokens, int64_t vocab)
      : n_(n), len_(prompt_len), max_tokens_(max_tokens), vocab_(vocab) {}
  std::optional<ParsedRequest> next() override {
    if (i_ >= n_) return std::nullopt;
    ParsedRequest r;
    r.id = "bench-" + std::to_string(i_);
    r.line = ++i_;
    std::vector<int32_t> ids(len_);
    for (int64_t j = 0; j < len_; ++j) ids[j] = static_cast<int32_t>(mix64(i_ * 1000003 + j) % vocab_);
    r.prompt_token_ids = ids;
    r.overrides.max_tokens = max_tokens_;
    r.overrides.ignore_eos = true;
    return r;
  }

 private:
  int64_t n_, len_, max_tokens_, vocab_, i_ = 0;
};

class KeepSink final : public ResultSink {
 public:
  void on_result(const RequestResult& r) override { results.push_back(r); }
  void on_step(const StepRecord&) override {}
  std::vector<RequestResult> results;
};

struct Scenario {
  RunStats stats;
  std::vector<RequestResult> results;
};

Scenario run_scenario(Model& model, const Tokenizer& tok, EngineConfig ec, int64_t n,
                      int64_t prompt_len, int64_t max_tokens) {
  ec.progress_interval_s = 0;
  Engine engine(model, tok, ec);
  SyntheticSource src(n, prompt_len, max_tokens, model.spec().vocab_size);
  KeepSink sink;
  Scenario s;
  s.stats = engine.run(src, sink);
  s.results = std::move(sink.results);
  for (const auto& r : s.results) SHARDLM_CHECK(r.error.empty(), "bench request failed: " << r.error);
  return s;
}

// "12.3% of NAME" where the peak is known; an unknown device (no datasheet entry, the emulated
// runtime) has none, and a made-up one would only print a meaningless share.
std::string share_of(double gflops, double peak_gflops, const std::string& peak_name) {
  if (peak_gflops <= 0) return "no " + peak_name + " known for this device";
  char buf[160];
  std::snprintf(buf, sizeof buf, "%.1f%% of %s", 100.0 * gflops / peak_gflops, peak_name.c_str());
  return buf;
}

// The GPU's ceilings: the datasheet's (src/plan/gpu_specs.h) when the device is a known one, the
// measured device bandwidth otherwise; cuBLAS GEMMs at the model's projection shapes (and a square
// one of peak_gemm a side, when not 0) are printed beside them so that a slow model step can be
// told from a slow GEMM.
void gpu_ceilings(ComputeBackend& b, const DeviceCeilings& c, const ModelSpec& spec, int64_t prompt_len,
                  int64_t peak_gemm, double* bw_gbs, double* peak_gflops, double* fp32_gflops) {
  std::printf("%s\n", c.text.c_str());
  *bw_gbs = c.bw_gbs;
  *peak_gflops = c.peak_gflops;
  *fp32_gflops = c.fp32_gflops;
  const int64_t H = spec.hidden_size, I = spec.intermediate_size;
  std::vector<std::array<int64_t, 3>> shapes = {{prompt_len, 3 * H, H}, {prompt_len, 2 * I, H}, {prompt_len, H, I}};
  if (peak_gemm > 0) shapes.push_back({peak_gemm, peak_gemm, peak_gemm});
  for (const auto& s : shapes) {
    const GemmFigure f = b.time_linear_gemm(s[0], s[1], s[2], /*bf16=*/true);
    std::printf("  cuBLAS bf16 GEMM %lld x %lld x %lld: %.4g TFLOP/s (%s)\n", static_cast<long long>(f.m),
                static_cast<long long>(f.n), static_cast<long long>(f.k), f.tflops,
                share_of(f.tflops * 1e3, *peak_gflops, "bf16 tensor peak").c_str());
  }
  // Linears on weights kept fp8 against the same linear on bf16 weights (activation casts
  // included), at decode's row counts (1 and 16: the fp8 codes read directly) and past them (64:
  // dequantised into a workspace for cuBLAS), on the gate/up shape and the square one. A decode
  // linear streams its weight once: its ceiling is the weight's bytes at the bandwidth.
  std::vector<std::array<int64_t, 2>> fp8_shapes = {{2 * I, H}};
  if (peak_gemm > 0) fp8_shapes.push_back({peak_gemm, peak_gemm});
  for (const auto& s : fp8_shapes)
    for (int64_t m : {1, 16, 64}) {
      const GemmFigure f8 = b.time_linear(m, s[0], s[1], DType::F8_E4M3);
      const GemmFigure bf = b.time_linear(m, s[0], s[1], DType::BF16);
      std::printf(
          "  linear %lld x %lld x %lld, fp8 weights: %.2f us, %.1f GB/s of weights (%.1f%% of %.0f GB/s), "
          "%.4g TFLOP/s; bf16 weights: %.2f us, %.1f GB/s\n",
          static_cast<long long>(m), static_cast<long long>(s[0]), static_cast<long long>(s[1]), f8.seconds * 1e6,
          f8.weight_gbs, 100.0 * f8.weight_gbs / *bw_gbs, *bw_gbs, f8.tflops, bf.seconds * 1e6, bf.weight_gbs);
    }
  // Prefill-sized linears on fp8 weights, both ways: W8A8 (activations quantised to e4m3, the
  // block-scaled GEMM on fp8 tensor cores; its ceiling the dense fp8 peak) and the weight
  // dequantised to bf16 for a bf16 GEMM (the bf16 peak). The first says "fp8" where cuBLASLt
  // declined the shape and it fell back.
  const bool w8a8 = b.fp8_w8a8();
  for (const auto& s : fp8_shapes) {
    const int64_t m = peak_gemm > 0 && s[0] == peak_gemm ? peak_gemm : prompt_len;
    b.set_fp8_w8a8(true);
    const GemmFigure q = b.time_linear(m, s[0], s[1], DType::F8_E4M3);
    b.set_fp8_w8a8(false);
    const GemmFigure d = b.time_linear(m, s[0], s[1], DType::F8_E4M3);
    const double fp8_peak = c.fp8_gflops > 0 ? c.fp8_gflops : 2 * *peak_gflops;
    char fp8_name[64], bf16_name[64];
    std::snprintf(fp8_name, sizeof fp8_name, "%.0f dense fp8", fp8_peak / 1e3);
    std::snprintf(bf16_name, sizeof bf16_name, "%.0f dense bf16", *peak_gflops / 1e3);
    std::printf(
        "  linear %lld x %lld x %lld, fp8 weights as %s: %.4g TFLOP/s (%s); dequantised to bf16: %.4g TFLOP/s "
        "(%s); %.2fx\n",
        static_cast<long long>(m), static_cast<long long>(s[0]), static_cast<long long>(s[1]), q.dtype.c_str(),
        q.tflops, share_of(q.tflops * 1e3, fp8_peak, fp8_peak > 0 ? fp8_name : "fp8 tensor peak").c_str(), d.tflops,
        share_of(d.tflops * 1e3, *peak_gflops, *peak_gflops > 0 ? bf16_name : "bf16 tensor peak").c_str(),
        d.seconds / q.seconds);
  }
  b.set_fp8_w8a8(w8a8);
}

// Microseconds per row of the backend's sample op on R random rows of V logits (backend memory),
// best of a few runs, for greedy, temperature, temperature + top-p, + top-k, + min-p and top-p
// (the cuts in vLLM's order), greedy with vLLM's three penalties on 1024 seen tokens a row (an
// edited copy of the rows first), and greedy kept to 128 allowed tokens, 4 of them biased (vLLM's
// allowed_token_ids and logit_bias: the copy barred, then those written); the ceiling is one read of a row at the
// memory bandwidth (every mode reads the row at least once).
void print_sampling(ComputeBackend& b, int64_t V, double bw_gbs) {
  constexpr int64_t R = 64;
  std::vector<float> host(static_cast<size_t>(R * V));
  std::mt19937 g(5);
  std::normal_distribution<float> d(0.0f, 4.0f);
  for (float& x : host) x = d(g);
  float* logits = static_cast<float*>(b.alloc(host.size() * sizeof(float)));
  b.copy_to_device(logits, host.data(), host.size() * sizeof(float));
  std::vector<int32_t> tokens(R), top_tokens(static_cast<size_t>(R * kMaxTopLogprobs));
  std::vector<float> logprobs(R), top_logprobs(top_tokens.size());
  constexpr int64_t kSeen = 1024;
  std::vector<TokenEdit> seen(static_cast<size_t>(R * kSeen));
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t i = 0; i < kSeen; ++i)
      seen[static_cast<size_t>(r * kSeen + i)] = {static_cast<int32_t>((i + 31 * r) % V), static_cast<int32_t>(i % 3)};
  }
  constexpr int64_t kAllowed = 128;
  std::vector<TokenEdit> allowed_edits(static_cast<size_t>(R * kAllowed));
  const int64_t spacing = std::max<int64_t>(1, V / kAllowed);  // spread over the vocabulary, distinct
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t i = 0; i < kAllowed; ++i) {
      TokenEdit& e = allowed_edits[static_cast<size_t>(r * kAllowed + i)];
      e = {static_cast<int32_t>((i * spacing + r % spacing) % V), -1, i < 4 ? 2.0f : 0.0f, 1};
    }
  }
  // top_n: each row's alternatives too (vLLM's logprobs); scored: rows that take a given token
  // (prompt logprobs); allowed: rows kept to their allowed tokens.
  auto per_row_us = [&](double temperature, double top_p, int64_t top_k, double min_p = 0.0, bool penalized = false,
                        int32_t top_n = 0, bool scored = false, bool allowed = false) {
    std::vector<SampleRow> rows(R);
    for (int64_t r = 0; r < R; ++r) {
      rows[r].top_n = top_n;
      rows[r].top_begin = r * top_n;
      if (scored) rows[r].target = static_cast<int32_t>((r * 7919) % V);
      rows[r].temperature = temperature;
      rows[r].top_p = top_p;
      rows[r].top_k = top_k;
      rows[r].min_p = min_p;
      rows[r].seed = 17;
      rows[r].position = r;
      if (penalized) {
        rows[r].repetition_penalty = 1.1f;
        rows[r].frequency_penalty = 0.5f;
        rows[r].presence_penalty = 0.5f;
        rows[r].edits_begin = r * kSeen;
        rows[r].edits_count = kSeen;  // distinct where V >= kSeen
      }
      if (allowed) {
        rows[r].allowed_only = true;
        rows[r].edits_begin = r * kAllowed;
        rows[r].edits_count = kAllowed;  // distinct where V >= kAllowed
      }
    }
    double best = 1e30;
    for (int it = 0; it < 4; ++it) {  // the first run also sizes the backend's buffers
      const auto t0 = std::chrono::steady_clock::now();
      b.sample(logits, R, V, rows.data(), allowed ? allowed_edits.data() : seen.data(), tokens.data(), logprobs.data(),
               top_tokens.data(), top_logprobs.data());
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (it > 0) best = std::min(best, s);
    }
    return best * 1e6 / R;
  };
  const double greedy = per_row_us(0.0, 1.0, 0), temp = per_row_us(0.8, 1.0, 0);
  const double top_p = per_row_us(0.8, 0.9, 0), top_k = per_row_us(0.8, 1.0, 50);
  const double min_p = per_row_us(0.8, 0.9, 0, 0.05);
  char penalized[64] = "n/a (a vocabulary below the seen tokens)";
  if (V >= kSeen) std::snprintf(penalized, sizeof penalized, "%.1f", per_row_us(0.0, 1.0, 0, 0.0, true));
  const int32_t top = static_cast<int32_t>(std::min<int64_t>(kMaxTopLogprobs, V));
  const double greedy_top = per_row_us(0.0, 1.0, 0, 0.0, false, top);
  const double scored = per_row_us(0.0, 1.0, 0, 0.0, false, 0, true);
  const double scored_top = per_row_us(0.0, 1.0, 0, 0.0, false, top, true);
  char allowed[64] = "n/a (a vocabulary below the allowed tokens)";
  if (V >= kAllowed)
    std::snprintf(allowed, sizeof allowed, "%.1f", per_row_us(0.0, 1.0, 0, 0.0, false, 0, false, true));
  std::printf(
      "sampling %lld rows x %lld vocab:      greedy %.1f, temperature 0.8 %.1f, + top-p 0.9 %.1f, "
      "+ top-k 50 %.1f, + min-p 0.05 and top-p 0.9 %.1f, greedy with penalties on %lld seen tokens %s, "
      "greedy with %d top logprobs %.1f, scored (prompt logprobs) %.1f, scored with %d top logprobs %.1f, "
      "greedy with %lld allowed tokens (4 biased) %s us/row  (one read of a row at %.0f GB/s: %.2f us)\n",
      static_cast<long long>(R), static_cast<long long>(V), greedy, temp, top_p, top_k, min_p,
      static_cast<long long>(kSeen), penalized, top, greedy_top, scored, top, scored_top,
      static_cast<long long>(kAllowed), allowed, bw_gbs, static_cast<double>(V) * 4.0 / (bw_gbs * 1e3));
  b.free(logits);
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  std::string model_dir, backend_name = "cpu", kv_dtype = "auto";
  int64_t prompt_len = 512, decode_tokens = 128, batch = 64, batch_in = 128, batch_out = 128;
  int64_t peak_gemm = 8192, attention_context = 32768;
  int threads = 0;
  std::string kv_gb = "auto", fp8_weights = "fp8", fp8_prefill = "w8a8", prefill_attention = "auto",
              decode_attention = "fp32", fp8_expert_gemm = "grouped", grouped_gemm_core = "auto";
  bool cuda_graphs = false, op_profile = false;
  double kv_fraction = 0.9;
  po::options_description d("shardlm bench options");
  // clang-format off
  d.add_options()
    ("model", po::value(&model_dir), "model directory (e.g. made by make-model from inputs/models/bench-1024.json)")
    ("prompt-len", po::value(&prompt_len)->default_value(prompt_len), "prefill scenario: prompt tokens")
    ("decode-tokens", po::value(&decode_tokens)->default_value(decode_tokens), "decode scenario: tokens generated at batch 1")
    ("batch", po::value(&batch)->default_value(batch), "batched scenario: sequences")
    ("batch-in", po::value(&batch_in)->default_value(batch_in), "batched scenario: prompt tokens per sequence")
    ("batch-out", po::value(&batch_out)->default_value(batch_out), "batched scenario: output tokens per sequence")
    ("backend", po::value(&backend_name)->default_value(backend_name), "compute backend: cpu or cuda")
    ("threads", po::value(&threads)->default_value(threads), "CPU threads (0 = all cores)")
    ("kv-cache-gb", po::value(&kv_gb)->default_value(kv_gb), "KV cache budget, GiB, or auto (as shardlm run: on a GPU --kv-cache-free-fraction of the memory free after loading and the profile steps, on the CPU 4)")
    ("kv-cache-free-fraction", po::value(&kv_fraction)->default_value(kv_fraction), "with --kv-cache-gb auto on a GPU: the share of the free device memory (after the profile steps) the KV cache takes")
    ("kv-dtype", po::value(&kv_dtype)->default_value(kv_dtype), "KV cache of the scenarios: auto (bf16 for a bfloat16 checkpoint, as shardlm run), fp32, bf16 or fp8")
    ("attention-context", po::value(&attention_context)->default_value(attention_context), "attention alone: the longest cached context decode is timed at (also at 4096); 0 skips the attention timings")
    ("peak-gemm", po::value(&peak_gemm)->default_value(peak_gemm), "with --backend cuda: also time a square bf16 GEMM of this side beside the peak, and fp8- and bf16-weight linears of that shape (0: only the model's shapes)")
    ("fp8-weights", po::value(&fp8_weights)->default_value(fp8_weights), "an fp8 checkpoint's linear weights with --backend cuda: fp8 (kept) or bf16 (dequantised at load), as shardlm run")
    ("fp8-prefill", po::value(&fp8_prefill)->default_value(fp8_prefill), "with --fp8-weights fp8: linears past 16 rows as W8A8 block-scaled fp8 GEMMs (w8a8) or on the weight dequantised to bf16 (bf16), as shardlm run")
    ("fp8-expert-gemm", po::value(&fp8_expert_gemm)->default_value(fp8_expert_gemm), "with --fp8-prefill w8a8 on an MoE model: the routed experts' GEMMs of more than 16 rows in one grouped launch (grouped) or one per expert (per-expert), as shardlm run")
    ("grouped-gemm-core", po::value(&grouped_gemm_core)->default_value(grouped_gemm_core), "with --backend cuda: the grouped expert GEMMs on wgmma where the GPU has it (auto) or on mma.sync always (mma-sync), as shardlm run")
    ("prefill-attention", po::value(&prefill_attention)->default_value(prefill_attention), "with --backend cuda: prefill chunks' attention on bf16 tensor cores (bf16), in fp32 (fp32), or auto (bf16 for a bfloat16 or fp8 checkpoint), as shardlm run; the attention lines time both")
    ("decode-attention", po::value(&decode_attention)->default_value(decode_attention), "with --backend cuda on an MLA model: decode tokens' attention on bf16 tensor cores (bf16, beside prefill attention there) or in fp32 (fp32), as shardlm run; the attention decode lines then time both")
    ("cuda-graphs", po::bool_switch(&cuda_graphs), "also run the decode and batched scenarios with decode steps replayed from CUDA graphs (as shardlm run --cuda-graphs), beside the eager figures")
    ("op-profile", po::bool_switch(&op_profile), "run the prefill, decode and batched scenarios once more with each step's time split by op group (attention, MLP, MoE, norms, head, sampling; on CUDA device time between events), eager")
    ;
  // clang-format on
  po::variables_map vm;
  if (!parse_subcommand(argc, argv, "bench", "shardlm bench --model DIR [options]", d, &vm)) return 0;
  SHARDLM_CHECK(!model_dir.empty(), "shardlm bench: --model is required");
  SHARDLM_CHECK(prompt_len > 0 && decode_tokens > 1 && batch > 0 && batch_in > 0 && batch_out > 1 &&
                    attention_context >= 0 && peak_gemm >= 0,
                "shardlm bench: sizes must be positive (decode and batch-out at least 2; attention-context and "
                "peak-gemm 0 or more)");
  SHARDLM_CHECK(fp8_weights == "fp8" || fp8_weights == "bf16",
                "shardlm bench: --fp8-weights must be fp8 or bf16, not '" << fp8_weights << "'");
  SHARDLM_CHECK(fp8_prefill == "w8a8" || fp8_prefill == "bf16",
                "shardlm bench: --fp8-prefill must be w8a8 or bf16, not '" << fp8_prefill << "'");
  SHARDLM_CHECK(fp8_expert_gemm == "grouped" || fp8_expert_gemm == "per-expert",
                "shardlm bench: --fp8-expert-gemm must be grouped or per-expert, not '" << fp8_expert_gemm << "'");
  SHARDLM_CHECK(grouped_gemm_core == "auto" || grouped_gemm_core == "mma-sync",
                "shardlm bench: --grouped-gemm-core must be auto or mma-sync, not '" << grouped_gemm_core << "'");
  cpu::set_num_threads(threads);

  ModelSpec spec = ModelSpec::load(model_dir);
  const DType cache_dtype = resolve_kv_dtype(kv_dtype, spec.torch_dtype);
  std::unique_ptr<Tokenizer> tok = Tokenizer::load(model_dir);
  std::unique_ptr<Checkpoint> ckpt = Checkpoint::open(model_dir);
  std::unique_ptr<ComputeBackend> backend = make_backend(backend_name);
  backend->set_keep_fp8_weights(fp8_weights == "fp8");
  backend->set_fp8_w8a8(fp8_prefill == "w8a8");
  backend->set_fp8_grouped_gemm(fp8_expert_gemm == "grouped");
  backend->set_grouped_gemm_wgmma(grouped_gemm_core == "auto");
  const bool prefill_bf16 = prefill_attention_bf16(prefill_attention, spec.torch_dtype, spec.quant.fp8_block);
  backend->set_prefill_attention_bf16(prefill_bf16);
  backend->set_decode_attention_bf16(decode_attention_bf16(decode_attention, prefill_bf16));
  std::unique_ptr<Model> model = build_model(spec, *ckpt, *backend);
  // The weights' bytes: the checkpoint's, or for an fp8 checkpoint a device dequantised at load,
  // what the device holds (its linears twice their fp8 bytes).
  const bool widened = spec.quant.fp8_block && !backend->keeps_fp8_weights() && backend->device_weight_bytes() > 0;
  const double weight_bytes = static_cast<double>(widened ? backend->device_weight_bytes() : ckpt->total_bytes());
  double params = 0, routed_params = 0, routed_bytes = 0;
  for (const auto& name : ckpt->names()) {
    const bool fp8_scales = name.size() > 10 && name.compare(name.size() - 10, 10, "_scale_inv") == 0;
    // Routed experts ("mlp.experts.E." or Mixtral's "block_sparse_moe.experts.E."; not the shared ones).
    const bool routed = spec.moe.enabled() && name.find(".experts.") != std::string::npos;
    const TensorView& t = ckpt->get(name);
    if (routed) routed_bytes += static_cast<double>(t.nbytes);
    if (fp8_scales) continue;
    params += static_cast<double>(t.numel());
    if (routed) routed_params += static_cast<double>(t.numel());
  }
  // A token goes through k of the E routed experts: decode at batch 1 streams those and every
  // other weight, and multiplies through the same.
  const double unused =
      spec.moe.enabled() ? 1.0 - static_cast<double>(spec.moe.experts_per_token) / spec.moe.num_experts : 0.0;
  const double decode_bytes =
      weight_bytes * (1.0 - unused * routed_bytes / static_cast<double>(std::max<size_t>(ckpt->total_bytes(), 1)));
  // Per generated token the matmuls cost 2 FLOP per weight (the embedding is a gather, not a matmul).
  const double embed = static_cast<double>(spec.vocab_size * spec.hidden_size);
  const double flop_per_token = 2.0 * (params - (spec.tie_word_embeddings ? 0.0 : embed) - unused * routed_params);

  // A backend with device ceilings runs on an accelerator: its figures stand beside those, not the CPU's.
  DeviceCeilings device;
  const bool gpu = backend->measure_device_ceilings(&device);
  std::printf("shardlm bench: %s (%s, %.1fM parameters, %.0f MB of weights), backend %s, %d threads, %s KV cache\n",
              model_dir.c_str(), spec.architecture.c_str(), params / 1e6, weight_bytes / 1e6, backend->name().c_str(),
              cpu::num_threads(), kv_dtype_name(cache_dtype));
  double bw = 0, peak = 0, fp32_peak = 0;  // GB/s; GFLOP/s of the matmuls' dtype and of fp32
  const char* peak_name = "fp32 FMA peak";
  if (gpu) {
    gpu_ceilings(*backend, device, spec, prompt_len, peak_gemm, &bw, &peak, &fp32_peak);
    peak_name = "bf16 tensor peak";
    // An fp8 checkpoint's prefill GEMMs run W8A8 on fp8 tensor cores: their ceiling is that peak.
    if (spec.quant.fp8_block && backend->keeps_fp8_weights() && backend->fp8_w8a8() && device.fp8_gflops > 0) {
      peak = device.fp8_gflops;
      peak_name = "fp8 tensor peak (W8A8)";
    }
  } else {
    bw = cpu::measure_memory_bandwidth(4).best();
    peak = fp32_peak = cpu::measure_fma_peak_gflops(300);
    std::printf("machine: memory bandwidth %.1f GB/s, fp32 FMA peak %.1f GFLOP/s\n", bw, peak);
  }
  if (spec.moe.enabled())
    std::printf(
        "MoE: %lld of %lld routed experts per token: %.0f MB of weights streamed and %.1fM multiplied per "
        "token\n",
        static_cast<long long>(spec.moe.experts_per_token), static_cast<long long>(spec.moe.num_experts),
        decode_bytes / 1e6, flop_per_token / 2e6);
  std::printf("ceilings for this model: decode (batch 1, weights streamed once per token) %.1f tok/s; ",
              bw * 1e9 / decode_bytes);
  if (peak > 0) {
    std::printf("compute-bound tokens (prefill, batched decode) %.1f tok/s\n\n", peak * 1e9 / flop_per_token);
  } else {
    std::printf("compute-bound tokens: no %s known for this device\n\n", peak_name);
  }

  // Sized once, after loading: each scenario's engine frees the last one's cache before making its own.
  EngineConfig ec;
  ec.kv_dtype = cache_dtype;
  ec.scheduler.max_seqs = std::max<int64_t>(batch, 1);
  // No scenario's step is larger than its prompt or its batch's prompts: a larger budget would only
  // size the profile steps past anything the scenarios run.
  const int64_t scenario_batch_tokens = std::max<int64_t>(prompt_len, std::min<int64_t>(2048, batch * batch_in));
  ec.scheduler.max_batch_tokens = scenario_batch_tokens;
  ProfileResult profile;
  if (kv_budget_profiles(kv_gb, *backend))
    profile = run_profile_steps(*model, *backend, true, ec.scheduler, cache_dtype);
  const KvBudget kv_budget = kv_cache_budget(kv_gb, kv_fraction, *backend, 1, profile);
  std::printf("KV cache budget %s (%s)\n\n", memory_text(static_cast<double>(kv_budget.bytes)).c_str(),
              kv_budget.how.c_str());
  ec.kv_cache_bytes = kv_budget.bytes;

  // 1. Prefill: one prompt in one step; the time to its first token is the prefill time.
  Scenario pre = run_scenario(*model, *tok, ec, 1, prompt_len, 1);
  const double prefill_tps = prompt_len / (pre.results[0].t_first_token - pre.results[0].t_queued);
  std::printf("prefill  %5lld-token prompt:          %8.1f tok/s  (%.1f GFLOP/s, %s%s)\n",
              static_cast<long long>(prompt_len), prefill_tps, prefill_tps * flop_per_token / 1e9,
              share_of(prefill_tps * flop_per_token / 1e9, peak, peak_name).c_str(),
              gpu ? "" : "; llama.cpp BF16 2 threads: 181");

  // 2. Decode at batch 1: tokens after the first, over the time after the first.
  Scenario dec = run_scenario(*model, *tok, ec, 1, 16, decode_tokens);
  const RequestResult& r = dec.results[0];
  const double decode_tps = (r.output_tokens.size() - 1) / (r.t_finished - r.t_first_token);
  std::printf("decode   batch 1:                    %8.1f tok/s  (%.1f GB/s of weights, %.1f%% of bandwidth%s)\n",
              decode_tps, decode_tps * decode_bytes / 1e9, 100.0 * decode_tps * decode_bytes / 1e9 / bw,
              gpu ? "" : "; llama.cpp: 33.5");

  // 3. Batched: many sequences of batch_in prompt + batch_out output, continuous batching.
  ec.scheduler.max_batch_tokens = 2048;
  Scenario bat = run_scenario(*model, *tok, ec, batch, batch_in, batch_out);
  const double total_tps = bat.stats.total_tokens_per_s();
  std::printf(
      "batched  %lld x (%lld in + %lld out):   %8.1f tok/s total, %.1f output tok/s, %.1f s  (%.1f GFLOP/s, %s%s)\n",
      static_cast<long long>(batch), static_cast<long long>(batch_in), static_cast<long long>(batch_out), total_tps,
      bat.stats.output_tokens_per_s(), bat.stats.wall_s, total_tps * flop_per_token / 1e9,
      share_of(total_tps * flop_per_token / 1e9, peak, peak_name).c_str(), gpu ? "" : "; llama.cpp: 47 total");

  // 3a. Where the scenarios' steps' time goes, eager (before any graph is enabled).
  if (op_profile) {
    OpProfile prof(*backend);
    backend->set_op_profile(&prof);
    ec.scheduler.max_batch_tokens = scenario_batch_tokens;
    run_scenario(*model, *tok, ec, 1, prompt_len, 1);
    const OpProfile::Totals prefill = prof.totals("prefill");
    prof.reset();
    const Scenario pdec = run_scenario(*model, *tok, ec, 1, 16, decode_tokens);
    const OpProfile::Totals decode = prof.totals("decode");
    // The batched scenario's steps: prompts with decode tokens riding along, then decode steps
    // of many sequences.
    prof.reset();
    ec.scheduler.max_batch_tokens = 2048;
    const Scenario pbat = run_scenario(*model, *tok, ec, batch, batch_in, batch_out);
    backend->set_op_profile(nullptr);
    const RequestResult& p = pdec.results[0];
    const double profiled_tps = (p.output_tokens.size() - 1) / (p.t_finished - p.t_first_token);
    const std::string batched = "op profile, batched " + std::to_string(batch) + " x (" + std::to_string(batch_in) +
                                " in + " + std::to_string(batch_out) + " out), ";
    std::printf(
        "\n%s",
        format_op_profile(prefill, "op profile, prefill " + std::to_string(prompt_len) + "-token prompt").c_str());
    std::printf("%s", format_op_profile(decode, "op profile, decode batch 1").c_str());
    std::printf(
        "  (profiled decode %.1f tok/s, unprofiled %.1f: the marks' own cost; weights GB/s against %s %.0f GB/s)\n",
        profiled_tps, decode_tps, gpu ? "the device's" : "the measured", bw);
    std::printf("%s", format_op_profile(prof.totals("prefill"), batched + "steps with prompt tokens").c_str());
    std::printf("%s", format_op_profile(prof.totals("decode"), batched + "decode steps").c_str());
    std::printf("  (profiled batched %.1f tok/s total, unprofiled %.1f)\n\n", pbat.stats.total_tokens_per_s(),
                total_tps);
  }

  // 3b. The same two with decode steps replayed from CUDA graphs: launch and host overhead off the
  //     step, against the eager figures of this run.
  if (cuda_graphs) {
    const std::string why = model->enable_step_graphs();
    if (!why.empty()) {
      std::printf("CUDA graphs: not used (%s)\n", why.c_str());
    } else {
      ec.scheduler.max_batch_tokens = scenario_batch_tokens;  // as the eager decode scenario ran
      Scenario gdec = run_scenario(*model, *tok, ec, 1, 16, decode_tokens);
      const RequestResult& g = gdec.results[0];
      const double graph_tps = (g.output_tokens.size() - 1) / (g.t_finished - g.t_first_token);
      std::printf(
          "decode   batch 1, CUDA graphs:       %8.1f tok/s  (%.1f%% of bandwidth; eager %.1f tok/s: x%.2f; "
          "replayed steps: %lld)\n",
          graph_tps, 100.0 * graph_tps * decode_bytes / 1e9 / bw, decode_tps, graph_tps / decode_tps,
          static_cast<long long>(model->graph_steps()));
      // What a replay runs one node after another: with some microseconds of device time a node
      // whatever its work, the count bounds a small model's step from below.
      if (const int64_t nodes = model->graph_nodes(1); nodes > 0)
        std::printf("  a batch-1 step's graph: %lld nodes (kernels, copies, library calls), %.2f us a node\n",
                    static_cast<long long>(nodes), 1e6 / graph_tps / static_cast<double>(nodes));
      ec.scheduler.max_batch_tokens = 2048;
      const int64_t before = model->graph_steps();
      Scenario gbat = run_scenario(*model, *tok, ec, batch, batch_in, batch_out);
      const double graph_total = gbat.stats.total_tokens_per_s();
      std::printf(
          "batched  %lld x (%lld in + %lld out), CUDA graphs: %8.1f tok/s total, %.1f output tok/s  (eager "
          "%.1f tok/s total: x%.2f; replayed steps: %lld)\n",
          static_cast<long long>(batch), static_cast<long long>(batch_in), static_cast<long long>(batch_out),
          graph_total, gbat.stats.output_tokens_per_s(), total_tps, graph_total / total_tps,
          static_cast<long long>(model->graph_steps() - before));
    }
  }

  // 4. Sampling: the backend's sample op (where the engine samples) on rows of the model's vocabulary.
  print_sampling(*backend, spec.vocab_size, bw);

  // 5. Attention alone: decode on long contexts against the bandwidth, prefill chunks against the
  //    peak of the units they ran on (bf16 tensor cores or fp32).
  if (attention_context == 0) return 0;
  try {
    AttentionPeaks peaks;
    peaks.fp32_gflops = fp32_peak;
    peaks.bf16_gflops = gpu ? device.peak_gflops : 0.0;
    print_attention_bench(*backend, spec, bw, peaks, attention_context);
  } catch (const Error& e) {  // e.g. a head_dim the backend's kernel does not take
    std::printf("attention decode: not timed (%s)\n", e.what());
  }
  return 0;
}

}  // namespace shardlm
