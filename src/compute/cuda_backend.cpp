#include "compute/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <exception>
#include <vector>

#include "compute/cuda_check.h"
#include "core/error.h"
#include "cuda/activation.h"
#include "cuda/device_info.h"
#include "cuda/elementwise.h"
#include "cuda/embedding.h"
#include "cuda/expert_permute.h"
#include "cuda/fp8_dequant.h"
#include "cuda/abs_max.h"
#include "cuda/gated_add.h"
#include "cuda/head_matmul.h"
#include "cuda/kv_cache_write.h"
#include "cuda/latent_attention.h"
#include "cuda/latent_rope_cache_write.h"
#include "cuda/moe_topk.h"
#include "cuda/rmsnorm.h"
#include "cuda/rope.h"
#include "cuda/rope_kv_write.h"
#include "model/checkpoint.h"
#include "model/fp8_block.h"

namespace shardlm {
namespace {

// The legacy default stream: see cuda_backend.h for why every op runs on it.
constexpr cudaStream_t kStream = 0;
// Two pinned buffers of this size carry weight uploads.
constexpr size_t kStagingBytes = size_t{32} << 20;


// cuBLAS's workspace while capturing: with one of its own it allocates nothing inside the capture.
// 32 MiB is what the cuBLAS documentation recommends for Hopper (more than enough for the rest).
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

// fp32 copy of a host tensor in F32, BF16 or F16 (vectors, F16 matrices).
std::vector<float> host_f32(const TensorView& t) {
  const int64_t n = t.numel();
  std::vector<float> out(static_cast<size_t>(n));
  switch (t.dtype) {
    case DType::F32: std::memcpy(out.data(), t.data, n * sizeof(float)); break;
    case DType::BF16: {
      const auto* s = static_cast<const uint16_t*>(t.data);
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(s[i]);
      break;
    }
    case DType::F16: {
      const auto* s = static_cast<const uint16_t*>(t.data);
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(s[i]);
      break;
    }
    default:
      SHARDLM_FAIL("cuda backend: tensor '" << t.name << "' in " << t.file << " has dtype " << dtype_name(t.dtype)
                                            << "; expected F32, BF16 or F16");
  }
  return out;
}

}  // namespace

CudaBackend::CudaBackend() {
  SHARDLM_CHECK(cuda::device_count() > 0, "--backend cuda: no CUDA device on this host (" << cuda::why_none() << ")");
  SHARDLM_CUDA_CHECK(cudaGetDevice(&device_));
  SHARDLM_CUDA_CHECK(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device_));
  int major = 0, minor = 0;
  SHARDLM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_));
  SHARDLM_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_));
  has_wgmma_ = major == 9 && minor == 0;
  cublasHandle_t h = nullptr;
  SHARDLM_CUBLAS_CHECK(cublasCreate(&h));
  cublas_ = h;
  SHARDLM_CUBLAS_CHECK(cublasSetStream(h, kStream));
  // Exact fp32 SGEMM: no TF32 even where the environment would allow it.
  SHARDLM_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
  cudaStream_t s = nullptr;
  SHARDLM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  copy_stream_ = s;
  staging_bytes_ = kStagingBytes;
  for (int i = 0; i < 2; ++i) {
    SHARDLM_CUDA_CHECK(cudaMallocHost(&staging_[i], staging_bytes_));
    cudaEvent_t e = nullptr;
    SHARDLM_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    staged_[i] = e;
  }
}

CudaBackend::~CudaBackend() {
  // Unwinding an error (a peer timed out): a sync or cudaFree could wait for ever on a collective
  // queued for that peer, before the job's abort names the cause. The process is about to end.
  if (std::uncaught_exceptions() > 0) return;
  // Errors are ignored here: a destructor may run while an earlier CUDA error unwinds the stack
  // (a capture left open by an exception is ended first: synchronising inside it would fail).
  if (capturing_) {
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(stream_of(capture_stream_), &g);
    if (g) cudaGraphDestroy(g);
  }
  cudaDeviceSynchronize();
  for (auto& [id, exec] : graphs_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec));
  for (void* p : allocs_) cudaFree(p);
  for (void* p : owned_) cudaFree(p);
  for (void* p : retired_) cudaFree(p);
  cudaFree(cublas_ws_);
  if (capture_stream_) cudaStreamDestroy(stream_of(capture_stream_));
  cudaFree(bf16_ws_);
  cudaFree(parts_ws_);
  cudaFree(fp8_dequant_ws_);
  release_w8a8();
  cudaFree(fp8_passes_);
  cudaFree(fp8_gemm_tiles_);
  cudaFree(routed_gemm_tiles_);
  cudaFree(grouped_ptrs_);
  cudaFree(grouped_out_ws_);
  cudaFree(routed_passes_);
  cudaFree(attn_states_);
  cudaFree(attn_tiles_);
  cudaFree(single_pos_);
  for (void* p : sample_buf_) cudaFree(p);
  for (void* e : timeline_events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  for (int i = 0; i < 2; ++i) {
    if (staged_[i]) cudaEventDestroy(static_cast<cudaEvent_t>(staged_[i]));
    if (staging_[i]) cudaFreeHost(staging_[i]);
  }
  if (copy_stream_) cudaStreamDestroy(static_cast<cudaStream_t>(copy_stream_));
  if (cublas_) cublasDestroy(cublas_of(cublas_));
}

