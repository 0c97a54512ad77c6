// CudaBackend::linear_parts and make_adjacent: a layer's projections of one input (q/k/v; gate
// and up; MLA's q_a and kv_a) as vLLM's merged QKV and gate/up layers run them.
//
// At load, make_adjacent moves the parts' weights into one allocation, one after another (an
// fp8 weight's block scales too, when every part but the last ends on the block grid), so the
// parts read as one weight [sum of rows, K]. A step then runs one linear on that stacked weight:
// one activation cast and one GEMM (or one direct fp8 launch, or one W8A8 quantisation and GEMM)
// instead of one of each per part, which at decode is most of the launches of the projections.
// Its output lands in the parts' buffers directly when they are themselves one after another and
// nothing is to be added (one row, no biases), else in a workspace that split_columns spreads
// over them, adding the biases. Parts that are not adjacent still share one cast where all read
// bf16 activations.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <optional>

#include "compute/cuda_backend.h"
#include "compute/cuda_check.h"
#include "core/error.h"
#include "cuda/elementwise.h"
#include "cuda/split_columns.h"

namespace shardlm {

namespace {

size_t element_bytes(const Matrix& m) { return static_cast<size_t>(m.rows * m.cols) * dtype_size(m.dtype); }

// Scale rows an fp8 weight slice holds (load_fp8_matrix: the blocks its rows touch).
int64_t scale_rows(const Matrix& m) { return (m.fp8.row_off + m.rows + m.fp8.block_rows - 1) / m.fp8.block_rows; }

// Whether the parts can read as one weight once adjacent (stacked_rows): one dtype and width; fp8
// parts on one block grid, each starting a block and all but the last ending one, so their scale
// rows stack.
bool stackable(std::span<Matrix* const> parts) {
  const Matrix& a = *parts[0];
  if (a.dtype != DType::BF16 && a.dtype != DType::F32 && a.dtype != DType::F8_E4M3) return false;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Matrix& m = *parts[i];
    if (m.dtype != a.dtype || m.cols != a.cols || m.data == nullptr) return false;
    if (a.dtype != DType::F8_E4M3) continue;
    const Fp8Blocks& f = m.fp8;
    if (f.scale_inv == nullptr || f.block_rows != a.fp8.block_rows || f.block_cols != a.fp8.block_cols ||
        f.cols != a.fp8.cols || f.col_off != a.fp8.col_off || f.row_off != 0)
      return false;
    if (i + 1 < parts.size() && m.rows % f.block_rows != 0) return false;
  }
  return true;
}

}  // namespace

bool CudaBackend::make_adjacent(std::span<Matrix* const> parts) {
  if (parts.size() < 2) return false;
  for (Matrix* m : parts) SHARDLM_CHECK(m != nullptr, "cuda backend: make_adjacent of a null matrix");
  if (!stackable(parts)) return false;
  const bool fp8 = parts[0]->dtype == DType::F8_E4M3;
  auto scale_bytes = [](const Matrix& m) { return static_cast<size_t>(scale_rows(m) * m.fp8.cols) * sizeof(float); };
  auto owned = [&](const void* p) { return std::find(owned_.begin(), owned_.end(), p) != owned_.end(); };
  size_t want[2] = {0, 0};
  for (Matrix* m : parts) {
    SHARDLM_CHECK(owned(m->data) && (!fp8 || owned(m->fp8.scale_inv)),
                  "cuda backend: make_adjacent of a weight this backend did not load");
    want[0] += element_bytes(*m);
    want[1] += fp8 ? scale_bytes(*m) : 0;
  }
  // The move holds a second copy of the parts for a moment; where the device has no room for
  // it the parts stay apart (and still share one cast).
  void* dev[2] = {nullptr, nullptr};
  for (int i = 0; i < (fp8 ? 2 : 1); ++i) {
    if (cudaMalloc(&dev[i], std::max<size_t>(want[i], 1)) != cudaSuccess) {
      cudaGetLastError();  // the failed allocation is not an error of a later launch
      for (void* d : dev) cudaFree(d);
      return false;
    }
  }
  int next = 0;
  // Moves each part's bytes (from `field` of the matrix) into the next allocation, in order.
  auto pack = [&](auto field, auto bytes_of) {
    const size_t total = want[next];
    void* out = dev[next++];
    owned_.push_back(out);
    weight_bytes_ += total;
    size_t off = 0;
    for (Matrix* m : parts) {
      const void*& src = field(*m);
      const size_t n = bytes_of(*m);
      // The legacy stream waits for the weights' uploads (upload()), so this copy reads them whole.
      SHARDLM_CUDA_CHECK(cudaMemcpy(static_cast<uint8_t*>(out) + off, src, n, cudaMemcpyDeviceToDevice));
      owned_.erase(std::find(owned_.begin(), owned_.end(), src));
      SHARDLM_CUDA_CHECK(cudaFree(const_cast<void*>(src)));
      weight_bytes_ -= n;
      src = static_cast<uint8_t*>(out) + off;
      off += n;
    }
  };
  pack([](Matrix& m) -> const void*& { return m.data; }, [](const Matrix& m) { return element_bytes(m); });
  if (fp8) {
    pack([](Matrix& m) -> const void*& { return reinterpret_cast<const void*&>(m.fp8.scale_inv); }, scale_bytes);
  }
  return true;
}

