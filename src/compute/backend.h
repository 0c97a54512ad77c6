// ComputeBackend: the op interface model code is written against.
//
// Pointers passed to ops are backend memory (host memory for "cpu", device memory for "cuda").
// Activations are fp32 (with a bf16 twin where the op that wrote them gave one: Activations).
// Weights are loaded once through load_matrix / load_vector, which may keep a zero-copy view of
// the memory-mapped checkpoint (cpu) or copy to the device.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "compute/device_ceilings.h"
#include "cpu/expert_exchange.h"
#include "sample_rules.h"
#include "core/dtype.h"

namespace shardlm {

struct TensorView;
class OpProfile;

// The block scales of an fp8 weight kept as fp8 (model/fp8_block.h): element (r, c) of the matrix
// takes scale_inv[((r + row_off) / block_rows) * cols + (c + col_off) / block_cols], fp32 in
// backend memory. A tensor-parallel slice keeps the scales of the blocks it touches and where in its
// first block it starts (row_off < block_rows, col_off < block_cols).
struct Fp8Blocks {
  const float* scale_inv = nullptr;
  int64_t cols = 0;  // scale_inv's row length
  int64_t block_rows = 0, block_cols = 0, row_off = 0, col_off = 0;
};

// A 2-D weight [rows, cols] (a Linear weight is [out_features, in_features]).
struct Matrix {
  // F32 or BF16 (others are converted at load); F8_E4M3 only from load_fp8_matrix with keep, on a
  // backend whose linear and grouped_linear take fp8 weights: then data holds the e4m3 codes and
  // element (r, c) is bf16(fp32(code) * scale) with fp8's scale, the very value the host's
  // dequantisation gives it (model/fp8_block.h), so keeping a weight fp8 halves its memory and
  // changes no weight.
  DType dtype = DType::F32;
  int64_t rows = 0, cols = 0;
  const void* data = nullptr;
  Fp8Blocks fp8;
};

// The bytes a linear on w reads of it: its elements, and an fp8 weight's block scales.
inline int64_t weight_bytes(const Matrix& w) {
  int64_t b = w.rows * w.cols * static_cast<int64_t>(dtype_size(w.dtype));
  if (w.dtype == DType::F8_E4M3 && w.fp8.block_rows > 0 && w.fp8.block_cols > 0)
    b += ((w.fp8.row_off + w.rows + w.fp8.block_rows - 1) / w.fp8.block_rows) *
         ((w.fp8.col_off + w.cols + w.fp8.block_cols - 1) / w.fp8.block_cols) * static_cast<int64_t>(sizeof(float));
  return b;
}

// a and b read as one weight [a.rows + b.rows, cols] (a's rows, then b's): a with b's rows added,
// where b's elements lie right after a's in backend memory (ComputeBackend::make_adjacent places
// weights so), both are bf16, fp32 or fp8 of one width, and fp8 ones start on their block grid
// with a ending on it and b's block scales right after a's; else nullopt. How a backend runs
// projections of one input (gate and up) as one GEMM.
std::optional<Matrix> stacked_rows(const Matrix& a, const Matrix& b);

// The paged-KV block lists of a step's tokens: token t's sequence holds its positions in cache
// blocks blocks[start[t]], blocks[start[t] + 1], ... (position p in block p / block_size). Both
// arrays are backend memory; host_blocks / host_start are the same arrays in host memory (backends
// that run on the host may use either; they are null in a step captured for replay, where they
// would be stale). max_pos bounds every position the attention ops' pos array holds, or, in a
// captured step, may hold at replay (the context limit): a device backend sizes its launch by it
// (-1: no bound known).
struct BlockTables {
  const int32_t* blocks = nullptr;
  const int32_t* start = nullptr;  // [T]
  const int32_t* host_blocks = nullptr;
  const int32_t* host_start = nullptr;
  int64_t max_pos = -1;
};

// One layer's KV cache in backend memory: k (GQA keys, or MLA's latent rows) and v (GQA values;
// null for MLA), elements of `dtype`: F32; BF16 (each value rounded to nearest even when written and
// widened exactly when read); or F8_E4M3, codes of value / scale read back as code * scale, with
// k_scale for the K side (MLA: the whole latent row) and v_scale for the V side. Attention over a
// narrow cache equals attention over an fp32 cache holding the values read back
// (kernels/kv_cache_format.h).
struct KvCacheRef {
  void* k = nullptr;
  void* v = nullptr;
  DType dtype = DType::F32;
  float k_scale = 1.0f, v_scale = 1.0f;
};

// How a Mixture-of-Experts router picks k of num_experts experts per token (arch/moe_router.h
// defines both modes exactly).
struct RouterConfig {
  int64_t num_experts = 0, k = 0;
  bool sigmoid = false;       // DeepSeek-V3 / Kimi K2 scoring, group-limited; else softmax top-k
  bool renormalise = false;   // softmax: divide the chosen probabilities by their sum
  bool norm_topk_prob = false;  // sigmoid: divide the chosen scores by their sum
  double scale = 1.0;         // routed_scaling_factor
  int64_t n_group = 1, topk_group = 1;
  const float* bias = nullptr;  // [num_experts] selection bias, backend memory; may be null
};

// One row's sampling settings: the fields of SamplingParams the sampler's choice depends on, in
// the same types (kernels/cuda/sampling.h's SamplingRow has the same), plus the position the
// sampled token takes in its sequence (the Philox counter).
struct SampleRow {
  double temperature = 0.0;  // <= 0: greedy
  double top_p = 1.0;        // >= 1: off
  double min_p = 0.0;        // <= 0: off
  int64_t top_k = 0;         // <= 0 or >= V: off
  uint64_t seed = 0;
  int64_t position = 0;
  // vLLM's penalties (fp32, as it applies them; neutral 1, 0, 0) and its other logit controls on
  // the tokens [edits_begin, edits_begin + edits_count) of the step's TokenEdit list
  // (sampling::edited_logit); allowed_only: every token not listed as allowed is barred.
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  int64_t edits_begin = 0;
  int64_t edits_count = 0;
  bool allowed_only = false;
  // A scored row (vLLM's prompt_logprobs) takes this given token (>= 0) instead of a choice:
  // nothing is drawn and no penalty applies; its logprob is the raw row's at it. -1: the row chooses.
  int32_t target = -1;
  // The row's top_n most likely tokens (of the raw row, ties to the lower id) and their logprobs go
  // to [top_begin, top_begin + top_n) of the step's top arrays; each row's begin where the previous
  // row's end (top_entries).
  int32_t top_n = 0;
  int64_t top_begin = 0;
  // Whether the choice reads an edited copy of the row.
  bool edited() const { return edits_count > 0 || allowed_only; }
};

using TokenEdit = sampling::TokenEdit;  // a token whose logit changes before the choice (kernels/sample_rules.h)

// The length of a step's top arrays: where its last row's end.
inline int64_t top_entries(const SampleRow* rows, int64_t R) {
  return R > 0 ? rows[R - 1].top_begin + rows[R - 1].top_n : 0;
}

// A 1-D fp32 weight (norm scales, biases).
struct Vector {
  int64_t n = 0;
  const float* data = nullptr;
};

// Activation rows in backend memory, fp32, with their bf16 twin where the op that wrote them wrote
// one too (ComputeBackend::wants_bf16_twins): the same values rounded to nearest even. A backend
// whose GEMMs read bf16 activations reads the twin instead of casting the rows again, so a twin
// saves a launch and changes no bit. Most rows have none: a plain pointer converts.
struct Activations {
  Activations(const float* rows) : f32(rows) {}  // NOLINT(google-explicit-constructor)
  Activations(const float* rows, const uint16_t* twin) : f32(rows), bf16(twin) {}
  // The same from element i on (a later row's start: both forms advance together).
  Activations from(int64_t i) const { return {f32 + i, bf16 ? bf16 + i : nullptr}; }
  const float* f32;
  const uint16_t* bf16 = nullptr;
};

// Where an op that can write a twin writes: the fp32 rows, and their twin where bf16 is not null.
struct ActivationsOut {
  ActivationsOut(float* rows) : f32(rows) {}  // NOLINT(google-explicit-constructor)
  ActivationsOut(float* rows, uint16_t* twin) : f32(rows), bf16(twin) {}
  operator Activations() const { return {f32, bf16}; }  // NOLINT(google-explicit-constructor)
  float* f32;
  uint16_t* bf16 = nullptr;
};

// One of several linears on the same input (ComputeBackend::linear_parts): y [M, w->rows] =
// x · w^T (+ bias, when given).
struct LinearPart {
  const Matrix* w = nullptr;
  const Vector* bias = nullptr;
  float* y = nullptr;
};

class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;
  virtual std::string name() const = 0;