void* CudaBackend::upload(const void* host, size_t bytes) {
  void* dev = nullptr;
  SHARDLM_CUDA_CHECK(cudaMalloc(&dev, std::max<size_t>(bytes, 1)));
  owned_.push_back(dev);
  weight_bytes_ += bytes;
  auto* dst = static_cast<uint8_t*>(dev);
  const auto* src = static_cast<const uint8_t*>(host);
  auto stream = static_cast<cudaStream_t>(copy_stream_);
  // Piece i is read from the checkpoint into staging buffer i % 2 while piece i - 1 is in flight,
  // and across calls: the next weight's first piece is read while this one's last is copied.
  // The host waits only before refilling a staging buffer; the source may be freed on return.
  cudaEvent_t last = nullptr;
  for (size_t off = 0; off < bytes; off += staging_bytes_) {
    const size_t n = std::min(staging_bytes_, bytes - off);
    const int b = next_staging_;
    next_staging_ ^= 1;
    auto done = static_cast<cudaEvent_t>(staged_[b]);
    SHARDLM_CUDA_CHECK(cudaEventSynchronize(done));
    std::memcpy(staging_[b], src + off, n);
    SHARDLM_CUDA_CHECK(cudaMemcpyAsync(dst + off, staging_[b], n, cudaMemcpyHostToDevice, stream));
    SHARDLM_CUDA_CHECK(cudaEventRecord(done, stream));
    last = done;
  }
  // Ops run on the legacy stream, which the copy stream is not ordered with: make it wait for the
  // copy (on the device; the host goes on reading).
  if (last) SHARDLM_CUDA_CHECK(cudaStreamWaitEvent(kStream, last, 0));
  return dev;
}

Matrix CudaBackend::load_matrix(const TensorView& t) {
  SHARDLM_CHECK(t.shape.size() == 2, "cuda backend: tensor '" << t.name << "' in " << t.file << " has "
                                                              << t.shape.size() << " dimensions; a matrix needs 2");
  SHARDLM_CHECK(t.data != nullptr || t.numel() == 0, "cuda backend: tensor '" << t.name << "' has no data");
  Matrix m;
  m.rows = t.shape[0];
  m.cols = t.shape[1];
  if (t.dtype == DType::F32 || t.dtype == DType::BF16) {
    m.dtype = t.dtype;
    m.data = upload(t.data, static_cast<size_t>(t.numel()) * dtype_size(t.dtype));
    low_precision_weights_ = low_precision_weights_ || t.dtype == DType::BF16;
    return m;
  }
  SHARDLM_CHECK(t.dtype == DType::F16, "cuda backend: matrix '" << t.name << "' in " << t.file << " has dtype "
                                                                << dtype_name(t.dtype) << "; expected F32, BF16 or F16");
  const std::vector<float> f = host_f32(t);
  m.dtype = DType::F32;
  m.data = upload(f.data(), f.size() * sizeof(float));
  return m;
}

