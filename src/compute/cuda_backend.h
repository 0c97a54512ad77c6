// CudaBackend: ComputeBackend on one CUDA device (the current device when it is made), running the
// kernels of kernels/cuda and cuBLAS for the GEMMs.
//
// Streams: every op runs on the legacy default stream. Communicators that move device buffers on
// their own streams (NCCL) create them blocking, and blocking streams are ordered against the
// legacy stream both ways, so a collective on an activation starts after the kernels that wrote it
// and the next kernel waits for it, with no events to pass between the backend and the
// communicator. copy_to_host waits for the stream (the caller reads the data next).
//
// CUDA graphs (begin_capture .. end_capture, replay): while capturing, ops are issued to a
// non-blocking capture stream of the backend's own (stream_ names the stream ops go to) and cuBLAS
// uses a preallocated workspace; alloc, free and copy_to_host throw. A replay launches the graph on
// the legacy stream, so it is ordered like the eager ops it stands for. A workspace that grows
// after a capture keeps its old buffer until drop_captures(): the graph still points at it.
//
// Weights: F32 and BF16 matrices stay in their dtype on the device (F16 becomes F32); FP8 block-
// quantised slices go up as fp8 bytes plus their scales. A linear's fp8 weight stays so (1 byte a
// weight, half of bf16: what lets DeepSeek-V3 or Kimi K2 fit on the GPUs `shardlm plan` counts), and
// a linear of it (cuda_fp8_linear.cpp) dequantises each weight in registers, with the host's
// rounding, for a few rows, or the whole matrix into a bf16 workspace for cuBLAS for more; with
// --fp8-weights bf16, and for embedding tables, the slice is dequantised once there
// (kernels/cuda/fp8_dequant.h). Either way a weight's value is the CPU backend's. A BF16
// linear casts the activations to bf16 and runs cuBLAS bf16 x bf16 with fp32 accumulation and
// fp32 output, the way GPU inference engines run bf16 checkpoints; an F32 linear runs SGEMM without
// TF32, so an fp32 checkpoint gives the CPU backend's results to rounding. Uploads go through two
// pinned staging buffers on a copy stream: reading the next piece of the (memory-mapped)
// checkpoint, of this weight or the next, overlaps the DMA of the previous one; the host waits
// only for a staging buffer to free up, and the op stream waits for the copies on the device.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "compute/backend.h"
#include "core/error.h"
#include "cuda/attention_partitions.h"
#include "cuda/fp8_grouped_gemm_mma.h"
#include "cuda/prefill_attention_mma.h"
#include "cuda/rows_matmul.h"

namespace shardlm {

class CudaBackend final : public ComputeBackend {
 public:
  CudaBackend();  // throws Error when there is no CUDA device
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override { return "cuda"; }
  int device() const { return device_; }
  // Bytes of device memory this backend holds for weights.
  size_t weight_bytes() const { return weight_bytes_; }
  // fp8-weight linears so far that read the fp8 weight directly, and that dequantised it first.
  int64_t fp8_direct_linears() const { return fp8_direct_calls_; }
  int64_t fp8_dequant_linears() const { return fp8_dequant_calls_; }
  // fp8-weight linears so far that ran as block-scaled fp8 GEMMs (W8A8, cuda_w8a8_linear.cpp).
  int64_t fp8_w8a8_linears() const { return fp8_w8a8_calls_; }
  // Grouped launches of the fp8 kernel (grouped_linear on fp8 weights) so far.
  int64_t fp8_grouped_launches() const { return fp8_grouped_calls_; }
  // Grouped W8A8 launches on fp8 tensor cores (grouped_linear's groups past the direct rows) so far.
  int64_t fp8_grouped_gemm_launches() const { return fp8_grouped_gemm_calls_; }
  // grouped_linear_routed calls on fp8 weights that ran the grouped W8A8 kernel (routed) so far.
  int64_t fp8_routed_gemm_launches() const { return fp8_routed_gemm_calls_; }
  // grouped_linear_routed calls on bf16 weights that ran the grouped bf16 GEMM so far.
  int64_t bf16_routed_gemm_launches() const { return bf16_routed_gemm_calls_; }
  // Grouped GEMM launches (fp8 or bf16, grouped or routed) on wgmma so far.
  int64_t wgmma_gemm_launches() const { return wgmma_gemm_calls_; }
  // linear_parts calls so far that ran their parts as one linear on weights make_adjacent placed
  // one after another (cuda_linear_parts.cpp).
  int64_t stacked_linears() const { return stacked_linears_; }
  // Activation casts so far that a twin made unnecessary (Activations), and casts run.
  int64_t twin_reads() const { return twin_reads_; }
  int64_t activation_casts() const { return activation_casts_; }