  // Weight loading. Matrices in F32/BF16 may be used in place; other dtypes are converted.
  virtual Matrix load_matrix(const TensorView& t) = 0;
  virtual Vector load_vector(const TensorView& t) = 0;
  // FP8 e4m3 weights with block scales (model/fp8_block.h): rows [r0, r0 + nr) and columns
  // [c0, c0 + nc) of w [R, C]. A backend that takes_fp8() moves the fp8 bytes and the scales (about
  // half the bytes of bf16) and returns an F8_E4M3 matrix when `keep` (the caller passes it only to
  // linear and grouped_linear) and keeps_fp8_weights(), else the bf16 dequantisation, made on its
  // device with the host's rounding; for the other backends the weight loader dequantises on the
  // host and calls load_matrix.
  virtual bool takes_fp8() const { return false; }
  virtual Matrix load_fp8_matrix(const TensorView& w, const TensorView& scale_inv, int64_t block_rows,
                                 int64_t block_cols, int64_t r0, int64_t nr, int64_t c0, int64_t nc, bool keep);
  // Whether fp8 weights stay fp8 (--fp8-weights fp8) or are dequantised to bf16 once at load
  // (--fp8-weights bf16: twice the memory, no dequantisation in the GEMMs). Only a backend that
  // computes with fp8 weights can keep them; the others ignore the setting.
  virtual void set_keep_fp8_weights(bool keep) {}
  virtual bool keeps_fp8_weights() const { return false; }
  // How a linear on a weight kept fp8 runs past the rows it reads directly (prefill): W8A8 (true:
  // the activations quantised to e4m3 per row and 128 features, and an fp8 tensor-core GEMM with
  // both sides' block scales, DeepSeek-V3's own recipe) or on the weight dequantised to bf16 (false:
  // activations unquantised, each weight the CPU backend's value). --fp8-prefill; backends that
  // keep no fp8 weights ignore it.
  virtual void set_fp8_w8a8(bool on) {}
  virtual bool fp8_w8a8() const { return false; }
  // With W8A8, how a grouped linear (the routed experts) on fp8 weights runs its groups past the
  // direct rows: all in one grouped launch on fp8 tensor cores (true) or one W8A8 GEMM per group
  // (false). --fp8-expert-gemm; backends that keep no fp8 weights ignore it.
  virtual void set_fp8_grouped_gemm(bool on) {}
  virtual bool fp8_grouped_gemm() const { return false; }
  // How grouped_linear_routed on bf16 weights runs groups that average more rows than the direct
  // kernel takes well: in one grouped GEMM on bf16 tensor cores (true) or through the direct kernel
  // (false, which reads each weight once per 8 rows). bench-moe --routed-gemm; backends without
  // tensor cores ignore it.
  virtual void set_routed_grouped_gemm(bool on) {}
  // The tensor-core products those grouped GEMMs run on: Hopper's warpgroup wgmma where the device
  // has it and a self-check before the first use agrees (true), or mma.sync always (false).
  // --grouped-gemm-core; what runs: grouped_gemm_core() ("wgmma", "mma.sync"; "" without tensor
  // cores).
  virtual void set_grouped_gemm_wgmma(bool on) {}
  virtual std::string grouped_gemm_core() const { return ""; }
  // How the attention of prefill chunks runs: on bf16 tensor cores (true: the query, the keys and
  // values, and the softmax weights rounded to bf16, fp32 accumulation, as the flash attention of
  // GPU engines) or in fp32 (false: the decode kernels' arithmetic). --prefill-attention; backends
  // without tensor cores ignore it.
  virtual void set_prefill_attention_bf16(bool on) {}
  virtual bool prefill_attention_bf16() const { return false; }
  // How an MLA model's decode tokens (a step's single tokens of a sequence) attend: on bf16
  // tensor cores (true: prefill's numerics, every head of a token in one pass over its latent
  // rows) or in fp32 (false). --decode-attention. GQA decode keeps fp32 either way; backends
  // without tensor cores ignore it (decode_attention_bf16() stays false).
  virtual void set_decode_attention_bf16(bool on) {}
  virtual bool decode_attention_bf16() const { return false; }

