// The host emulation of CUDA (kernels/cuda_emu) that the Emulated.* kernel tests run on: its
// barriers, warp intrinsics and launch checks must behave as the device's do, and what the device
// would leave undefined must be reported, not run through. Kernels here are launched the way
// translate_cu.py writes a launch.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

template <class K>
auto launch(K* kernel, const char* name, dim3 grid, dim3 block, size_t shared = 0) {
  return ::shardlm_emu::Launch(::shardlm_emu::fn_key(kernel), name, grid, block, shared) |
         [kernel](auto&... a) { kernel(a...); };
}

std::string last_error() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : cudaGetErrorString(e);
}

// Each thread writes its index, waits, then reads its neighbour's: only a real barrier gives every
// thread the neighbour's value.
__global__ void rotate_kernel(int* out) {
  __shared__ int s[256];
  const int t = static_cast<int>(threadIdx.x);
  s[t] = t + static_cast<int>(blockIdx.x) * 1000;
  __syncthreads();
  out[blockIdx.x * blockDim.x + t] = s[(t + 1) % blockDim.x];
}

TEST(CudaEmulation, SyncthreadsOrdersSharedMemory) {
  std::vector<int> out(3 * 256, -1);
  launch(rotate_kernel, "rotate_kernel", 3, 256)(out.data());
  ASSERT_EQ(last_error(), "");
  for (int b = 0; b < 3; ++b)
    for (int t = 0; t < 256; ++t) EXPECT_EQ(out[b * 256 + t], (t + 1) % 256 + b * 1000);
}

// A butterfly sum with __shfl_xor_sync, a broadcast with __shfl_sync, a width-8 rotation with
// __shfl_down_sync and groups from __match_any_sync.
__global__ void warp_kernel(const float* in, float* sum, float* bcast, int* down, unsigned* groups) {
  const unsigned lane = threadIdx.x & 31u;
  const unsigned i = threadIdx.x;
  float v = in[i];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  sum[i] = v;
  bcast[i] = __shfl_sync(0xffffffffu, in[i], 5);
  down[i] = __shfl_down_sync(0xffffffffu, static_cast<int>(lane), 3, 8);
  groups[i] = __match_any_sync(0xffffffffu, lane % 3);
}

TEST(CudaEmulation, WarpIntrinsicsFollowTheDeviceRules) {
  const int n = 64;
  std::vector<float> in(n), sum(n), bcast(n);
  std::vector<int> down(n);
  std::vector<unsigned> groups(n);
  for (int i = 0; i < n; ++i) in[i] = static_cast<float>(i * i % 17);
  launch(warp_kernel, "warp_kernel", 1, n)(in.data(), sum.data(), bcast.data(), down.data(), groups.data());
  ASSERT_EQ(last_error(), "");
  for (int w = 0; w < 2; ++w) {
    float want = 0;
    // The butterfly's own order: every lane ends with the same bits, the pairwise tree's.
    std::vector<float> v(in.begin() + w * 32, in.begin() + w * 32 + 32);
    for (int o = 16; o > 0; o >>= 1) {
      std::vector<float> next(32);
      for (int l = 0; l < 32; ++l) next[l] = v[l] + v[l ^ o];
      v = next;
    }
    want = v[0];
    for (int l = 0; l < 32; ++l) {
      const int i = w * 32 + l;
      EXPECT_EQ(sum[i], want) << i;
      EXPECT_EQ(bcast[i], in[w * 32 + 5]) << i;
      // Within each 8-lane segment a lane reads lane + 3, or keeps its own past the segment's end.
      EXPECT_EQ(down[i], (l % 8) + 3 < 8 ? l + 3 : l) << i;
      unsigned g = 0;
      for (int m = 0; m < 32; ++m)
        if (m % 3 == l % 3) g |= 1u << m;
      EXPECT_EQ(groups[i], g) << i;
    }
  }
}

// Two warps barrier-synchronise, then sum a dynamic shared array written by the other warp.
__global__ void dynamic_kernel(float* out, int n) {
  // What translate_cu.py makes of `extern __shared__ float smem[];`.
  float* smem = static_cast<float*>(::shardlm_emu::dynamic_shared());
  for (int i = static_cast<int>(threadIdx.x); i < n; i += static_cast<int>(blockDim.x))
    smem[i] = static_cast<float>(i % 7);
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0;
    for (int i = 0; i < n; ++i) s += smem[i];
    *out = s;
  }
}

