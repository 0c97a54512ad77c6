// The CUDA runtime as the emulated kernels see it: this header stands in for the toolkit's
// <cuda_runtime.h> (its directory comes first on the emulated targets' include path), so the
// kernels of kernels/cuda, translated by translate_cu.py, build with g++ and run on the host.
//
// Why: the CUDA kernels' logic (indexing, barriers, warp shuffles, online softmax, the fp8 and bf16
// cache formats) is then tested against the CPU references on every machine, not only when a GPU
// is at hand. What the emulation cannot show (timing, races between blocks, the memory model,
// nvcc's own code generation) still needs the GPU run of tests/gpu/run_gpu_checks.sh.
//
// The model: a launch runs its blocks one after another; a block's threads are fibers on this host
// thread, run in turn until each reaches a barrier (__syncthreads, a warp intrinsic) or returns;
// the last thread to arrive at a barrier releases it and goes on. The turn is the threads' and
// blocks' index order unless SHARDLM_EMU_SCHEDULE (set_schedule) says otherwise: a kernel with a
// missing barrier can give the right result in one fixed order, and fail only in another.
// __shared__ variables are function statics (one block runs at a time), filled with NaN bytes at
// each block's first pass over the declaration. A barrier that can never
// complete (threads waiting at different barriers) and a warp intrinsic that names an exited lane
// are reported as kernel errors, which the next cudaGetLastError / cudaDeviceSynchronize returns.
// Streams order nothing: every launch and copy completes before it returns, except on a stream
// being captured, where they are recorded into the graph that cudaGraphLaunch replays, and except
// work in flight (Pending, below: emulated NCCL operations), which their stream waits for.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <cstring>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#ifndef SHARDLM_CUDA_EMULATION
#define SHARDLM_CUDA_EMULATION 1
#endif

// ---- Device-code qualifiers: plain host C++ ----
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) alignas(n)

// ---- Runtime types ----
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};
struct uint3 {
  unsigned x, y, z;
};

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDeviceFunction = 98,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorIllegalState = 401,
  cudaErrorNotReady = 600,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorLaunchFailure = 719,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureImplicit = 906,
};
using cudaError = cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};

struct CUstream_st;
using cudaStream_t = CUstream_st*;
// The legacy default stream by name: the emulation's default stream is null.
#define cudaStreamLegacy (static_cast<cudaStream_t>(nullptr))
struct CUevent_st;
using cudaEvent_t = CUevent_st*;
struct CUgraph_st;
using cudaGraph_t = CUgraph_st*;
struct CUgraphExec_st;
using cudaGraphExec_t = CUgraphExec_st*;

constexpr unsigned cudaStreamDefault = 0, cudaStreamNonBlocking = 1;
constexpr unsigned cudaEventDefault = 0, cudaEventDisableTiming = 2;
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
enum cudaDeviceAttr {
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
};
enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3,
};
struct cudaPointerAttributes {
  cudaMemoryType type;
  int device;
  void* devicePointer;
  void* hostPointer;
};

// The fields the project reads, with an H200's values.
struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;
  size_t sharedMemPerBlockOptin;
  int warpSize;
  int maxThreadsPerBlock;
  int multiProcessorCount;
  int major, minor;
};