  // Activation memory, owned by the backend, freed when the backend is destroyed or by free().
  virtual void* alloc(size_t bytes) = 0;
  virtual void free(void* p) = 0;
  // The device memory alloc() draws from, free and total bytes, where the backend has a device
  // (false on the CPU): what an automatic KV cache budget sizes itself by.
  virtual bool device_memory(size_t* free_bytes, size_t* total_bytes) const { return false; }
  // The benchmarks' ceilings, where the backend runs on a device (false on the CPU, whose
  // ceilings cpu/ceilings.h measures). The bandwidth probe copies within the device, so it needs
  // free memory: up to 2 GiB, less on a device with less free.
  virtual bool measure_device_ceilings(DeviceCeilings* c) { return false; }
  // A GEMM as linear() runs it for weights of that dtype, timed on the device: the median of
  // `runs` after a warm-up. Throws where the backend has no device.
  virtual GemmFigure time_linear_gemm(int64_t m, int64_t n, int64_t k, bool bf16, int runs = 20);
  // This backend's own linear() on a weight of `weight` dtype (BF16, or F8_E4M3 kept fp8 with
  // 128 x 128 blocks), activation cast included, timed on the device as time_linear_gemm.
  virtual GemmFigure time_linear(int64_t m, int64_t n, int64_t k, DType weight, int runs = 20);
  // Bytes of device memory the loaded weights take, where the backend has a device (0 elsewhere:
  // the CPU reads most weights in place from the mapped checkpoint).
  virtual size_t device_weight_bytes() const { return 0; }
  virtual void copy_to_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;