// Integers below 2^24: every order of the additions gives these bits.
float sum_mod7(int n) {
  long s = 0;
  for (int i = 0; i < n; ++i) s += i % 7;
  return static_cast<float>(s);
}

TEST(CudaEmulation, DynamicSharedMemoryNeedsTheOptInAboveTheDefault) {
  float out = -1;
  const int small = 1000, big = 20000;  // 4 KB and 80 KB
  launch(dynamic_kernel, "dynamic_kernel", 1, 64, small * sizeof(float))(&out, small);
  ASSERT_EQ(last_error(), "");
  EXPECT_EQ(out, sum_mod7(small));
  launch(dynamic_kernel, "dynamic_kernel", 1, 64, big * sizeof(float))(&out, big);
  const std::string e = last_error();
  EXPECT_NE(e.find("dynamic shared memory"), std::string::npos) << e;
  EXPECT_NE(e.find("dynamic_kernel"), std::string::npos) << e;
  ASSERT_EQ(cudaFuncSetAttribute(dynamic_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(big * sizeof(float))),
            cudaSuccess);
  launch(dynamic_kernel, "dynamic_kernel", 1, 64, big * sizeof(float))(&out, big);
  ASSERT_EQ(last_error(), "");
  EXPECT_EQ(out, sum_mod7(big));
  EXPECT_NE(cudaFuncSetAttribute(dynamic_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 300 * 1024), cudaSuccess);
}

// Half a warp at __syncthreads while the other half waits for it at __syncwarp: the device hangs;
// the emulation names the threads and the barriers they wait at.
__global__ void divergent_barrier_kernel(int* out) {
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    __syncwarp();
  }
  out[threadIdx.x] = 1;
}

TEST(CudaEmulation, BarrierDivergenceIsReported) {
  std::vector<int> out(64, 0);
  launch(divergent_barrier_kernel, "divergent_barrier_kernel", 1, 32)(out.data());
  const std::string e = last_error();
  EXPECT_NE(e.find("divergent_barrier_kernel"), std::string::npos) << e;
  EXPECT_NE(e.find("deadlock"), std::string::npos) << e;
  EXPECT_NE(e.find("16 threads wait at __syncthreads"), std::string::npos) << e;
  EXPECT_NE(e.find("16 threads wait at __syncwarp"), std::string::npos) << e;
}

// A full-mask shuffle after half the warp has returned reads lanes that no longer exist.
__global__ void exited_lane_kernel(float* out) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

TEST(CudaEmulation, ShuffleNamingAnExitedLaneIsReported) {
  std::vector<float> out(32, 0);
  launch(exited_lane_kernel, "exited_lane_kernel", 1, 32)(out.data());
  const std::string e = last_error();
  EXPECT_NE(e.find("has exited"), std::string::npos) << e;
  EXPECT_NE(e.find("__shfl_xor_sync"), std::string::npos) << e;
}

// Lanes of one warp at different intrinsics (a divergent __shfl_sync and __syncwarp).
__global__ void mismatched_warp_kernel(float* out) {
  if (threadIdx.x % 2 == 0) {
    out[threadIdx.x] = __shfl_sync(0xffffffffu, 1.0f, 0);
  } else {
    __syncwarp();
  }
}

TEST(CudaEmulation, LanesAtDifferentWarpIntrinsicsAreReported) {
  std::vector<float> out(32, 0);
  launch(mismatched_warp_kernel, "mismatched_warp_kernel", 1, 32)(out.data());
  const std::string e = last_error();
  EXPECT_NE(e.find("different warp intrinsics"), std::string::npos) << e;
}

__global__ void nothing_kernel() {}