Matrix CudaBackend::load_fp8_matrix(const TensorView& w, const TensorView& scale_inv, int64_t block_rows,
                                    int64_t block_cols, int64_t r0, int64_t nr, int64_t c0, int64_t nc, bool keep) {
  check_fp8_slice(w, scale_inv, block_rows, block_cols, r0, nr, c0, nc);
  Matrix m;
  m.rows = nr;
  m.cols = nc;
  // The slice's fp8 bytes, packed (a column slice is strided in the checkpoint), and its scales.
  const int64_t C = w.shape[1];
  std::vector<uint8_t> bytes(static_cast<size_t>(nr * nc));
  const auto* src = static_cast<const uint8_t*>(w.data);
  for (int64_t r = 0; r < nr; ++r) std::memcpy(&bytes[r * nc], src + (r0 + r) * C + c0, static_cast<size_t>(nc));
  const Fp8SliceScales s = fp8_slice_scales(scale_inv, block_rows, block_cols, r0, nr, c0, nc);
  low_precision_weights_ = true;  // kept fp8 or dequantised to bf16, its linears read bf16 rows
  if (keep && keep_fp8_) {
    m.dtype = DType::F8_E4M3;
    m.data = upload(bytes.data(), bytes.size());
    // Scale rows padded with zeros to a multiple of 4 columns: the row stride cuBLASLt's 128x128
    // block scales take (cuda_w8a8_linear.cpp); every other reader indexes through fp8.cols.
    const int64_t stride = (s.cols + 3) / 4 * 4;
    std::vector<float> padded(static_cast<size_t>(s.rows * stride), 0.0f);
    for (int64_t r = 0; r < s.rows; ++r)
      std::copy_n(&s.scales[static_cast<size_t>(r * s.cols)], s.cols, &padded[static_cast<size_t>(r * stride)]);
    m.fp8.scale_inv = static_cast<const float*>(upload(padded.data(), padded.size() * sizeof(float)));
    m.fp8.cols = stride;
    m.fp8.block_rows = block_rows;
    m.fp8.block_cols = block_cols;
    m.fp8.row_off = r0 % block_rows;
    m.fp8.col_off = c0 % block_cols;
    return m;
  }
  m.dtype = DType::BF16;
  void* out = nullptr;
  SHARDLM_CUDA_CHECK(cudaMalloc(&out, std::max<size_t>(static_cast<size_t>(nr * nc) * 2, 1)));
  owned_.push_back(out);
  weight_bytes_ += static_cast<size_t>(nr * nc) * 2;
  m.data = out;
  if (nr == 0 || nc == 0) return m;
  // Staged uploads: freed below once the kernel has read them.
  void* q = upload(bytes.data(), bytes.size());
  void* sc = upload(s.scales.data(), s.scales.size() * sizeof(float));
  cuda::launch_fp8_dequant_slice(static_cast<const uint8_t*>(q), static_cast<const float*>(sc), s.cols, nr, nc, r0, c0,
                                 block_rows, block_cols, static_cast<uint16_t*>(out), kStream);
  check_launch("fp8_dequant");
  SHARDLM_CUDA_CHECK(cudaStreamSynchronize(kStream));
  for (void* p : {q, sc}) {
    owned_.erase(std::find(owned_.begin(), owned_.end(), p));
    SHARDLM_CUDA_CHECK(cudaFree(p));
  }
  weight_bytes_ -= bytes.size() + s.scales.size() * sizeof(float);
  return m;
}

Vector CudaBackend::load_vector(const TensorView& t) {
  SHARDLM_CHECK(t.shape.size() == 1, "cuda backend: tensor '" << t.name << "' in " << t.file << " has "
                                                              << t.shape.size() << " dimensions; a vector needs 1");
  const std::vector<float> f = host_f32(t);
  Vector v;
  v.n = t.shape[0];
  v.data = static_cast<const float*>(upload(f.data(), f.size() * sizeof(float)));
  return v;
}

void* CudaBackend::alloc(size_t bytes) {
  SHARDLM_CHECK(!capturing_, "cuda backend: alloc of " << bytes << " bytes while capturing a CUDA graph (the caller "
                             "must size its buffers before the capture)");
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, std::max<size_t>(bytes, 1));
  if (err != cudaSuccess) {
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    SHARDLM_FAIL("cuda backend: cudaMalloc of " << bytes << " bytes failed on device " << device_ << " ("
                                                << cudaGetErrorString(err) << "; " << free_b << " of " << total_b
                                                << " bytes free; the KV cache takes --kv-cache-gb, or with "
                                                   "auto --kv-cache-free-fraction of what loading and the profile "
                                                   "steps left: lower it)");
  }
  allocs_.insert(p);
  return p;
}

bool CudaBackend::device_memory(size_t* free_bytes, size_t* total_bytes) const {
  return cudaMemGetInfo(free_bytes, total_bytes) == cudaSuccess;
}