  Matrix load_matrix(const TensorView& t) override;
  Vector load_vector(const TensorView& t) override;
  bool make_adjacent(std::span<Matrix* const> parts) override;  // cuda_linear_parts.cpp
  bool takes_fp8() const override { return true; }
  Matrix load_fp8_matrix(const TensorView& w, const TensorView& scale_inv, int64_t block_rows, int64_t block_cols,
                         int64_t r0, int64_t nr, int64_t c0, int64_t nc, bool keep) override;
  void set_keep_fp8_weights(bool keep) override { keep_fp8_ = keep; }
  bool keeps_fp8_weights() const override { return keep_fp8_; }
  void set_fp8_w8a8(bool on) override { w8a8_ = on; }
  // Off also once the self-check before the first W8A8 GEMM found cuBLASLt wrong (for good).
  bool fp8_w8a8() const override { return w8a8_ && !w8a8_bad_; }
  void set_fp8_grouped_gemm(bool on) override { grouped_gemm_ = on; }
  // Off also once the W8A8 self-check found the grouped kernel wrong.
  bool fp8_grouped_gemm() const override { return grouped_gemm_ && !grouped_gemm_bad_; }
  void set_routed_grouped_gemm(bool on) override { routed_grouped_ = on; }
  void set_grouped_gemm_wgmma(bool on) override { wgmma_ = on; }
  // "wgmma" on an sm_90 device unless set off or its self-check failed, else "mma.sync"; before
  // the first grouped GEMM, what it will be if the self-check agrees.
  std::string grouped_gemm_core() const override;
  void set_prefill_attention_bf16(bool on) override { attn_bf16_ = on; }
  bool prefill_attention_bf16() const override { return attn_bf16_; }
  void set_decode_attention_bf16(bool on) override { decode_bf16_ = on; }
  // Only beside prefill chunks on tensor cores (latent_attention_decode).
  bool decode_attention_bf16() const override { return decode_bf16_ && attn_bf16_; }

  void* alloc(size_t bytes) override;
  void free(void* p) override;
  bool device_memory(size_t* free_bytes, size_t* total_bytes) const override;
  bool measure_device_ceilings(DeviceCeilings* c) override;  // cuda_ceilings.cpp
  GemmFigure time_linear_gemm(int64_t m, int64_t n, int64_t k, bool bf16, int runs) override;
  GemmFigure time_linear(int64_t m, int64_t n, int64_t k, DType weight, int runs) override;
  size_t device_weight_bytes() const override { return weight_bytes_; }
  void copy_to_device(void* dst, const void* src, size_t bytes) override;
  void copy_to_host(void* dst, const void* src, size_t bytes) override;
  void synchronize() override;

  bool supports_capture() const override { return true; }
  void* current_stream() const override { return stream_; }
  void begin_capture() override;
  int64_t end_capture() override;
  void replay(int64_t handle) override;
  int64_t captured_nodes(int64_t handle) const override;
  void drop_captures() override;
  // cuda_timeline.cpp: events on the stream; NVTX ranges.
  int64_t mark_timeline() override;
  double timeline_seconds(int64_t a, int64_t b) const override;
  void clear_timeline() override;
  void push_range(const char* name) override;
  void pop_range() override;