namespace shardlm_emu {

// ---- Fibers, barriers and launches (emu_scheduler.cpp) ----
const uint3& thread_idx();
const uint3& block_idx();
const dim3& block_dim();
const dim3& grid_dim();
void* dynamic_shared();
// After each static __shared__ declaration (translate_cu.py adds the call in kernels/cuda's .cu
// and .cuh files): the first thread of a block to pass it fills the variable with NaN bytes, as dynamic
// shared memory is filled before every block, so a block reads nothing an earlier block left.
void fresh_shared(void* p, size_t bytes);
// Whether [p, p + bytes) lies in the running block's shared memory: its dynamic shared memory or a
// static __shared__ variable it has passed.
bool in_shared(const void* p, size_t bytes);

// The order threads take turns in and blocks run in. Forward: by index. Reverse: downwards, so
// that a thread reading what a lower thread wrote without a barrier between (or a block, what an
// earlier block wrote) reads it before it is written. Shuffle: a new random turn per block and
// after every __syncthreads, blocks in a random order, from a seed (the same launches after the same
// set_schedule take the same turns). SHARDLM_EMU_SCHEDULE=forward, reverse, shuffle or
// shuffle:SEED sets it at start.
enum class Schedule { Forward, Reverse, Shuffle };
void set_schedule(Schedule s, uint64_t seed = 1);
Schedule schedule();

void syncthreads();
// The warp intrinsics: every lane of `mask` meets here, posting `value`. A shuffle returns the
// value lane `src` posted (src: the lane in the warp); a match returns the mask of the lanes that
// posted this lane's value; a sync returns 0.
enum class WarpOp { Sync, Shuffle, MatchAny, Collective };
uint64_t warp_meet(WarpOp op, unsigned mask, uint64_t value, unsigned src, const char* what);
// A warp-wide operation that no exchange of one value per lane expresses (a tensor core mma, whose
// operands are spread over the lanes' registers): every lane of mask meets here with a pointer to
// its own operands, and when the last arrives fn runs once with every member's pointer (lanes[l];
// null outside mask) while they all wait, so it reads and writes each lane's operands in place.
void warp_collective(void (*fn)(void* const* lanes), void* mine, unsigned mask, const char* what);
// A tensor core tile's products as the emulated mma instructions compute them: sum[r][c] = the
// sum over k of A[r][k] B[k][c] in fp32, from zero in k order. A row's eight columns are two
// vectors of the compiler's (each lane its own product and sum, so the same bits): computed a
// column at a time, these products took a seventh of the emulated attention kernels' time.
template <int M, int K>
inline void mma_tile_sums(const float (&A)[M][K], const float (&B)[K][8], float (&sum)[M][8]) {
  typedef float Four __attribute__((vector_size(4 * sizeof(float))));  // one SSE register
  for (int r = 0; r < M; ++r) {
    Four lo = {}, hi = {};
    for (int k = 0; k < K; ++k) {
      Four b0, b1;
      std::memcpy(&b0, &B[k][0], sizeof(b0));
      std::memcpy(&b1, &B[k][4], sizeof(b1));
      lo += A[r][k] * b0;
      hi += A[r][k] * b1;
    }
    std::memcpy(&sum[r][0], &lo, sizeof(lo));
    std::memcpy(&sum[r][4], &hi, sizeof(hi));
  }
}
unsigned lane_id();
// cp.async: a copy of `bytes` from src (null: zeros) to dst is queued for this thread and lands
// only when a wait lets it (the latest moment the device allows; a barrier does not), so a
// kernel that reads a stage before waiting for its copies reads what was there before. commit
// closes the group of copies queued since the last; wait_group(n) lands all but the newest n
// groups (queued copies not yet committed stay queued). A returning thread's copies land.
// dst must lie in the block's shared memory and src outside it (a kernel error otherwise).
void async_copy(void* dst, const void* src, size_t bytes);
void async_commit();
void async_wait_group(unsigned n);
// The shared-window address of p in the block's dynamic shared memory, which starts at address 0
// (so at any alignment the device could give it), and the memory at such an address (a kernel
// error past the block's dynamic shared memory).
uint32_t shared_address(const void* p);
const unsigned char* shared_at(uint32_t addr, size_t bytes);
// A warp's asynchronous tensor-core work (wgmma.mma_async), from inside a warp_collective: push
// queues `op` for the warp; commit closes the group of work queued since the last; wait(n) runs all
// but the newest n groups, oldest first. So operands are read and accumulators written at the
// latest moment the device allows: a kernel that refills a stage or reads its accumulators before
// waiting gets what the device could give it. Work never waited for never runs.
// reads: the shared-window ranges [lo, hi) op reads; a cp.async into one of them while op is queued
// is a kernel error (the device may land the copy before the product reads).
void warp_async_push(std::function<void()> op, std::vector<std::pair<uint32_t, uint32_t>> reads);
void warp_async_commit();
void warp_async_wait(unsigned n);

struct LaunchConfig {
  const void* fn;
  const char* name;
  dim3 grid, block;
  size_t shared_bytes;
  cudaStream_t stream;
};
void launch_erased(const LaunchConfig& cfg, void (*call)(void*), void* body);
// Work issued to a stream: run now, or recorded into the graph being captured on that stream.
// `what` names it in errors (work on the legacy stream while this thread captures).
class Work {
 public:
  virtual ~Work() = default;
  virtual void run() = 0;
};
void enqueue_work(cudaStream_t stream, Work* work, const char* what);  // takes ownership
template <class F>
void enqueue(cudaStream_t stream, F fn, const char* what) {
  struct Fn final : Work {
    F f;
    explicit Fn(F g) : f(std::move(g)) {}
    void run() override { f(); }
  };
  enqueue_work(stream, new Fn(std::move(fn)), what);
}
// Work that completes after the call that issued it returns: an emulated NCCL operation in flight
// (emu_nccl_ops.cpp), which its peers complete. Until it is done its stream is busy (cudaStreamQuery
// says cudaErrorNotReady), and a synchronize, or work that the stream orders after it (on that
// stream; on the legacy stream, after any blocking stream's), waits for it. During a graph replay
// each operation completes before the next node runs, as the graph's stream would run them.
class Pending {
 public:
  virtual ~Pending() = default;
  virtual bool done() = 0;    // polls; never blocks
  virtual void finish() = 0;  // blocks until done
};
// owner: what issued it, for drop_pending.
void add_pending(cudaStream_t stream, std::shared_ptr<Pending> p, const void* owner);
// Forgets owner's work without waiting (an aborted communicator's operations never complete).
void drop_pending(const void* owner);

// Runs body() once per thread of every block, as described at the top of this file.
template <class F>
void launch(const LaunchConfig& cfg, F& body) {
  void (*call)(void*) = [](void* b) { (*static_cast<F*>(b))(); };
  launch_erased(cfg, call, &body);
}

// What translate_cu.py makes of `kernel<<<grid, block, shared, stream>>>(args)`:
// (Launch(fn_key(kernel), "kernel", grid, block, shared, stream) | [=](auto&... a) { kernel(a...); })(args)
template <class Call>
struct BoundLaunch {
  LaunchConfig cfg;
  Call call;
  template <class... A>
  void operator()(A&&... args) {
    // Arguments are evaluated once, on the host, and each thread gets its own copy, as a kernel's
    // parameters are; a captured launch keeps them for every replay.
    auto saved = std::make_tuple(static_cast<std::decay_t<A>>(args)...);
    enqueue(
        cfg.stream,
        [cfg = cfg, call = call, saved]() {
          auto body = [&]() {
            auto copy = saved;
            std::apply(call, copy);
          };
          launch(cfg, body);
        },
        cfg.name);
  }
};
struct Launch {
  LaunchConfig cfg;
  Launch(const void* fn, const char* name, dim3 grid, dim3 block, size_t shared = 0, cudaStream_t stream = nullptr)
      : cfg{fn, name, grid, block, shared, stream} {}
  template <class Call>
  BoundLaunch<Call> operator|(Call call) const {
    return {cfg, std::move(call)};
  }
};

// A kernel's identity for cudaFuncSetAttribute and the launch: the function, or the function
// pointer a launcher chose at run time.
template <class F>
const void* fn_key(F* fn) {
  return reinterpret_cast<const void*>(fn);
}

template <class T>
uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "warp intrinsics move at most 8 bytes");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <class T>
T from_bits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}

}  // namespace shardlm_emu