void CudaBackend::free(void* p) {
  if (!p) return;
  SHARDLM_CHECK(!capturing_, "cuda backend: free while capturing a CUDA graph");
  auto it = allocs_.find(p);
  SHARDLM_CHECK(it != allocs_.end(), "cuda backend: free() of a pointer not from alloc()");
  allocs_.erase(it);
  // Destructors free device memory, also while an earlier error unwinds. After a kernel fault
  // every CUDA call returns the same sticky error, and a throw from a destructor then would end the
  // process (std::terminate) before the first error reaches main and aborts the job with its
  // message: while unwinding, the failed free is left to that error.
  if (std::uncaught_exceptions() > 0) {
    cudaFree(p);
    return;
  }
  SHARDLM_CUDA_CHECK(cudaFree(p));
}

void CudaBackend::copy_to_device(void* dst, const void* src, size_t bytes) {
  // cudaMemcpyDefault: the source may be host memory or (a device-to-device gather) the device.
  // From pageable host memory the call returns once the source has been read, so the caller may
  // reuse it at once.
  if (bytes) SHARDLM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_of(stream_)));
}

void CudaBackend::copy_to_host(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  SHARDLM_CHECK(!capturing_, "cuda backend: copy_to_host while capturing a CUDA graph (a captured step cannot read "
                             "the device from the host)");
  SHARDLM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_of(stream_)));
  SHARDLM_CUDA_CHECK(cudaStreamSynchronize(stream_of(stream_)));
}

void CudaBackend::synchronize() {
  SHARDLM_CHECK(!capturing_, "cuda backend: synchronize while capturing a CUDA graph");
  SHARDLM_CUDA_CHECK(cudaStreamSynchronize(stream_of(stream_)));
}

// cublasSetStream resets the handle's workspace to cuBLAS's own pool, so the workspace is set
// again after every stream change.
void CudaBackend::bind_cublas(void* stream, bool own_workspace) {
  SHARDLM_CUBLAS_CHECK(cublasSetStream(cublas_of(cublas_), stream_of(stream)));
  if (own_workspace) SHARDLM_CUBLAS_CHECK(cublasSetWorkspace(cublas_of(cublas_), cublas_ws_, kCublasWorkspaceBytes));
}

// Capture runs on a non-blocking stream of the backend's own: the legacy default stream cannot be
// captured, and a non-blocking stream keeps the capture apart from work other code issues on the
// legacy stream meanwhile. Thread-local mode: only this thread's unsafe calls (cudaMalloc, a
// synchronisation) fail the capture, not those of other threads (a communicator's progress thread).
// Nothing is executed while capturing; replay launches the graph on the legacy stream, so it is
// ordered after the input uploads before it and before the logits' copy after it, as eager ops are.
void CudaBackend::begin_capture() {
  SHARDLM_CHECK(!capturing_, "cuda backend: begin_capture while already capturing");
  if (!capture_stream_) {
    cudaStream_t s = nullptr;
    SHARDLM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    capture_stream_ = s;
  }
  if (!cublas_ws_) SHARDLM_CUDA_CHECK(cudaMalloc(&cublas_ws_, kCublasWorkspaceBytes));
  bind_cublas(capture_stream_, true);
  const cudaError_t err = cudaStreamBeginCapture(stream_of(capture_stream_), cudaStreamCaptureModeThreadLocal);
  if (err != cudaSuccess) {
    bind_cublas(nullptr, false);
    SHARDLM_CUDA_CHECK(err);
  }
  stream_ = capture_stream_;
  capturing_ = true;
}

int64_t CudaBackend::end_capture() {
  SHARDLM_CHECK(capturing_, "cuda backend: end_capture without begin_capture");
  // Back to eager mode before anything can throw: the stream, cuBLAS and the flag.
  capturing_ = false;
  stream_ = nullptr;
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream_of(capture_stream_), &graph);
  bind_cublas(nullptr, false);
  if (ended != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    SHARDLM_FAIL("cuda backend: capturing a CUDA graph failed on device "
                 << device_ << ": " << cudaGetErrorName(ended) << " (" << cudaGetErrorString(ended)
                 << "); an op of the step is not capturable");
  }
  size_t nodes = 0;
  const cudaError_t counted = cudaGraphGetNodes(graph, nullptr, &nodes);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);  // the executable graph is independent of it
  SHARDLM_CUDA_CHECK(counted);
  SHARDLM_CUDA_CHECK(made);
  const int64_t id = next_graph_++;
  graphs_[id] = exec;
  graph_nodes_[id] = static_cast<int64_t>(nodes);
  return id;
}

int64_t CudaBackend::captured_nodes(int64_t handle) const {
  auto it = graph_nodes_.find(handle);
  SHARDLM_CHECK(it != graph_nodes_.end(), "cuda backend: captured_nodes of unknown graph " << handle);
  return it->second;
}