  void embedding(const int32_t* ids, int64_t T, const Matrix& table, float* out) override;
  void rmsnorm(const float* x, const Vector& w, int64_t rows, float eps, ActivationsOut out) override;
  void add_rmsnorm(float* residual, const float* x, const Vector& w, int64_t rows, float eps,
                   ActivationsOut out) override;
  // Once a bf16 or fp8 weight is loaded: their GEMMs read bf16 activations, and a twin spares the
  // f32_to_bf16 launch before each (fp32 weights' SGEMM reads the fp32 rows).
  bool wants_bf16_twins() const override { return low_precision_weights_; }
  void linear(Activations x, int64_t M, const Matrix& w, const Vector* bias, float* y) override;
  void linear_parts(Activations x, int64_t M, std::span<const LinearPart> parts) override;  // cuda_linear_parts.cpp
  // One cuBLAS grouped batched GEMM for all non-empty groups (cuda_grouped_linear.cpp; one problem
  // per group: their row counts differ). BF16 weights: the rows are cast to bf16 once (or x's twin
  // read), fp32 output;
  // should cuBLAS refuse bf16 x bf16 -> fp32 there, bf16 output cast to fp32 after, and should it
  // refuse that too, one GEMM per group (each downgrade once per shape, said on stderr). F32 weights: grouped SGEMM, or
  // one GEMM per group when refused. While capturing, with mixed dtypes or with one non-empty group: one linear() per
  // group (the pointer arrays go up by pageable copies, which a graph cannot hold).
  void grouped_linear(Activations x, const std::vector<int64_t>& offsets, const std::vector<const Matrix*>& w,
                      float* y) override;
  std::string grouped_linear_path() const override;
  std::string routed_linear_path() const override { return last_routed_; }
  // Blocks per (token, head group) the last attention or latent_attention call launched along
  // its positions: 1 unsplit, else the split's partitions (cuda_attention.cpp).
  int64_t last_attention_parts() const override { return last_attention_parts_; }
  // Whether the last attention call ran a prefill kernel that tiles a sequence's tokens
  // (kernels/cuda/paged_attention_tiled.h, or prefill_attention_mma.h on tensor cores).
  bool last_attention_tiled() const override { return last_attention_tiled_; }
  bool last_attention_bf16() const override { return last_attention_bf16_; }
  // Tiles of the last GQA tensor-core attention that packed a KV head's query heads, and the single
  // tokens the last tensor-core attention left to the fp32 kernels (tests).
  int64_t last_attention_packed_tiles() const { return last_attention_packed_tiles_; }
  int64_t last_attention_singles() const { return last_attention_singles_; }
  int64_t grouped_linear_rows() const override { return 16384; }
  void rope_qk(float* q, int64_t q_heads, float* k, int64_t k_heads, int64_t T, int64_t head_dim, const int32_t* pos,
               const float* inv_freq) override;
  void rope(float* x, int64_t T, int64_t n_heads, int64_t head_dim, const int32_t* pos,
            const float* inv_freq) override;
  void silu_mul(const float* gate, const float* up, ActivationsOut out, int64_t n) override;
  void silu_mul_stacked(const float* gate_up, int64_t rows, int64_t width, ActivationsOut out) override;
  void add(float* y, const float* x, int64_t n) override;
  void rope_kv_write(float* q, int64_t q_heads, float* k, const float* v, int64_t kv_heads, int64_t T, int64_t head_dim,
                     const QkNorms& norms, const int32_t* pos, const float* inv_freq, const int64_t* slots,
                     int64_t block_size, const KvCacheRef& cache) override;
  void kv_write(const float* k, const float* v, int64_t T, const int64_t* slots, int64_t n_kv_heads,
                int64_t head_dim, int64_t block_size, const KvCacheRef& cache) override;
  void attention(const float* q, int64_t T, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                 const KvCacheRef& cache, int64_t block_size, const BlockTables& tables, const int32_t* pos,
                 int64_t window, float scale, ActivationsOut out) override;
  void rope_strided(const float* x, int64_t T, int64_t n_heads, int64_t x_stride, int64_t head_stride,
                    int64_t rot_dim, const int32_t* pos, const float* inv_freq, bool interleaved,
                    float attention_factor, float* out) override;
  void head_linear(const float* x, int64_t T, int64_t n_heads, int64_t x_stride, int64_t head_stride, const Matrix& w,
                   ActivationsOut y) override;
  void latent_rope_cache_write(float* latent, const Vector& latent_norm, float eps, float* k_rope,
                               const float* q_rope_in, int64_t n_heads, int64_t q_stride, int64_t q_head_stride,
                               float* q_rope, int64_t T, int64_t kv_lora, int64_t rope_dim, const LatentRopeArgs& rope,
                               const int64_t* slots, const KvCacheRef& cache) override;
  void latent_cache_write(const float* latent, const float* k_rope, int64_t T, const int64_t* slots,
                          int64_t kv_lora, int64_t rope_dim, const KvCacheRef& cache) override;
  void latent_attention(const float* q_latent, const float* q_rope, int64_t T, int64_t n_heads, int64_t kv_lora,
                        int64_t rope_dim, const KvCacheRef& cache, int64_t block_size, const BlockTables& tables,
                        const int32_t* pos, float scale, float* out) override;
  void moe_route(const float* logits, int64_t T, const RouterConfig& cfg, int32_t* ids, float* weights) override;
  void expert_permute(const int32_t* ids, int64_t T, int64_t k, int64_t e0, int64_t E, const int32_t* pos,
                      int32_t* offsets, int32_t* slot_row, int32_t* row_pair, int64_t* counts) override;
  void expert_gather(const float* x, int64_t H, int64_t k, const int32_t* row_pair, const int32_t* num_rows,
                     int64_t max_rows, ActivationsOut xp) override;
  // Every group through kernels/cuda/rows_matmul.h's routed matmul (cuda_routed_linear.cpp).
  using ComputeBackend::grouped_linear_routed;
  void grouped_linear_routed(Activations x, int64_t max_rows, int64_t expect_rows, const int32_t* offsets,
                             const std::vector<const Matrix*>& w, float* y) override;
  // Routed matmul launches so far (tests, benchmarks).
  int64_t routed_launches() const { return routed_launches_; }
  void expert_combine(const float* yp, int64_t H, const int32_t* ids, const float* weights, const int32_t* slot_row,
                      int64_t T, int64_t k, float* out) override;
  void expert_combine_bf16(const uint16_t* yp, int64_t H, const int32_t* ids, const float* weights,
                           const int32_t* slot_row, int64_t T, int64_t k, float* out) override;
  void gated_add(float* out, const float* y, const float* gate_logits, int64_t T, int64_t H) override;
  void abs_max(const float* x, int64_t n, float* acc) override;
  // kernels/cuda/sampling.h on the device's logits (kernels/cuda/logit_edits.h first, on a copy, for
  // edited rows): the rows and the token edits go up, the tokens and logprobs come back (R values
  // each), and that copy is the only wait for the stream.
  void sample(const float* logits, int64_t R, int64_t V, const SampleRow* rows, const TokenEdit* edits, int32_t* tokens,
              float* logprobs, int32_t* top_tokens, float* top_logprobs) override;