TEST(CudaEmulation, BadLaunchConfigurationsFailLikeTheDevice) {
  launch(nothing_kernel, "nothing_kernel", 1, 1025)();
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  launch(nothing_kernel, "nothing_kernel", 0, 32)();
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  launch(nothing_kernel, "nothing_kernel", dim3(1, 70000), 32)();
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  launch(nothing_kernel, "nothing_kernel", 2, dim3(8, 4, 2))();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// A kernel's parameters are copies: a thread changing one does not change another thread's.
__global__ void param_copy_kernel(int n, int* out) {
  n += static_cast<int>(threadIdx.x);
  out[threadIdx.x] = n;
}

TEST(CudaEmulation, EachThreadGetsItsOwnParameters) {
  std::vector<int> out(8, 0);
  launch(param_copy_kernel, "param_copy_kernel", 1, 8)(100, out.data());
  ASSERT_EQ(last_error(), "");
  for (int t = 0; t < 8; ++t) EXPECT_EQ(out[t], 100 + t);
}

TEST(CudaEmulation, DeviceMemoryStartsAsNanBytes) {
  float* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 16 * sizeof(float)), cudaSuccess);
  std::vector<float> host(16, 0);
  ASSERT_EQ(cudaMemcpy(host.data(), p, 16 * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  for (float v : host) EXPECT_TRUE(std::isnan(v));
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaErrorInvalidValue);  // a second free is refused, not a crash
}

}  // namespace

namespace {

__global__ void scale_kernel(const float* x, float s, float* y, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) y[i] = x[i] * s;
}