void CudaBackend::replay(int64_t handle) {
  SHARDLM_CHECK(!capturing_, "cuda backend: replay while capturing");
  auto it = graphs_.find(handle);
  SHARDLM_CHECK(it != graphs_.end(), "cuda backend: replay of unknown graph " << handle);
  SHARDLM_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(it->second), stream_of(stream_)));
  check_launch("graph replay");
}

void CudaBackend::drop_captures() {
  SHARDLM_CHECK(!capturing_, "cuda backend: drop_captures while capturing");
  if (graphs_.empty() && retired_.empty()) return;
  // A launched graph may still run: its executable and the workspaces it reads go once it is done.
  SHARDLM_CUDA_CHECK(cudaStreamSynchronize(stream_of(stream_)));
  for (auto& [id, exec] : graphs_) SHARDLM_CUDA_CHECK(cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec)));
  graphs_.clear();
  graph_nodes_.clear();
  for (void* p : retired_) SHARDLM_CUDA_CHECK(cudaFree(p));
  retired_.clear();
}

void CudaBackend::check_launch(const char* op) {
  const cudaError_t err = cudaGetLastError();
  SHARDLM_CHECK(err == cudaSuccess, "cuda backend: " << op << " kernel failed on device " << device_ << ": "
                                                     << cudaGetErrorName(err) << " (" << cudaGetErrorString(err)
                                                     << ")");
}

void* CudaBackend::upload_list(void*& buf, size_t& n, const void* host, size_t count, size_t elem) {
  const cudaStream_t s = stream_of(stream_);
  if (count > n) {
    SHARDLM_CUDA_CHECK(cudaStreamSynchronize(s));  // an earlier launch may still read the old list
    SHARDLM_CUDA_CHECK(cudaFree(buf));
    buf = nullptr;
    n = 0;
    SHARDLM_CUDA_CHECK(cudaMalloc(&buf, count * elem));
    n = count;
  }
  // From pageable memory: returns once the host list is read.
  SHARDLM_CUDA_CHECK(cudaMemcpyAsync(buf, host, count * elem, cudaMemcpyHostToDevice, s));
  return buf;
}

void* CudaBackend::regrow_workspace(void*& ws, size_t bytes) {
  SHARDLM_CUDA_CHECK(cudaStreamSynchronize(stream_of(stream_)));  // the old workspace may still be read
  // A captured graph holds the old pointer: it stays allocated until the graphs are dropped.
  if (graphs_.empty())
    SHARDLM_CUDA_CHECK(cudaFree(ws));
  else if (ws)
    retired_.push_back(ws);
  ws = nullptr;
  SHARDLM_CUDA_CHECK(cudaMalloc(&ws, bytes));
  return ws;
}

uint16_t* CudaBackend::bf16_workspace(size_t n) { return grown_workspace(bf16_ws_, bf16_ws_n_, n, "bf16 GEMM"); }

void CudaBackend::embedding(const int32_t* ids, int64_t T, const Matrix& table, float* out) {
  SHARDLM_CHECK(table.dtype == DType::BF16 || table.dtype == DType::F32,
                "cuda backend: embedding table of dtype " << dtype_name(table.dtype)
                                                          << " (tables load as WeightUse::kTable: F32 or BF16)");
  if (table.dtype == DType::BF16)
    cuda::embedding_bf16(ids, T, static_cast<const uint16_t*>(table.data), table.cols, out, stream_of(stream_));
  else
    cuda::embedding_f32(ids, T, static_cast<const float*>(table.data), table.cols, out, stream_of(stream_));
  check_launch("embedding");
}

void CudaBackend::rmsnorm(const float* x, const Vector& w, int64_t rows, float eps, ActivationsOut out) {
  cuda::rmsnorm(x, w.data, rows, w.n, eps, out.f32, out.bf16, stream_of(stream_));
  check_launch("rmsnorm");
}

void CudaBackend::add_rmsnorm(float* residual, const float* x, const Vector& w, int64_t rows, float eps,
                              ActivationsOut out) {
  cuda::add_rmsnorm(residual, x, w.data, rows, w.n, eps, out.f32, out.bf16, stream_of(stream_));
  check_launch("add_rmsnorm");
}