 private:
  void* upload(const void* host, size_t bytes);   // device copy of host bytes, owned by the backend
  void check_launch(const char* op);              // throws on a failed kernel launch
  uint16_t* bf16_workspace(size_t n);             // activations cast for a bf16 GEMM
  // y[M, N] = bf16(x)[M, K] · W^T for bf16 W [N, K] (cuBLAS, fp32 accumulation and output).
  void gemm_bf16(Activations x, int64_t M, const uint16_t* w, int64_t N, int64_t K, float* y);
  // Its two halves: x's bf16 form (its twin, else x cast into the bf16 workspace), and the GEMM
  // on that.
  const uint16_t* cast_bf16(Activations x, int64_t n);
  void gemm_bf16_cast(const uint16_t* xb, int64_t M, const uint16_t* w, int64_t N, int64_t K, float* y);
  // Rows up to which an fp8 weight is read directly (cuda_fp8_linear.cpp): two passes of the direct
  // kernel, 2 bytes a weight, against the 5 of dequantising it first; past them W8A8. On an H200
  // the direct kernel took 28 us for 16 rows of a 5632 x 1024 weight and 207 us of an 8192 x 8192
  // one, where W8A8 took 18 and 40 us for 64 rows: the bound wants lowering (or the kernel
  // speeding), but graph steps compute a group's rows by the direct kernel's arithmetic up to here
  // too (cuda_routed_linear.cpp), and both must move together.
  static constexpr int64_t kFp8DirectRows = 2 * cuda::kFp8MatmulRowsPerPass;
  // Rows a group on average up to which grouped_linear runs the fp8 groups past the direct rows in
  // one grouped W8A8 launch (cuda_fp8_grouped_gemm.cpp); more go one cuBLASLt GEMM per group. On
  // an H200 (DeepSeek-V3's 32 experts a rank, 7168 x 2048) the grouped kernel took 1.09 ms at 32
  // rows an expert where cuBLASLt took 1.90, and 4.27 ms at 256 where cuBLASLt took 2.46 (15.5
  // against 5.6 at 1024): 96 is about the geometric middle of the two nearest points. Those were the
  // mma.sync kernel's times; on wgmma (--grouped-gemm-core auto) the crossing is yet to be timed.
  static constexpr int64_t kFp8GroupedGemmMaxRows = 96;
  // The kernels' view of a weight: codes, scales and block geometry of an F8_E4M3 one; N and K of
  // any (cuda_fp8_linear.cpp).
  static cuda::Fp8Weight fp8_weight(const Matrix& w);
  // linear() of an F8_E4M3 weight (cuda_fp8_linear.cpp), and its direct path for a few rows.
  void linear_fp8(Activations x, int64_t M, const Matrix& w, float* y);
  void linear_fp8_direct(Activations x, int64_t M, const Matrix& w, float* y);
  void fp8_matmul_cast(const uint16_t* xb, int64_t M, const Matrix& w, float* y);  // its kernel on a cast input
  // The block-scaled fp8 GEMM of linear_fp8 past the direct rows (cuda_w8a8_linear.cpp): false, with
  // nothing run, when it is off, the weight or pointers do not meet cuBLASLt's terms, or cuBLASLt
  // has no kernel for the shape (then the caller dequantises).
  bool linear_w8a8(const float* x, int64_t M, const Matrix& w, float* y);
  bool w8a8_gemm(const float* x, int64_t M, const Matrix& w, float* y);  // M a multiple of 4
  bool w8a8_ready();       // W8A8 on, and its self-check (run before the first GEMM) passed
  bool w8a8_self_check();  // false (and W8A8 off) when cuBLASLt disagrees with the direct kernel
  // The `big` groups (ascending, each past the direct rows) of grouped_linear_fp8 in one launch of
  // kernels/cuda/fp8_grouped_gemm_mma (cuda_fp8_grouped_gemm.cpp): their rows quantised to e4m3 at
  // once, then one tile list. False (nothing run) when it is off or the weights or pointers do not
  // meet the kernel's terms.
  bool grouped_gemm_fp8(const float* x, const std::vector<int64_t>& offsets, const std::vector<const Matrix*>& w,
                        const std::vector<size_t>& big, float* y);
  // Rows [0, R) of x quantised, then the grouped kernel over `tiles` (rows relative to x and y).
  void run_grouped_gemm_fp8(const float* x, int64_t R, const cuda::Fp8Weight& shape,
                            const std::vector<cuda::Fp8GemmTile>& tiles, float* y);
  // Rows [0, R) of x [R, K] quantised to e4m3 into the W8A8 workspace: the codes, and *scales
  // [ceil(K / 128)][R].
  const uint8_t* quantised_rows(const float* x, int64_t R, int64_t K, const float** scales);
  // grouped_linear_routed on fp8 weights through the grouped W8A8 kernel's routed launch, where the
  // rows are expected to average more than 16 a group (expect_rows: a large decode batch over few
  // experts) and it runs them; false (nothing run) otherwise.
  bool routed_gemm_fp8(const float* x, int64_t max_rows, int64_t expect_rows, const int32_t* offsets,
                       const std::vector<const Matrix*>& w, float* y);
  // The same on bf16 weights through the grouped bf16 GEMM (kernels/cuda/bf16_grouped_gemm_mma.h,
  // cuda_bf16_grouped_gemm.cpp); false (nothing run) where the rows average 16 a group or fewer,
  // it is off, or the weights do not meet its terms.
  bool routed_gemm_bf16(Activations x, int64_t max_rows, int64_t expect_rows, const int32_t* offsets,
                        const std::vector<const Matrix*>& w, float* y);
  // The tile list of a routed grouped GEMM (fp8 or bf16) for max_rows rows in G groups, with one
  // entry more for the tile count the device writes (*count).
  cuda::GemmTile* routed_tile_list(int64_t tiles, int32_t** count);
  // grouped_linear() of the `live` groups (ascending) when every one is an F8_E4M3 weight of one
  // block layout: the groups of up to 16 rows in one grouped fp8 launch, each larger one as one W8A8
  // GEMM over its rows rounded up to 4 (cuda_fp8_linear.cpp) or else by linear_fp8. False (nothing
  // run) when the weights differ in layout. The small groups read x's twin where it has one; the
  // W8A8 GEMMs quantise the fp32 rows.
  bool grouped_linear_fp8(Activations x, const std::vector<int64_t>& offsets, const std::vector<const Matrix*>& w,
                          const std::vector<size_t>& live, float* y);
  // A launch's list (count entries of elem bytes) from host memory into buf, a device buffer of n
  // entries that only grows (never while capturing): a pageable copy, which returns once the host
  // list is read; a buffer grown out is freed once the stream is done with it. Returns buf.
  void* upload_list(void*& buf, size_t& n, const void* host, size_t count, size_t elem);
  // Replaces workspace ws (may be null) with a new one of `bytes`, after the stream has done with
  // the old one; the old one is retired, not freed, while captured graphs may hold it. Not while
  // capturing (nothing may allocate then). Returns the new ws.
  void* regrow_workspace(void*& ws, size_t bytes);
  // Workspace ws of n elements grown to at least `want` (regrow_workspace), the member left null
  // rather than dangling should the allocation throw; growing while capturing throws, naming
  // `what` (the step must run once before its capture).
  template <typename T>
  T* grown_workspace(T*& ws, size_t& n, size_t want, const char* what) {
    if (want <= n) return ws;
    SHARDLM_CHECK(!capturing_, "cuda backend: the " << what << " workspace must grow to " << want
                                                    << " elements while capturing a CUDA graph (run the step "
                                                       "once before capturing it)");
    void* old = ws;
    ws = nullptr;
    n = 0;
    ws = static_cast<T*>(regrow_workspace(old, want * sizeof(T)));
    n = want;
    return ws;
  }