  // ---- Capture (CUDA graphs), optional ----
  // Between begin_capture and end_capture the ops are recorded, not executed; end_capture returns
  // a handle whose replay runs them again on the pointers and sizes they were issued with (the
  // caller rewrites the input buffers in place before each replay). No alloc, free or
  // copy_to_host may happen while capturing: they throw. Handles stay valid until
  // drop_captures(). The defaults (backends that cannot capture) throw, but drop_captures, which
  // has nothing to drop.
  virtual bool supports_capture() const { return false; }
  // The cudaStream_t ops are issued to now (the capture stream while capturing); null for the
  // legacy stream and for backends without streams. What a communicator queues a captured
  // collective on.
  virtual void* current_stream() const { return nullptr; }
  virtual void begin_capture();
  virtual int64_t end_capture();
  virtual void replay(int64_t handle);
  virtual void drop_captures();
  // The nodes of a captured graph (kernels, copies, and the kernels library calls such as
  // cuBLAS's GEMMs launch), where the backend counts them (0 elsewhere): at one replay of a step,
  // what the device runs one after another.
  virtual int64_t captured_nodes(int64_t handle) const { return 0; }

  // ---- The timeline the op profile reads (compute/op_profile.h) ----
  // mark_timeline() stamps where the work issued so far ends on the backend's own timeline: here
  // the host clock, the ops having finished when they return; on a device an event on the
  // stream, so that marks time the device (its idle waits for the host included).
  // timeline_seconds(a, b): from mark a to mark b, once synchronize() has run after b.
  // clear_timeline(): the marks so far are read; their slots may be reused. Never while capturing.
  virtual int64_t mark_timeline();
  virtual double timeline_seconds(int64_t a, int64_t b) const;
  virtual void clear_timeline();
  // Named ranges around the profile's sections for external profilers (NVTX on CUDA, which
  // nsys shows on its timeline); nothing elsewhere. Called whether or not a profile is set.
  virtual void push_range(const char* name) {}
  virtual void pop_range() {}
  // The profile the ops' callers report their sections to (OpSection); null: none. Not owned.
  void set_op_profile(OpProfile* p) { op_profile_ = p; }
  OpProfile* op_profile() const { return op_profile_; }