// ---- Built-in variables ----
#define threadIdx (::shardlm_emu::thread_idx())
#define blockIdx (::shardlm_emu::block_idx())
#define blockDim (::shardlm_emu::block_dim())
#define gridDim (::shardlm_emu::grid_dim())
constexpr int warpSize = 32;

// ---- Synchronisation and warp intrinsics ----
inline void __syncthreads() { ::shardlm_emu::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::shardlm_emu::warp_meet(::shardlm_emu::WarpOp::Sync, mask, 0, 0, "__syncwarp");
}

namespace shardlm_emu {
// A shuffle from lane src_in_segment of this lane's width-lane segment, as the hardware computes it.
template <class T>
T shuffle(unsigned mask, T v, unsigned src_in_segment, int width, const char* what) {
  const unsigned base = lane_id() & ~static_cast<unsigned>(width - 1);
  const unsigned src = base + (src_in_segment & static_cast<unsigned>(width - 1));
  return from_bits<T>(warp_meet(WarpOp::Shuffle, mask, to_bits(v), src, what));
}
}  // namespace shardlm_emu

template <class T>
T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
  return ::shardlm_emu::shuffle(mask, v, static_cast<unsigned>(src_lane), width, "__shfl_sync");
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  const unsigned lane = ::shardlm_emu::lane_id() & static_cast<unsigned>(width - 1);
  const unsigned src = lane ^ static_cast<unsigned>(lane_mask);
  // A source beyond the segment reads the lane's own value.
  return ::shardlm_emu::shuffle(mask, v, src < static_cast<unsigned>(width) ? src : lane, width, "__shfl_xor_sync");
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const unsigned lane = ::shardlm_emu::lane_id() & static_cast<unsigned>(width - 1);
  const unsigned src = lane + delta;
  return ::shardlm_emu::shuffle(mask, v, src < static_cast<unsigned>(width) ? src : lane, width, "__shfl_down_sync");
}
template <class T>
unsigned __match_any_sync(unsigned mask, T v) {
  return static_cast<unsigned>(::shardlm_emu::warp_meet(::shardlm_emu::WarpOp::MatchAny, mask,
                                                        ::shardlm_emu::to_bits(v), 0, "__match_any_sync"));
}