  int device_ = -1;
  void* cublas_ = nullptr;  // cublasHandle_t
  void* copy_stream_ = nullptr;  // cudaStream_t for weight uploads
  void* staging_[2] = {nullptr, nullptr};
  void* staged_[2] = {nullptr, nullptr};  // cudaEvent_t: staging buffer i may be refilled
  int next_staging_ = 0;                   // the staging buffer the next piece goes to
  size_t staging_bytes_ = 0;
  std::unordered_set<void*> allocs_;  // alloc()
  std::vector<void*> owned_;          // weights
  size_t weight_bytes_ = 0;
  uint16_t* bf16_ws_ = nullptr;
  size_t bf16_ws_n_ = 0;
  float* parts_ws_ = nullptr;  // a stacked linear's output before split_columns
  size_t parts_ws_n_ = 0;
  int64_t stacked_linears_ = 0;
  bool low_precision_weights_ = false;  // a bf16 or fp8 weight is loaded (wants_bf16_twins)
  int64_t twin_reads_ = 0, activation_casts_ = 0;
  bool keep_fp8_ = true;
  uint16_t* fp8_dequant_ws_ = nullptr;  // an fp8 weight dequantised for a large-M linear
  size_t fp8_dequant_ws_n_ = 0;
  int64_t fp8_direct_calls_ = 0, fp8_dequant_calls_ = 0;  // how fp8 linears ran (tests, benchmarks)
  int64_t fp8_grouped_calls_ = 0;                          // grouped fp8 launches
  // W8A8 (cuda_w8a8_linear.cpp): cuBLASLt's handle and the one matmul descriptor (TN, e4m3 in,
  // fp32 out, 128x128 weight scales and 1x128 activation scales), its workspace, the quantised
  // activations and their scales (a workspace), and per (N, M, K, alignments) the matrix layouts
  // and the algorithm cuBLASLt chose, or that it has none.
  struct W8a8Plan {
    void* a = nullptr;  // cublasLtMatrixLayout_t, each
    void* b = nullptr;
    void* d = nullptr;
    uint64_t algo[8] = {};  // cublasLtMatmulAlgo_t
    size_t workspace = 0;   // bytes it asked for
    bool ok = false;
  };
  const W8a8Plan& w8a8_plan(int64_t N, int64_t M, int64_t K, uint32_t align_w, uint32_t align_y);
  void release_w8a8();  // the cuBLASLt objects and buffers (destructor)
  bool w8a8_ = true;
  bool w8a8_checked_ = false, w8a8_bad_ = false;
  void* lt_ = nullptr;       // cublasLtHandle_t
  void* lt_desc_ = nullptr;  // cublasLtMatmulDesc_t
  uint8_t* lt_ws_ = nullptr;
  size_t lt_ws_n_ = 0;
  uint8_t* w8a8_ws_ = nullptr;  // codes [M, K], then the scales [ceil(K / 128), M]
  size_t w8a8_ws_n_ = 0;
  std::map<std::tuple<int64_t, int64_t, int64_t, uint32_t, uint32_t>, W8a8Plan> w8a8_plans_;
  int64_t fp8_w8a8_calls_ = 0;
  int w8a8_declined_ = 0;                                  // shapes cuBLASLt had no algorithm for
  void* fp8_passes_ = nullptr;                             // cuda::Fp8MatmulPass [fp8_passes_n_], device
  size_t fp8_passes_n_ = 0;
  bool grouped_gemm_ = true, grouped_gemm_bad_ = false;  // the grouped W8A8 kernel: wanted, found wrong
  void* fp8_gemm_tiles_ = nullptr;                       // cuda::Fp8GemmTile [fp8_gemm_tiles_n_], device
  size_t fp8_gemm_tiles_n_ = 0;
  int64_t fp8_grouped_gemm_calls_ = 0, fp8_routed_gemm_calls_ = 0;
  cuda::GemmTile* routed_gemm_tiles_ = nullptr;  // the routed tile list, then its count in one more entry
  size_t routed_gemm_tiles_n_ = 0;
  bool last_fp8_big_grouped_ = false;  // the last grouped_linear_fp8 ran its larger groups in one launch
  // The products of the grouped GEMMs (cuda_grouped_gemm_core.cpp): wgmma while wanted, on an sm_90
  // device, once the self-check before its first use agreed with mma.sync; mma.sync otherwise.
  // launch_core: grouped_core for a launch about to run, kept as last_core_ and counted.
  cuda::GemmCore grouped_core();
  cuda::GemmCore launch_core();
  const char* last_core_name() const { return last_core_ == cuda::GemmCore::kWgmma ? "wgmma" : "mma.sync"; }
  bool wgmma_self_check();
  bool wgmma_ = true, wgmma_checked_ = false, wgmma_bad_ = false;
  bool has_wgmma_ = false;  // the device is sm_90 (compute capability 9.0)
  cuda::GemmCore last_core_ = cuda::GemmCore::kMmaSync;
  int64_t wgmma_gemm_calls_ = 0;
  int sms_ = 0;                   // multiprocessors of the device