  // ---- ops (shapes row-major; see kernels/ for exact semantics) ----
  virtual void embedding(const int32_t* ids, int64_t T, const Matrix& table, float* out) = 0;
  // rmsnorm, add_rmsnorm and silu_mul write out's twin too where it has one (Activations).
  virtual void rmsnorm(const float* x, const Vector& w, int64_t rows, float eps, ActivationsOut out) = 0;
  // residual += x; out = rmsnorm(residual)
  virtual void add_rmsnorm(float* residual, const float* x, const Vector& w, int64_t rows, float eps,
                           ActivationsOut out) = 0;
  // Whether the ops' callers should give the outputs that feed linears a twin: the backend's GEMMs
  // read bf16 activations (the CUDA backend with bf16 or fp8 weights). Others ignore twins.
  virtual bool wants_bf16_twins() const { return false; }
  // y[M, W.rows] = x[M, W.cols] · W^T (+ bias)
  virtual void linear(Activations x, int64_t M, const Matrix& w, const Vector* bias, float* y) = 0;
  // The linears of one input (a layer's q, k and v projections; gate and up), as vLLM's merged
  // QKV and gate/up layers run them: every part's weight has x's width (checked), and each part's
  // result is what linear() gives it up to the backend's GEMM summation order (the CPU backend:
  // bit for bit, in one parallel region). The default runs linear() per part. The CUDA backend
  // casts x once for all parts (or reads its twin), and parts whose weights make_adjacent placed
  // one after another run as one GEMM.
  virtual void linear_parts(Activations x, int64_t M, std::span<const LinearPart> parts);
  // Places the weights of one linear_parts call one after another in backend memory where the
  // backend gains by it (CUDA: same dtype and width; fp8 scales on the block grid) and returns
  // whether they are; the matrices' pointers change, their values do not. At load, before any
  // step. The default leaves them where they are (false).
  virtual bool make_adjacent(std::span<Matrix* const> parts) { return false; }
  // G linears on consecutive row ranges, in one call where the backend can (Mixture-of-Experts:
  // every local expert's projection at once). offsets (host) has G + 1 nondecreasing entries,
  // offsets[0] >= 0; every w[g] has the same rows N and cols K (checked) and should have the same
  // dtype (mixed dtypes may fall back to one linear per group); for each g, rows
  // [offsets[g], offsets[g+1]) of x [offsets[G], K] times w[g]^T go into the same rows of
  // y [offsets[G], N]. Empty groups are skipped; other rows of y are not written. Each row's
  // result is what linear() gives it up to the backend's GEMM summation order (on the CPU backend,
  // where the default runs linear() per non-empty group, bit for bit). x's twin, where it has one,
  // spans the same rows.
  virtual void grouped_linear(Activations x, const std::vector<int64_t>& offsets, const std::vector<const Matrix*>& w,
                              float* y);
  // grouped_linear with the groups' row ranges in backend memory: offsets [G + 1] (int32, from an
  // expert permutation), offsets[G] <= max_rows, x [max_rows, K], y [max_rows, N] (rows from
  // offsets[G] on are not written). Nothing about the groups is read on the host, so a captured
  // step can hold the call (Mixture-of-Experts layers in a CUDA graph); where the backend cannot
  // capture, the default reads the offsets back and runs grouped_linear. The CUDA backend runs
  // every group through one kernel that reads the weights directly (a decode step's few rows per
  // expert), fp8 codes with the bits linear() gives a row of up to 16. expect_rows (<= max_rows):
  // the rows the groups usually hold in all, on which a backend chooses between that kernel and a
  // grouped GEMM (a captured expert-parallel step's bound is far above its usual load).
  // x's twin, where it has one, needs to hold only the groups' rows.
  void grouped_linear_routed(Activations x, int64_t max_rows, const int32_t* offsets,
                             const std::vector<const Matrix*>& w, float* y) {
    grouped_linear_routed(x, max_rows, max_rows, offsets, w, y);
  }
  virtual void grouped_linear_routed(Activations x, int64_t max_rows, int64_t expect_rows, const int32_t* offsets,
                                     const std::vector<const Matrix*>& w, float* y);
  // How grouped_linear runs here, in a few words (benchmark headers), and the last
  // grouped_linear_routed.
  virtual std::string grouped_linear_path() const { return "one linear per group"; }
  virtual std::string routed_linear_path() const { return "the offsets read back, then grouped_linear"; }
  // Rows a grouped_linear call should take at most (callers bound their scratch with it): 0 when
  // grouping gains nothing here and smaller calls keep the data in cache (the default).
  virtual int64_t grouped_linear_rows() const { return 0; }
  virtual void rope(float* x, int64_t T, int64_t n_heads, int64_t head_dim, const int32_t* pos,
                    const float* inv_freq) = 0;
  // rope() on a layer's queries [T, q_heads, head_dim] and keys [T, k_heads, head_dim], in one
  // launch where the backend has launches; each element as rope() gives it. The default runs
  // rope() on each.
  virtual void rope_qk(float* q, int64_t q_heads, float* k, int64_t k_heads, int64_t T, int64_t head_dim,
                       const int32_t* pos, const float* inv_freq) {
    rope(q, T, q_heads, head_dim, pos, inv_freq);
    rope(k, T, k_heads, head_dim, pos, inv_freq);
  }
  virtual void silu_mul(const float* gate, const float* up, ActivationsOut out, int64_t n) = 0;
  // silu_mul on a stacked gate/up projection's output (vLLM's silu_and_mul): out [rows, width] =
  // silu(gate) * up, where row r of gate_up [rows, 2 * width] holds row r of gate, then of up.
  // Each element (and its twin) as silu_mul gives it; out must not overlap gate_up. The default
  // runs silu_mul row by row.
  virtual void silu_mul_stacked(const float* gate_up, int64_t rows, int64_t width, ActivationsOut out);
  virtual void add(float* y, const float* x, int64_t n) = 0;
  // A KV cache block's layout is the backend's own: only its kv_write writes it and only its
  // attention reads it (the CPU keeps a KV head's rows of a block together, CUDA whole rows).
  virtual void kv_write(const float* k, const float* v, int64_t T, const int64_t* slots, int64_t n_kv_heads,
                        int64_t head_dim, int64_t block_size, const KvCacheRef& cache) = 0;
  // What a GQA layer's queries, keys and values go through between their projection and attention:
  // Qwen3's per-head RMSNorm of q and k where norms.q / norms.k are set (rmsnorm over head_dim
  // rows), rope_qk, then kv_write. q and k are left normed and rotated, as those calls leave them.
  // One launch where the backend has launches (each element the separate calls' bits); the default
  // makes the separate calls.
  struct QkNorms {
    const Vector* q = nullptr;
    const Vector* k = nullptr;
    float eps = 0.0f;
  };
  virtual void rope_kv_write(float* q, int64_t q_heads, float* k, const float* v, int64_t kv_heads, int64_t T,
                             int64_t head_dim, const QkNorms& norms, const int32_t* pos, const float* inv_freq,
                             const int64_t* slots, int64_t block_size, const KvCacheRef& cache);
  // Writes out's twin too where it has one (the o_proj GEMM reads it).
  virtual void attention(const float* q, int64_t T, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                         const KvCacheRef& cache, int64_t block_size, const BlockTables& tables, const int32_t* pos,
                         int64_t window, float scale, ActivationsOut out) = 0;