// Row-major y[M,N] = x[M,K] W^T is column-major y^T[N,M] = W^T(col-major [K,N])^T x^T([K,M]).
const uint16_t* CudaBackend::cast_bf16(Activations x, int64_t n) {
  if (x.bf16) {
    ++twin_reads_;
    return x.bf16;
  }
  uint16_t* xb = bf16_workspace(static_cast<size_t>(n));
  cuda::f32_to_bf16(x.f32, xb, n, stream_of(stream_));
  check_launch("f32_to_bf16");
  ++activation_casts_;
  return xb;
}

void CudaBackend::gemm_bf16_cast(const uint16_t* xb, int64_t M, const uint16_t* w, int64_t N, int64_t K, float* y) {
  const float alpha = 1.0f, beta = 0.0f;
  SHARDLM_CUBLAS_CHECK(cublasGemmEx(cublas_of(cublas_), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N),
                                    static_cast<int>(M), static_cast<int>(K), &alpha, w, CUDA_R_16BF,
                                    static_cast<int>(K), xb, CUDA_R_16BF, static_cast<int>(K), &beta, y, CUDA_R_32F,
                                    static_cast<int>(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void CudaBackend::gemm_bf16(Activations x, int64_t M, const uint16_t* w, int64_t N, int64_t K, float* y) {
  gemm_bf16_cast(cast_bf16(x, M * K), M, w, N, K, y);
}

void CudaBackend::linear(Activations x, int64_t M, const Matrix& w, const Vector* bias, float* y) {
  if (M == 0 || w.rows == 0) return;
  const int64_t N = w.rows, K = w.cols;
  SHARDLM_CHECK(N <= INT32_MAX && K <= INT32_MAX && M <= INT32_MAX,
                "cuda backend: linear of " << M << " x " << K << " by " << N << " exceeds cuBLAS's int sizes");
  const float alpha = 1.0f, beta = 0.0f;
  if (w.dtype == DType::BF16) {
    gemm_bf16(x, M, static_cast<const uint16_t*>(w.data), N, K, y);
  } else if (w.dtype == DType::F8_E4M3) {
    linear_fp8(x, M, w, y);
  } else {
    SHARDLM_CHECK(w.dtype == DType::F32,
                  "cuda backend: linear weight dtype " << dtype_name(w.dtype) << " is not F32, BF16 or F8_E4M3");
    SHARDLM_CUBLAS_CHECK(cublasSgemm(cublas_of(cublas_), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N),
                                     static_cast<int>(M), static_cast<int>(K), &alpha,
                                     static_cast<const float*>(w.data), static_cast<int>(K), x.f32, static_cast<int>(K),
                                     &beta, y, static_cast<int>(N)));
  }
  if (bias && bias->data) {
    SHARDLM_CHECK(bias->n == N, "cuda backend: linear bias has " << bias->n << " elements; weight has " << N
                                                                   << " rows");
    cuda::add_bias_rows(y, M, N, bias->data, stream_of(stream_));
    check_launch("add_bias_rows");
  }
}

void CudaBackend::rope(float* x, int64_t T, int64_t n_heads, int64_t head_dim, const int32_t* pos,
                       const float* inv_freq) {
  cuda::rope_rotate_half(x, T, n_heads, head_dim, pos, inv_freq, stream_of(stream_));
  check_launch("rope");
}

void CudaBackend::rope_qk(float* q, int64_t q_heads, float* k, int64_t k_heads, int64_t T, int64_t head_dim,
                          const int32_t* pos, const float* inv_freq) {
  cuda::rope_rotate_half_qk(q, q_heads, k, k_heads, T, head_dim, pos, inv_freq, stream_of(stream_));
  check_launch("rope_qk");
}

void CudaBackend::silu_mul(const float* gate, const float* up, ActivationsOut out, int64_t n) {
  cuda::silu_mul(gate, up, out.f32, out.bf16, n, stream_of(stream_));
  check_launch("silu_mul");
}

void CudaBackend::silu_mul_stacked(const float* gate_up, int64_t rows, int64_t width, ActivationsOut out) {
  cuda::silu_mul_stacked(gate_up, rows, width, out.f32, out.bf16, stream_of(stream_));
  check_launch("silu_mul_stacked");
}

void CudaBackend::add(float* y, const float* x, int64_t n) {
  cuda::add_inplace(y, x, n, stream_of(stream_));
  check_launch("add");
}

void CudaBackend::kv_write(const float* k, const float* v, int64_t T, const int64_t* slots, int64_t n_kv_heads,
                           int64_t head_dim, int64_t /*block_size: whole rows per slot*/, const KvCacheRef& cache) {
  cuda::kv_cache_write(k, v, T, slots, n_kv_heads, head_dim, cache.k, cache.v, cache_format(cache), stream_of(stream_));
  check_launch("kv_write");
}

void CudaBackend::rope_kv_write(float* q, int64_t q_heads, float* k, const float* v, int64_t kv_heads, int64_t T,
                                int64_t head_dim, const QkNorms& norms, const int32_t* pos, const float* inv_freq,
                                const int64_t* slots, int64_t block_size, const KvCacheRef& cache) {
  // A head wider than the kernel stages (no model's) takes the separate launches.
  if (head_dim > cuda::kRopeKvWriteMaxHeadDim) {
    ComputeBackend::rope_kv_write(q, q_heads, k, v, kv_heads, T, head_dim, norms, pos, inv_freq, slots, block_size,
                                  cache);
    return;
  }
  for (const Vector* n : {norms.q, norms.k})
    SHARDLM_CHECK(!n || n->n == head_dim,
                  "cuda backend: a q/k norm has " << (n ? n->n : 0) << " weights for " << head_dim << "-wide heads");
  cuda::rope_kv_write(q, q_heads, k, v, kv_heads, T, head_dim, norms.q ? norms.q->data : nullptr,
                      norms.k ? norms.k->data : nullptr, norms.eps, pos, inv_freq, slots, cache.k, cache.v,
                      cache_format(cache), stream_of(stream_));
  check_launch("rope_kv_write");
}

void CudaBackend::rope_strided(const float* x, int64_t T, int64_t n_heads, int64_t x_stride, int64_t head_stride,
                               int64_t rot_dim, const int32_t* pos, const float* inv_freq, bool interleaved,
                               float attention_factor, float* out) {
  SHARDLM_CHECK(rot_dim % 2 == 0, "cuda backend: rope_strided rot_dim " << rot_dim << " is odd");
  cuda::rope_strided(x, T, n_heads, x_stride, head_stride, rot_dim, pos, inv_freq, interleaved, attention_factor, out,
                     stream_of(stream_));
  check_launch("rope_strided");
}

void CudaBackend::head_linear(const float* x, int64_t T, int64_t n_heads, int64_t x_stride, int64_t head_stride,
                              const Matrix& w, ActivationsOut y) {
  SHARDLM_CHECK(n_heads > 0 && w.rows % n_heads == 0, "cuda backend: head_linear weight has "
                                                          << w.rows << " rows, not a multiple of " << n_heads
                                                          << " heads");
  const int64_t N = w.rows / n_heads;
  if (w.dtype == DType::BF16)
    cuda::head_matmul_bf16w(x, T, n_heads, x_stride, head_stride, w.cols, static_cast<const uint16_t*>(w.data), N,
                            y.f32, y.bf16, stream_of(stream_));
  else if (w.dtype == DType::F32)
    cuda::head_matmul_f32w(x, T, n_heads, x_stride, head_stride, w.cols, static_cast<const float*>(w.data), N, y.f32,
                           y.bf16, stream_of(stream_));
  else
    SHARDLM_FAIL("cuda backend: head_linear weight dtype " << dtype_name(w.dtype) << " is not F32 or BF16");
  check_launch("head_linear");
}

void CudaBackend::latent_rope_cache_write(float* latent, const Vector& latent_norm, float eps, float* k_rope,
                                          const float* q_rope_in, int64_t n_heads, int64_t q_stride,
                                          int64_t q_head_stride, float* q_rope, int64_t T, int64_t kv_lora,
                                          int64_t rope_dim, const LatentRopeArgs& rope, const int64_t* slots,
                                          const KvCacheRef& cache) {
  SHARDLM_CHECK(rope_dim % 2 == 0, "cuda backend: latent_rope_cache_write rope_dim " << rope_dim << " is odd");
  SHARDLM_CHECK(latent_norm.n == kv_lora, "cuda backend: the latent norm has " << latent_norm.n << " weights for "
                                                                               << kv_lora << " latent columns");
  // A rope part wider than the kernel stages (no model's) takes the separate launches.
  if (rope_dim > cuda::kLatentRopeMaxDim) {
    ComputeBackend::latent_rope_cache_write(latent, latent_norm, eps, k_rope, q_rope_in, n_heads, q_stride,
                                            q_head_stride, q_rope, T, kv_lora, rope_dim, rope, slots, cache);
    return;
  }
  cuda::latent_rope_cache_write(latent, latent_norm.data, eps, k_rope, q_rope_in, n_heads, q_stride, q_head_stride,
                                q_rope, T, kv_lora, rope_dim,
                                {rope.pos, rope.inv_freq, rope.interleaved, rope.attention_factor}, slots, cache.k,
                                cache_format(cache), stream_of(stream_));
  check_launch("latent_rope_cache_write");
}

void CudaBackend::latent_cache_write(const float* latent, const float* k_rope, int64_t T, const int64_t* slots,
                                     int64_t kv_lora, int64_t rope_dim, const KvCacheRef& cache) {
  cuda::latent_cache_write(latent, k_rope, T, slots, kv_lora, rope_dim, cache.k, cache_format(cache),
                           stream_of(stream_));
  check_launch("latent_cache_write");
}

void CudaBackend::moe_route(const float* logits, int64_t T, const RouterConfig& cfg, int32_t* ids, float* weights) {
  const int64_t E = cfg.num_experts, k = cfg.k;
  SHARDLM_CHECK(k > 0 && k <= E && E <= INT32_MAX, "cuda backend: moe_route of " << k << " of " << E << " experts");
  if (cfg.sigmoid) {
    SHARDLM_CHECK(cfg.n_group > 0 && E % cfg.n_group == 0 && cfg.topk_group >= 1 && cfg.topk_group <= cfg.n_group &&
                      k <= cfg.topk_group * (E / cfg.n_group),
                  "cuda backend: moe_route: " << cfg.n_group << " groups, " << cfg.topk_group << " kept, k " << k
                                              << " of " << E << " experts is not a valid group-limited routing");
    cuda::launch_moe_topk_sigmoid(logits, T, static_cast<int>(E), static_cast<int>(k), cfg.bias,
                                  static_cast<int>(cfg.n_group), static_cast<int>(cfg.topk_group), cfg.norm_topk_prob,
                                  cfg.scale, ids, weights, stream_of(stream_));
  } else {
    cuda::launch_moe_topk_softmax(logits, T, static_cast<int>(E), static_cast<int>(k), cfg.renormalise, cfg.scale, ids,
                                  weights, stream_of(stream_));
  }
  check_launch("moe_route");
}

void CudaBackend::expert_permute(const int32_t* ids, int64_t T, int64_t k, int64_t e0, int64_t E, const int32_t* pos,
                                 int32_t* offsets, int32_t* slot_row, int32_t* row_pair, int64_t* counts) {
  SHARDLM_CHECK(T * k <= INT32_MAX && E <= INT32_MAX, "cuda backend: expert_permute of " << T << " x " << k);
  cuda::launch_expert_permute(ids, T, static_cast<int>(k), static_cast<int32_t>(e0), static_cast<int>(E), pos, offsets,
                              slot_row, row_pair, counts, stream_of(stream_));
  check_launch("expert_permute");
}

void CudaBackend::expert_gather(const float* x, int64_t H, int64_t k, const int32_t* row_pair, const int32_t* num_rows,
                                int64_t max_rows, ActivationsOut xp) {
  cuda::launch_expert_gather(x, H, static_cast<int>(k), row_pair, num_rows, max_rows, xp.f32, xp.bf16,
                             stream_of(stream_));
  check_launch("expert_gather");
}

void CudaBackend::expert_combine(const float* yp, int64_t H, const int32_t* ids, const float* weights,
                                 const int32_t* slot_row, int64_t T, int64_t k, float* out) {
  cuda::launch_expert_combine(yp, H, ids, weights, slot_row, T, static_cast<int>(k), out, stream_of(stream_));
  check_launch("expert_combine");
}

void CudaBackend::expert_combine_bf16(const uint16_t* yp, int64_t H, const int32_t* ids, const float* weights,
                                      const int32_t* slot_row, int64_t T, int64_t k, float* out) {
  cuda::launch_expert_combine_bf16(yp, H, ids, weights, slot_row, T, static_cast<int>(k), out, stream_of(stream_));
  check_launch("expert_combine_bf16");
}

void CudaBackend::gated_add(float* out, const float* y, const float* gate_logits, int64_t T, int64_t H) {
  cuda::gated_add(out, y, gate_logits, T, H, stream_of(stream_));
  check_launch("gated_add");
}

void CudaBackend::abs_max(const float* x, int64_t n, float* acc) {
  cuda::launch_abs_max(x, n, acc, stream_of(stream_));
  check_launch("abs_max");
}

std::unique_ptr<ComputeBackend> make_cuda_backend() { return std::make_unique<CudaBackend>(); }

}  // namespace shardlm