  // attention / latent_attention (cuda_attention.cpp): the split launch for a step whose unsplit
  // grid would leave the device short of work (kernels/cuda/attention_partitions.h), sized from
  // BlockTables::max_pos; its states live in a device buffer that only grows (a grown-out buffer a
  // graph holds is retired, as the workspaces).
  // The decode kernels (all of a step, or its single tokens beside runs on tensor cores: fp32, or
  // for MLA with set_decode_attention_bf16 on tensor cores), the runs of prefill chunks on tensor
  // cores (set_prefill_attention_bf16) from their tile lists, and a step split between them
  // (split_step), with the positions that mask the runs for the decode launch.
  // Every one of these kernels writes out's twin with out, so no launch casts it after.
  void attention_fp32(const float* q, int64_t T, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                      const KvCacheRef& cache, int64_t block_size, const BlockTables& tables, const int32_t* pos,
                      int64_t window, float scale, bool chunk_step, ActivationsOut out);
  void attention_bf16(const cuda::PrefillMmaTiles& plan, const float* q, int64_t n_heads, int64_t n_kv_heads,
                      int64_t head_dim, const KvCacheRef& cache, int64_t block_size, const BlockTables& tables,
                      const int32_t* pos, int64_t window, float scale, ActivationsOut out);
  void latent_attention_decode(const float* q_latent, const float* q_rope, int64_t T, int64_t n_heads, int64_t kv_lora,
                               int64_t rope_dim, const KvCacheRef& cache, int64_t block_size, const BlockTables& tables,
                               const int32_t* pos, float scale, float* out);
  void latent_attention_bf16(const std::vector<int32_t>& tiles, const float* q_latent, const float* q_rope,
                             int64_t n_heads, int64_t kv_lora, int64_t rope_dim, const KvCacheRef& cache,
                             int64_t block_size, const BlockTables& tables, const int32_t* pos, float scale,
                             float* out);
  void split_step(const int32_t* pos, const BlockTables& tables, int64_t T,
                  const std::function<void(const int32_t*)>& fp32, const std::function<void()>& tensor_cores);
  int32_t* single_pos_ = nullptr;
  size_t single_pos_n_ = 0;
  int64_t last_attention_singles_ = 0;
  const int32_t* upload_attention_tiles(const std::vector<int32_t>& tiles);
  cuda::AttentionSplit attention_split(int64_t blocks, int64_t T, int64_t n_heads, int64_t width,
                                       const BlockTables& tables, int64_t window);
  float* attn_states_ = nullptr;
  size_t attn_states_n_ = 0;
  int64_t last_attention_parts_ = 1;
  bool last_attention_tiled_ = false;
  // Prefill chunks on tensor cores (kernels/cuda/prefill_attention_mma.h and
  // prefill_latent_attention_mma.h): on or off, and the step's tiles on the device (a buffer that
  // only grows; never used inside a capture).
  bool attn_bf16_ = false;
  bool decode_bf16_ = false;  // MLA decode on tensor cores (decode_latent_attention_mma.h)
  bool last_attention_bf16_ = false;
  int64_t last_attention_packed_tiles_ = 0;
  int32_t* attn_tiles_ = nullptr;
  size_t attn_tiles_n_ = 0;
  std::vector<int32_t> attn_tiles_host_;  // what attn_tiles_ holds
  // sample(): device buffers that only grow (never used inside a capture, so freed at once when
  // they grow): the rows, the tempered-probability scratch [R, V], the tokens, the logprobs, the
  // edited copy of the logits [R, V], the token edits' entries, and the top
  // alternatives' tokens and logprobs. ahead: grow
  // by half again as much as asked (the entries grow a little nearly every decode step, and
  // cudaFree synchronizes the device).
  void* sample_buffer(int i, size_t bytes, bool ahead = false);
  // rows, scratch, tokens, logprobs, edited logits, edit entries, top tokens, top logprobs
  static constexpr int kSampleBuffers = 8;
  void* sample_buf_[kSampleBuffers] = {};
  size_t sample_bytes_[kSampleBuffers] = {};