  // ---- Multi-head Latent Attention (DeepSeek-V2/V3, Kimi K2; see kernels/cpu/latent_attention.h) ----
  // RoPE of rot_dim-wide vectors read with strides, written packed to out [T, n_heads, rot_dim]:
  // the vector of token t, head h starts at x + t*x_stride + h*head_stride. Angle pos[t]*inv_freq[i]
  // (fp32); cos and sin are multiplied by attention_factor. interleaved = false: pairs (i, i+half)
  // (rotate-half); true: pairs (2i, 2i+1), written de-interleaved to (i, i+half) as transformers'
  // apply_rotary_pos_emb_interleave does. out may equal x only when x is packed.
  virtual void rope_strided(const float* x, int64_t T, int64_t n_heads, int64_t x_stride, int64_t head_stride,
                            int64_t rot_dim, const int32_t* pos, const float* inv_freq, bool interleaved,
                            float attention_factor, float* out) = 0;
  // Per-head linear: w is [n_heads * N, K] (head h's weight is rows [h*N, (h+1)*N)), N = w.rows /
  // n_heads, K = w.cols. y [T, n_heads, N]:
  //   y[t, h, n] = sum_k x[t*x_stride + h*head_stride + k] * w[h*N + n, k]
  // reduced per element like linear(), independently of T. Writes y's twin too where it has one
  // (MLA's W_UV product, read by o_proj).
  virtual void head_linear(const float* x, int64_t T, int64_t n_heads, int64_t x_stride, int64_t head_stride,
                           const Matrix& w, ActivationsOut y) = 0;
  // Latent cache rows (cache.k, [num_blocks, block_size, kv_lora + rope_dim]): row slots[t] =
  // [latent[t] | k_rope[t]] for latent [T, kv_lora], k_rope [T, rope_dim]; negative slots are skipped.
  virtual void latent_cache_write(const float* latent, const float* k_rope, int64_t T, const int64_t* slots,
                                  int64_t kv_lora, int64_t rope_dim, const KvCacheRef& cache) = 0;
  // What an MLA layer's latent, rope key and queries' rope parts go through between their
  // projection and attention: rmsnorm of the latent [T, kv_lora] (latent_norm, eps), rope_strided
  // of the rope key k_rope [T, rope_dim] in place and of the queries' rope parts (q_rope_in, read
  // as rope_strided reads x: n_heads heads, q_stride and q_head_stride) into q_rope, then
  // latent_cache_write. latent and k_rope are left normed and rotated, as those calls leave them.
  // One launch where the backend has launches (each element the separate calls' bits); the default
  // makes the separate calls.
  struct LatentRopeArgs {
    const int32_t* pos = nullptr;
    const float* inv_freq = nullptr;
    bool interleaved = false;
    float attention_factor = 1.0f;
  };
  virtual void latent_rope_cache_write(float* latent, const Vector& latent_norm, float eps, float* k_rope,
                                       const float* q_rope_in, int64_t n_heads, int64_t q_stride, int64_t q_head_stride,
                                       float* q_rope, int64_t T, int64_t kv_lora, int64_t rope_dim,
                                       const LatentRopeArgs& rope, const int64_t* slots, const KvCacheRef& cache);
  // Absorbed MLA attention over the latent cache. q_latent, out [T, n_heads, kv_lora]; q_rope
  // [T, n_heads, rope_dim]. Token t attends causally to positions [0, pos[t]] of its sequence
  // (its block list in tables); with cache rows (c_j, r_j):
  //   s_j = (q_latent[t,h]·c_j + q_rope[t,h]·r_j) * scale;  out[t,h] = sum_j softmax(s)_j c_j.
  virtual void latent_attention(const float* q_latent, const float* q_rope, int64_t T, int64_t n_heads,
                                int64_t kv_lora, int64_t rope_dim, const KvCacheRef& cache, int64_t block_size,
                                const BlockTables& tables, const int32_t* pos, float scale, float* out) = 0;
  // How the last attention or latent_attention call ran, for the benchmarks: blocks per (token,
  // head group) along its positions (1: unsplit), whether it tiled a prefill chunk's tokens, and
  // whether it ran on bf16 tensor cores (set_prefill_attention_bf16).
  virtual int64_t last_attention_parts() const { return 1; }
  virtual bool last_attention_tiled() const { return false; }
  virtual bool last_attention_bf16() const { return false; }