// Work on a captured stream is recorded, not run; each replay runs it with the memory as it is
// then (the kernel's arguments as they were at capture). Synchronous work, or work on the legacy
// stream, during the capture invalidates it, as on the device.
TEST(CudaEmulation, CapturedWorkReplaysFromTheGraph) {
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  const int n = 100;
  float *x = nullptr, *y = nullptr, *z = nullptr;
  ASSERT_EQ(cudaMalloc(&x, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&y, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&z, n * sizeof(float)), cudaSuccess);
  std::vector<float> host(n, 1.0f), out(n, 0.0f);
  ASSERT_EQ(cudaMemcpy(x, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);

  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  float scale = 3.0f;
  (::shardlm_emu::Launch(::shardlm_emu::fn_key(scale_kernel), "scale_kernel", 1, 128, 0, s) |
   [](auto&... a) { scale_kernel(a...); })(x, scale, y, n);
  scale = 100.0f;  // the launch keeps 3
  ASSERT_EQ(cudaMemcpyAsync(z, y, n * sizeof(float), cudaMemcpyDeviceToDevice, s), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(out.data(), z, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  for (float v : out) ASSERT_TRUE(std::isnan(v)) << "captured work ran at capture";
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  for (float in : {1.0f, -2.0f}) {
    host.assign(n, in);
    ASSERT_EQ(cudaMemcpy(x, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(out.data(), z, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    for (float v : out) ASSERT_EQ(v, 3.0f * in);
  }
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);

  // A synchronous copy (legacy stream) during the capture fails and invalidates it.
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(out.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost), cudaErrorStreamCaptureImplicit);
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(graph, nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaErrorStreamCaptureImplicit);

  // A launch on the legacy stream while another stream captures is refused.
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  (::shardlm_emu::Launch(::shardlm_emu::fn_key(scale_kernel), "scale_kernel", 1, 128) |
   [](auto&... a) { scale_kernel(a...); })(x, 3.0f, y, n);
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  const std::string e = last_error();
  EXPECT_NE(e.find("scale_kernel while a stream is being captured"), std::string::npos) << e;
  cudaFree(x);
  cudaFree(y);
  cudaFree(z);
  cudaStreamDestroy(s);
}

}  // namespace

namespace {

// Work in flight (what an emulated NCCL operation is) that completes when the test says so; it
// counts the times it was waited for.
class Flag final : public ::shardlm_emu::Pending {
 public:
  bool ready = false;
  int finished = 0;
  bool done() override { return ready; }
  void finish() override {
    ready = true;
    ++finished;
  }
};

// A stream is busy while its work in flight is not done; a synchronize, or work the stream orders
// after it, waits for it: on the same stream, and on the legacy stream after a blocking stream's
// (both ways), never across a non-blocking stream. A replayed graph completes each piece before
// the next node; an owner's work can be dropped without waiting (an aborted communicator's).
TEST(CudaEmulation, WorkInFlightOrdersItsStream) {
  cudaStream_t blocking = nullptr, other = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&blocking, cudaStreamDefault), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  const int owner = 0;
  float* y = nullptr;
  ASSERT_EQ(cudaMalloc(&y, 4 * sizeof(float)), cudaSuccess);

  auto a = std::make_shared<Flag>();
  ::shardlm_emu::add_pending(blocking, a, &owner);
  EXPECT_EQ(cudaStreamQuery(blocking), cudaErrorNotReady);
  EXPECT_EQ(cudaStreamQuery(other), cudaSuccess);  // not ordered after it
  EXPECT_EQ(cudaMemsetAsync(y, 0, 4 * sizeof(float), other), cudaSuccess);
  EXPECT_EQ(a->finished, 0);
  a->ready = true;  // the peer completed it
  EXPECT_EQ(cudaStreamQuery(blocking), cudaSuccess);
  EXPECT_EQ(a->finished, 0);

  auto b = std::make_shared<Flag>();
  ::shardlm_emu::add_pending(blocking, b, &owner);
  EXPECT_EQ(cudaMemset(y, 0, 4 * sizeof(float)), cudaSuccess);  // legacy stream: after the blocking one
  EXPECT_EQ(b->finished, 1);

  auto c = std::make_shared<Flag>();
  ::shardlm_emu::add_pending(nullptr, c, &owner);
  EXPECT_EQ(cudaMemsetAsync(y, 0, 4 * sizeof(float), other), cudaSuccess);
  EXPECT_EQ(c->finished, 0);
  EXPECT_EQ(cudaMemsetAsync(y, 0, 4 * sizeof(float), blocking), cudaSuccess);  // blocking: after the legacy one
  EXPECT_EQ(c->finished, 1);

  auto d = std::make_shared<Flag>();
  ::shardlm_emu::add_pending(other, d, &owner);
  EXPECT_EQ(cudaStreamSynchronize(other), cudaSuccess);
  EXPECT_EQ(d->finished, 1);

  auto e = std::make_shared<Flag>();
  ::shardlm_emu::add_pending(other, e, &owner);
  ::shardlm_emu::drop_pending(&owner);
  EXPECT_EQ(cudaStreamQuery(other), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(e->finished, 0);

  // Captured: the piece is issued at each replay and completed before the replay goes on.
  std::vector<std::shared_ptr<Flag>> issued;
  ASSERT_EQ(cudaStreamBeginCapture(other, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ::shardlm_emu::enqueue(
      other,
      [&issued, &owner, other] {
        issued.push_back(std::make_shared<Flag>());
        ::shardlm_emu::add_pending(other, issued.back(), &owner);
      },
      "in flight");
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(other, &graph), cudaSuccess);
  EXPECT_TRUE(issued.empty());
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int r = 0; r < 2; ++r) ASSERT_EQ(cudaGraphLaunch(exec, other), cudaSuccess);
  ASSERT_EQ(issued.size(), 2u);
  for (const auto& f : issued) EXPECT_EQ(f->finished, 1);
  EXPECT_EQ(cudaStreamQuery(other), cudaSuccess);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(y);
  cudaStreamDestroy(blocking);
  cudaStreamDestroy(other);
}

// Events time the host between their records: work runs when it is issued, so the span is the
// time of the work issued between them (what the benchmarks' ceilings read). Timing an event
// never recorded, or one made without timing, fails as on the device.
TEST(CudaEmulation, EventsTimeTheWorkBetweenTheirRecords) {
  cudaEvent_t start = nullptr, stop = nullptr, untimed = nullptr;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&stop), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming), cudaSuccess);
  float ms = -1;
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, stop), cudaErrorInvalidResourceHandle);
  ASSERT_EQ(cudaEventRecord(start), cudaSuccess);
  ::shardlm_emu::enqueue(
      nullptr, [] { std::this_thread::sleep_for(std::chrono::milliseconds(30)); }, "30 ms of work");
  ASSERT_EQ(cudaEventRecord(stop), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(stop), cudaSuccess);
  ASSERT_EQ(cudaEventElapsedTime(&ms, start, stop), cudaSuccess);
  EXPECT_GE(ms, 29.0f);
  EXPECT_LT(ms, 10000.0f);
  ASSERT_EQ(cudaEventRecord(untimed), cudaSuccess);
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, untimed), cudaErrorInvalidValue);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaEventDestroy(untimed);
}

}  // namespace