  // grouped_linear: the path each (N, K, bf16?) shape takes (downgraded at most twice, never back;
  // fp32 weights: kF32Out means grouped SGEMM) and the path of the last call (for
  // grouped_linear_path; kSgemm for grouped SGEMM). Device buffers that only grow, never used
  // inside a capture, so freed at once when they grow: the A, B, C pointer arrays, and the bf16
  // output of the second path.
  enum class GroupedPath { kF32Out, kBf16Out, kPerGroup, kSgemm, kFp8 };
  // One grouped GEMM over the groups in `live`: CUBLAS_STATUS_SUCCESS (0), or the status cuBLAS
  // refused it with as unsupported (any other failure throws).
  int grouped_gemm(const float* x, const uint16_t* xb, const std::vector<int64_t>& offsets,
                   const std::vector<const Matrix*>& w, const std::vector<size_t>& live, bool bf16, GroupedPath path,
                   float* y);
  void** grouped_pointers(size_t n);
  // grouped_linear_routed: each weight set's device table of cuda::RoutedWeight, made at its first
  // call (a capture's warm-up run makes it; the weights outlive the backend's use of it) and kept;
  // the pass list and its count, a workspace that grows only outside captures.
  const void* routed_table(const std::vector<const Matrix*>& w);
  std::map<std::vector<const void*>, void*> routed_tables_;  // tables in owned_
  cuda::Fp8MatmulPass* routed_passes_ = nullptr;  // the list, then the count in one more entry
  size_t routed_passes_n_ = 0;
  int64_t routed_launches_ = 0;
  bool routed_grouped_ = true;  // set_routed_grouped_gemm
  int64_t bf16_routed_gemm_calls_ = 0;
  std::string last_routed_ = "none yet";  // routed_linear_path
  std::map<std::tuple<int64_t, int64_t, bool>, GroupedPath> grouped_paths_;
  GroupedPath last_grouped_ = GroupedPath::kPerGroup;
  void** grouped_ptrs_ = nullptr;
  size_t grouped_ptrs_n_ = 0;
  uint16_t* grouped_out_ws_ = nullptr;
  size_t grouped_out_ws_n_ = 0;
  std::vector<const void*> grouped_host_ptrs_;