  // ---- Mixture-of-Experts (kernels/cpu/expert_permute.h defines the layouts) ----
  // Router logits [T, num_experts] -> ids [T, k] (best first) and weights [T, k].
  virtual void moe_route(const float* logits, int64_t T, const RouterConfig& cfg, int32_t* ids, float* weights) = 0;
  // Groups the (token, slot) pairs routed to the local experts [e0, e0 + E) by expert, in
  // ascending (token, slot) order within an expert: offsets [E + 1] (int32), slot_row [T, k] (the
  // row of pair (t, j), -1 when its expert is not local), row_pair [T * k] (row -> t * k + j).
  // pos [T] (may be null): a token with pos[t] < 0 (a captured step's padding row) goes to no
  // expert. counts [E] (int64, may be null) += each local expert's rows: a step's expert loads,
  // counted where the routing is, so a captured step need not read them back.
  virtual void expert_permute(const int32_t* ids, int64_t T, int64_t k, int64_t e0, int64_t E, const int32_t* pos,
                              int32_t* offsets, int32_t* slot_row, int32_t* row_pair, int64_t* counts) = 0;
  // xp [rows, H]: row r is x[row_pair[r] / k], for rows = min(*num_rows, max_rows): num_rows is
  // backend memory (the permute's offsets + E), max_rows (T * k) bounds it on the host. xp's twin,
  // where it has one, gets the same rows.
  virtual void expert_gather(const float* x, int64_t H, int64_t k, const int32_t* row_pair, const int32_t* num_rows,
                             int64_t max_rows, ActivationsOut xp) = 0;
  // out [T, H] = for each token, from zero, + weights[t, j] * yp[slot_row[t, j]] over its local
  // slots in ascending expert id (the sum does not depend on the layout's expert split order).
  virtual void expert_combine(const float* yp, int64_t H, const int32_t* ids, const float* weights,
                              const int32_t* slot_row, int64_t T, int64_t k, float* out) = 0;
  // The same on rows yp in bf16 (a captured combine's results off a bf16 wire), each widened
  // exactly: expert_combine's bits without writing the widened rows out.
  virtual void expert_combine_bf16(const uint16_t* yp, int64_t H, const int32_t* ids, const float* weights,
                                   const int32_t* slot_row, int64_t T, int64_t k, float* out) = 0;
  // out [T, H] += g_t * y, g_t = 1 / (1 + exp(-gate_logits[t])) in fp32, or 1 when gate_logits is
  // null (a shared expert, Qwen2-MoE's gated one).
  virtual void gated_add(float* out, const float* y, const float* gate_logits, int64_t T, int64_t H) = 0;
  // *acc = max(*acc, max_i |x[i]|), acc one float in backend memory, NaNs skipped
  // (kernels/cpu/abs_max.h): a KV cache calibration's per-layer magnitudes.
  virtual void abs_max(const float* x, int64_t n, float* acc) = 0;