void CudaBackend::linear_parts(Activations x, int64_t M, std::span<const LinearPart> parts) {
  check_linear_parts(parts, "cuda backend");
  if (M == 0) return;
  if (parts.size() == 1) return linear(x, M, *parts[0].w, parts[0].bias, parts[0].y);
  const Matrix& w0 = *parts[0].w;
  const int64_t K = w0.cols;
  // Adjacent: each part's weight (and scales) begins where the previous one's ends.
  std::optional<Matrix> stacked;
  if (parts.size() <= static_cast<size_t>(cuda::kMaxSplitParts)) stacked = w0;
  for (size_t i = 1; stacked && i < parts.size(); ++i) stacked = stacked_rows(*stacked, *parts[i].w);
  const cudaStream_t s = stream_of(stream_);
  if (stacked) {
    const int64_t N = stacked->rows;
    bool biased = false, packed = M == 1;
    float* expect = parts[0].y;
    for (const LinearPart& p : parts) {
      biased = biased || (p.bias && p.bias->data);
      packed = packed && p.y == expect;
      expect = p.y + p.w->rows;
    }
    if (packed && !biased) {
      linear(x, M, *stacked, nullptr, parts[0].y);
    } else {
      float* ws = grown_workspace(parts_ws_, parts_ws_n_, static_cast<size_t>(M * N), "stacked linear");
      linear(x, M, *stacked, nullptr, ws);
      cuda::SplitColumns split;
      split.n = static_cast<int>(parts.size());
      for (size_t i = 0; i < parts.size(); ++i) {
        split.width[i] = parts[i].w->rows;
        split.out[i] = parts[i].y;
        split.bias[i] = parts[i].bias ? parts[i].bias->data : nullptr;
      }
      cuda::split_columns(ws, M, split, s);
      check_launch("split_columns");
    }
    ++stacked_linears_;
    return;
  }
  // Apart: parts that read bf16 activations (bf16 weights; fp8 ones within the direct rows) share
  // one cast of x; others run as linear() each.
  bool cast_once = true;
  for (const LinearPart& p : parts)
    cast_once = cast_once && (p.w->dtype == DType::BF16 ||
                              (p.w->dtype == DType::F8_E4M3 && M <= kFp8DirectRows && p.w->fp8.scale_inv != nullptr));
  if (!cast_once) return ComputeBackend::linear_parts(x, M, parts);
  const uint16_t* xb = cast_bf16(x, M * K);
  for (const LinearPart& p : parts) {
    if (p.w->dtype == DType::BF16) {
      gemm_bf16_cast(xb, M, static_cast<const uint16_t*>(p.w->data), p.w->rows, K, p.y);
    } else {
      fp8_matmul_cast(xb, M, *p.w, p.y);
      ++fp8_direct_calls_;
    }
    if (p.bias && p.bias->data) {
      cuda::add_bias_rows(p.y, M, p.w->rows, p.bias->data, s);
      check_launch("add_bias_rows");
    }
  }
}

}  // namespace shardlm