// One block runs at a time and its threads take turns, so an atomic is a plain update.
template <class T>
T atomicAdd(T* p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}
template <class T>
T atomicMax(T* p, T v) {
  const T old = *p;
  if (v > old) *p = v;
  return old;
}
template <class T>
T atomicMin(T* p, T v) {
  const T old = *p;
  if (v < old) *p = v;
  return old;
}
template <class T>
T atomicOr(T* p, T v) {
  const T old = *p;
  *p = old | v;
  return old;
}

// ---- Bit casts and IEEE operations with explicit rounding (the build disables contraction) ----
inline unsigned __float_as_uint(float x) { return ::shardlm_emu::from_bits<unsigned>(::shardlm_emu::to_bits(x)); }
inline float __uint_as_float(unsigned x) { return ::shardlm_emu::from_bits<float>(::shardlm_emu::to_bits(x)); }
inline int __float_as_int(float x) { return ::shardlm_emu::from_bits<int>(::shardlm_emu::to_bits(x)); }
inline float __int_as_float(int x) { return ::shardlm_emu::from_bits<float>(::shardlm_emu::to_bits(x)); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
using std::isfinite;
using std::isinf;
using std::isnan;
template <class T>
T min(T a, T b) {
  return b < a ? b : a;
}
template <class T>
T max(T a, T b) {
  return a < b ? b : a;
}

// ---- Runtime API: host memory stands in for device memory ----
namespace shardlm_emu {
cudaError_t cudaMalloc(void** p, size_t bytes);
template <class T>
cudaError_t cudaMalloc(T** p, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
cudaError_t cudaFree(void* p);
cudaError_t cudaMallocHost(void** p, size_t bytes);
cudaError_t cudaFreeHost(void* p);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s = nullptr);
cudaError_t cudaMemset(void* p, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s = nullptr);
cudaError_t cudaStreamCreate(cudaStream_t* s);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetDeviceCount(int* n);
cudaError_t cudaGetDevice(int* d);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d);
cudaError_t cudaRuntimeGetVersion(int* v);
cudaError_t cudaDriverGetVersion(int* v);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
// The graph's nodes: each recorded launch, copy, memset or library call (an emulated cuBLAS call
// is one node, where cuBLAS itself may launch more than one kernel). Only the count is given:
// nodes must be null.
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, void* nodes, size_t* count);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
const char* cudaGetErrorName(cudaError_t e);
cudaError_t func_set_attribute(const void* fn, cudaFuncAttribute attr, int value);
template <class F>
cudaError_t cudaFuncSetAttribute(F* fn, cudaFuncAttribute attr, int value) {
  return func_set_attribute(reinterpret_cast<const void*>(fn), attr, value);
}
}  // namespace shardlm_emu

using shardlm_emu::cudaDeviceGetAttribute;
using shardlm_emu::cudaDeviceSynchronize;
using shardlm_emu::cudaDriverGetVersion;
using shardlm_emu::cudaEventCreate;
using shardlm_emu::cudaEventCreateWithFlags;
using shardlm_emu::cudaEventDestroy;
using shardlm_emu::cudaEventElapsedTime;
using shardlm_emu::cudaEventRecord;
using shardlm_emu::cudaEventSynchronize;
using shardlm_emu::cudaFree;
using shardlm_emu::cudaFreeHost;
using shardlm_emu::cudaFuncSetAttribute;
using shardlm_emu::cudaGetDevice;
using shardlm_emu::cudaGetDeviceCount;
using shardlm_emu::cudaGetDeviceProperties;
using shardlm_emu::cudaGetErrorName;
using shardlm_emu::cudaGetErrorString;
using shardlm_emu::cudaGetLastError;
using shardlm_emu::cudaGraphDestroy;
using shardlm_emu::cudaGraphExecDestroy;
using shardlm_emu::cudaGraphGetNodes;
using shardlm_emu::cudaGraphInstantiate;
using shardlm_emu::cudaGraphLaunch;
using shardlm_emu::cudaMalloc;
using shardlm_emu::cudaMallocHost;
using shardlm_emu::cudaMemcpy;
using shardlm_emu::cudaMemcpyAsync;
using shardlm_emu::cudaMemGetInfo;
using shardlm_emu::cudaMemset;
using shardlm_emu::cudaMemsetAsync;
using shardlm_emu::cudaPeekAtLastError;
using shardlm_emu::cudaPointerGetAttributes;
using shardlm_emu::cudaRuntimeGetVersion;
using shardlm_emu::cudaSetDevice;
using shardlm_emu::cudaStreamBeginCapture;
using shardlm_emu::cudaStreamCreate;
using shardlm_emu::cudaStreamCreateWithFlags;
using shardlm_emu::cudaStreamDestroy;
using shardlm_emu::cudaStreamEndCapture;
using shardlm_emu::cudaStreamQuery;
using shardlm_emu::cudaStreamSynchronize;
using shardlm_emu::cudaStreamWaitEvent;