  // ---- Expert-parallel data movement (arch/expert_dispatch.h; kernels/cpu/expert_rows.h defines
  // them). The host builds the index arrays (backend memory); only activation rows move. ----
  // dst [n, H]: dst[i] = src[rows[i]]; zeros where rows[i] < 0, but rows[i] == cpu::kKeepRow
  // leaves dst's row (and its twin's) as it is (kernels/cpu/expert_rows.h). Writes dst's twin where
  // it has one.
  virtual void gather_rows(const float* src, int64_t H, const int32_t* rows, int64_t n, ActivationsOut dst) = 0;
  // out [T, H]: per token, from zero, + weights[i] * y[rows[i]] for i in [token_start[t],
  // token_start[t + 1]) (token_start [T + 1]) in that order, each product rounded before the add
  // (the rounding of expert_combine); a token with an empty range gets zeros.
  virtual void combine_rows(const float* y, int64_t H, const int32_t* token_start, const int32_t* rows,
                            const float* weights, int64_t T, float* out) = 0;
  // Rows on the wire in bf16 (--ep-wire bf16; kernels/cpu/wire_bf16.h defines the layout): blocks
  // of block_len words whose first round_len floats go as bf16 and the rest whole, packed into
  // dst [blocks, cpu::wire_bf16_len(block_len, round_len)] and widened back.
  virtual void pack_bf16(const float* src, int64_t blocks, int64_t block_len, int64_t round_len, uint16_t* dst) = 0;
  virtual void unpack_bf16(const uint16_t* src, int64_t blocks, int64_t block_len, int64_t round_len,
                           float* dst) = 0;
  // Rows on the wire in fp8 (--ep-wire fp8's dispatch; kernels/cpu/wire_fp8.h defines the layout):
  // blocks of block_len words whose first round_len floats are rows of row_len (>= 1), each
  // quantised to e4m3 with a scale per 128 values, and the rest whole, packed into
  // dst [blocks, cpu::wire_fp8_bytes(block_len, round_len, row_len)] and read back.
  virtual void pack_fp8(const float* src, int64_t blocks, int64_t block_len, int64_t round_len, int64_t row_len,
                        uint8_t* dst) = 0;
  virtual void unpack_fp8(const uint8_t* src, int64_t blocks, int64_t block_len, int64_t round_len, int64_t row_len,
                          float* dst) = 0;
  // Rows gathered onto a wire and off it in one pass (kernels/cpu/wire_bf16.h, wire_fp8.h
  // pack_rows / unpack_rows): an eager exchange's row movement and packing at once. Wire row i is
  // src row rows[i] ([*, H] floats) packed; dst row i ([n, H] floats) is wire row rows[i] read
  // back, with its twin where dst has one (the experts' GEMMs then read the rows without a cast).
  virtual void pack_rows_bf16(const float* src, int64_t H, const int32_t* rows, int64_t n, uint16_t* dst) = 0;
  virtual void unpack_rows_bf16(const uint16_t* src, int64_t H, const int32_t* rows, int64_t n, ActivationsOut dst) = 0;
  virtual void pack_rows_fp8(const float* src, int64_t H, const int32_t* rows, int64_t n, uint8_t* dst) = 0;
  virtual void unpack_rows_fp8(const uint8_t* src, int64_t H, const int32_t* rows, int64_t n, ActivationsOut dst) = 0;
  // combine_rows on rows y in bf16 (the combine's results as a bf16 wire carries them), each
  // widened exactly: combine_rows' bits without writing the widened rows out.
  virtual void combine_rows_bf16(const uint16_t* y, int64_t H, const int32_t* token_start, const int32_t* rows,
                                 const float* weights, int64_t T, float* out) = 0;
  // The index plans of a fixed-capacity exchange, built where the routing is, so that a captured
  // step holds a whole expert-parallel MoE layer (kernels/cpu/expert_exchange.h defines them).
  // Every pointer is backend memory; counts may be null. blocks: the dispatch blocks (the send
  // plan writes their meta rows, the recv plan reads them).
  virtual void expert_send_plan(const cpu::ExchangeShape& s, const int32_t* ids, int64_t T, cpu::RowShare share,
                                const int32_t* pos, int32_t* rec_token, float* blocks, int32_t* pair_row,
                                int64_t* counts, int32_t* overflow) = 0;
  virtual void expert_recv_plan(const cpu::ExchangeShape& s, const float* blocks, int32_t* offsets, int32_t* row_src,
                                int32_t* back_row) = 0;

  // ---- Sampling ----
  // The host sampler's choice (src/engine/sampler.h) per row of logits [R, V] (backend memory)
  // with rows[r]'s settings (host) and the token edits its logit controls and penalties read
  // (host; may be null when no row has any): tokens[r] and logprobs[r] (host; log-softmax of the
  // raw row at the token, before any edit); a scored row (SampleRow::target) takes its given token. Rows with
  // top_n write their alternatives to top_tokens and top_logprobs (host, top_entries(rows, R) long;
  // may be null when no row asks). The logits are not changed. Only the choices cross to the host,
  // so the logits never leave the device. Reads backend memory and writes host memory: like
  // copy_to_host, never while capturing.
  virtual void sample(const float* logits, int64_t R, int64_t V, const SampleRow* rows, const TokenEdit* edits,
                      int32_t* tokens, float* logprobs, int32_t* top_tokens, float* top_logprobs) = 0;

  // Returns when every op issued so far has finished (timing a phase; backends that run each op
  // to completion do nothing).
  virtual void synchronize() = 0;

 private:
  OpProfile* op_profile_ = nullptr;
  std::vector<std::chrono::steady_clock::time_point> host_marks_;  // the default timeline
};

// Checks grouped_linear's arguments (see there): G + 1 nondecreasing offsets from >= 0 for
// G = w.size(), no null weight, one shape for all. `who` prefixes the error.
void check_grouped_linear(const std::vector<int64_t>& offsets, const std::vector<const Matrix*>& w, const char* who);

// Checks linear_parts's arguments: at least one part, each with a weight and an output, every
// weight of part 0's width, each bias (where given) of its weight's rows. `who` prefixes the error.
void check_linear_parts(std::span<const LinearPart> parts, const char* who);

// Backend registry (src/compute/backend_registry.cpp): a backend is added by one file defining its
// factory and one line in that table.
std::unique_ptr<ComputeBackend> make_backend(const std::string& name);  // throws Error listing names
std::vector<std::string> backend_names();
// Makes `name` (new or registered) use `factory` in this process: how the build of shardlm over
// the emulated CUDA runtime (src/compute/emulated_cuda_hook.cpp) puts its CudaBackend in.
void override_backend(const std::string& name, std::unique_ptr<ComputeBackend> (*factory)());

}  // namespace shardlm