  // CUDA graphs (see the file comment).
  void bind_cublas(void* stream, bool own_workspace);  // cuBLAS on `stream`, with cublas_ws_ or not
  void* stream_ = nullptr;          // cudaStream_t ops are issued to: null (legacy) or capture_stream_
  void* capture_stream_ = nullptr;  // cudaStream_t, made at the first capture
  bool capturing_ = false;
  void* cublas_ws_ = nullptr;       // cuBLAS workspace while capturing
  std::unordered_map<int64_t, void*> graphs_;  // handle -> cudaGraphExec_t
  std::unordered_map<int64_t, int64_t> graph_nodes_;  // handle -> its graph's node count
  int64_t next_graph_ = 0;
  std::vector<void*> retired_;  // workspaces replaced since the graphs were captured
  std::vector<void*> timeline_events_;  // cudaEvent_t, the op profile's marks (cuda_timeline.cpp)
  size_t timeline_used_ = 0;

 public:
  // Expert-parallel data movement (kernels/cuda/expert_rows.h).
  void gather_rows(const float* src, int64_t H, const int32_t* rows, int64_t n, ActivationsOut dst) override;
  void pack_bf16(const float* src, int64_t blocks, int64_t block_len, int64_t round_len, uint16_t* dst) override;
  void unpack_bf16(const uint16_t* src, int64_t blocks, int64_t block_len, int64_t round_len, float* dst) override;
  void pack_fp8(const float* src, int64_t blocks, int64_t block_len, int64_t round_len, int64_t row_len,
                uint8_t* dst) override;
  void unpack_fp8(const uint8_t* src, int64_t blocks, int64_t block_len, int64_t round_len, int64_t row_len,
                  float* dst) override;
  // kernels/cuda/expert_exchange.h.
  void expert_send_plan(const cpu::ExchangeShape& s, const int32_t* ids, int64_t T, cpu::RowShare share,
                        const int32_t* pos, int32_t* rec_token, float* blocks, int32_t* pair_row, int64_t* counts,
                        int32_t* overflow) override;
  void expert_recv_plan(const cpu::ExchangeShape& s, const float* blocks, int32_t* offsets, int32_t* row_src,
                        int32_t* back_row) override;
  void pack_rows_bf16(const float* src, int64_t H, const int32_t* rows, int64_t n, uint16_t* dst) override;
  void unpack_rows_bf16(const uint16_t* src, int64_t H, const int32_t* rows, int64_t n, ActivationsOut dst) override;
  void pack_rows_fp8(const float* src, int64_t H, const int32_t* rows, int64_t n, uint8_t* dst) override;
  void unpack_rows_fp8(const uint8_t* src, int64_t H, const int32_t* rows, int64_t n, ActivationsOut dst) override;
  void combine_rows_bf16(const uint16_t* y, int64_t H, const int32_t* token_start, const int32_t* rows,
                         const float* weights, int64_t T, float* out) override;
  void combine_rows(const float* y, int64_t H, const int32_t* token_start, const int32_t* rows, const float* weights,
                    int64_t T, float* out) override;
};

std::unique_ptr<ComputeBackend> make_cuda_backend();

}  // namespace shardlm
