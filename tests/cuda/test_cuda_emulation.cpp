// The host emulation of CUDA (kernels/cuda_emu) that the Emulated.* kernel tests run on: its
// barriers, warp intrinsics and launch checks must behave as the device's do, and what the device
// would leave undefined must be reported, not run through. Kernels here are launched the way
// translate_cu.py writes a launch.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "cuda/cp_async.cuh"
#include "cuda/ldmatrix.cuh"
#include "cuda/wgmma.cuh"
#include "bf16_bits.h"

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

// The turn each thread of each block took: the order of their atomicAdds on one counter.
__global__ void turn_kernel(int* counter, int* turn) {
  turn[blockIdx.x * blockDim.x + threadIdx.x] = atomicAdd(counter, 1);
}

// Each thread writes base + its index and reads the previous thread's slot with no barrier between:
// a race. Threads taking turns upwards hide it (the previous thread has always written).
__global__ void missing_barrier_kernel(int base, int* out) {
  __shared__ int s[128];
  const int t = static_cast<int>(threadIdx.x);
  s[t] = base + t;
  out[t] = t == 0 ? base - 1 : s[t - 1];
}

// Block b reads what block b - 1 wrote to global memory: blocks order nothing among themselves, and
// only blocks run upwards see it.
__global__ void chained_blocks_kernel(int* cells) {
  if (threadIdx.x == 0) cells[blockIdx.x + 1] = cells[blockIdx.x] + 1;
}

// The schedule tests start from the index order whatever SHARDLM_EMU_SCHEDULE says, and put it
// back when they end.
struct ScheduleScope {
  ScheduleScope() { ::shardlm_emu::set_schedule(::shardlm_emu::Schedule::Forward); }
  ~ScheduleScope() { ::shardlm_emu::set_schedule(::shardlm_emu::Schedule::Forward); }
};

std::vector<int> turns(int blocks, int threads) {
  std::vector<int> turn(static_cast<size_t>(blocks * threads), -1);
  int counter = 0;
  launch(turn_kernel, "turn_kernel", blocks, threads)(&counter, turn.data());
  return turn;
}

TEST(CudaEmulation, ScheduleSetsTheTurnOfThreadsAndBlocks) {
  using ::shardlm_emu::Schedule;
  using ::shardlm_emu::set_schedule;
  ScheduleScope scope;
  const int blocks = 5, threads = 96;
  std::vector<int> up(blocks * threads), down(blocks * threads);
  std::iota(up.begin(), up.end(), 0);
  std::iota(down.rbegin(), down.rend(), 0);
  EXPECT_EQ(turns(blocks, threads), up);
  set_schedule(Schedule::Reverse);
  EXPECT_EQ(turns(blocks, threads), down);
  set_schedule(Schedule::Shuffle, 7);
  const std::vector<int> a = turns(blocks, threads), a2 = turns(blocks, threads);
  set_schedule(Schedule::Shuffle, 7);
  EXPECT_EQ(turns(blocks, threads), a) << "the same seed takes the same turns";
  set_schedule(Schedule::Shuffle, 8);
  const std::vector<int> b = turns(blocks, threads);
  EXPECT_NE(a, a2);
  EXPECT_NE(a, b);
  EXPECT_NE(a, up);
  EXPECT_NE(a, down);
  // A permutation, with each block's threads taking consecutive turns (one block runs at a time),
  // the blocks in some other order than upwards.
  std::vector<int> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, up);
  std::vector<int> block_at(blocks);
  for (int blk = 0; blk < blocks; ++blk) {
    const auto first = a.begin() + blk * threads;
    const int lo = *std::min_element(first, first + threads), hi = *std::max_element(first, first + threads);
    EXPECT_EQ(lo % threads, 0) << blk;
    EXPECT_EQ(hi - lo, threads - 1) << blk;
    block_at[lo / threads] = blk;
  }
  std::vector<int> in_order(blocks);
  std::iota(in_order.begin(), in_order.end(), 0);
  EXPECT_NE(block_at, in_order);
  // Correct kernels give the device's result in every order.
  for (const Schedule s : {Schedule::Reverse, Schedule::Shuffle}) {
    set_schedule(s, 3);
    std::vector<int> out(3 * 256, -1);
    launch(rotate_kernel, "rotate_kernel", 3, 256)(out.data());
    ASSERT_EQ(last_error(), "");
    for (int blk = 0; blk < 3; ++blk)
      for (int t = 0; t < 256; ++t) EXPECT_EQ(out[blk * 256 + t], (t + 1) % 256 + blk * 1000);
  }
}

TEST(CudaEmulation, ScheduleExposesMissingBarriers) {
  using ::shardlm_emu::Schedule;
  using ::shardlm_emu::set_schedule;
  ScheduleScope scope;
  auto shared_wrong = [](int base) {  // threads that read something other than the previous one's value
    std::vector<int> out(128, 0);
    launch(missing_barrier_kernel, "missing_barrier_kernel", 1, 128)(base, out.data());
    EXPECT_EQ(last_error(), "");
    int wrong = 0;
    for (int t = 0; t < 128; ++t) wrong += out[t] != base + t - 1;
    return wrong;
  };
  auto blocks_wrong = [] {  // blocks that did not see the previous block's cell
    std::vector<int> cells(65, -100);
    cells[0] = 0;
    launch(chained_blocks_kernel, "chained_blocks_kernel", 64, 32)(cells.data());
    EXPECT_EQ(last_error(), "");
    int wrong = 0;
    for (int b = 1; b <= 64; ++b) wrong += cells[b] != b;
    return wrong;
  };
  // Upwards both races stay hidden.
  EXPECT_EQ(shared_wrong(100), 0);
  EXPECT_EQ(blocks_wrong(), 0);
  // Downwards every reader runs first.
  set_schedule(Schedule::Reverse);
  EXPECT_EQ(shared_wrong(200), 127);
  EXPECT_EQ(blocks_wrong(), 63);
  // Shuffled, a reader runs first about half the time.
  set_schedule(Schedule::Shuffle, 11);
  EXPECT_GT(shared_wrong(300), 20);
  EXPECT_GT(blocks_wrong(), 10);
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

// A static shared word in a device function, declared the way translate_cu.py writes it: the
// first call in a block finds it unwritten, the second what the first left.
__device__ float shared_word_then_set(float value) {
  __shared__ float word;
  ::shardlm_emu::fresh_shared(&word, sizeof(word));
  const float before = word;
  __syncthreads();
  if (threadIdx.x == 0) word = value;
  __syncthreads();
  return before;
}

// Every block reads its static and dynamic shared memory before writing it.
__global__ void stale_shared_kernel(float* seen) {
  float* dyn = static_cast<float*>(::shardlm_emu::dynamic_shared());
  const float dyn_before = dyn[0];
  const float first = shared_word_then_set(10.0f + blockIdx.x);
  const float second = shared_word_then_set(0);
  __syncthreads();
  if (threadIdx.x == 0) {
    dyn[0] = 1;
    seen[3 * blockIdx.x] = first;
    seen[3 * blockIdx.x + 1] = second;
    seen[3 * blockIdx.x + 2] = dyn_before;
  }
}

// cp.async (kernels/cuda/cp_async.cuh) lands a copy only when a wait lets it: not at issue, not
// at a barrier; wait_group(1) lands all but the newest group, and a copy never committed stays
// queued through wait_group(0). So a pipeline that waits for too few groups reads old contents.
// A copy into memory other than the block's shared memory is a kernel error.
__global__ void async_copy_kernel(const uint32_t* src, uint32_t* seen) {
  auto* s = static_cast<uint32_t*>(::shardlm_emu::dynamic_shared());
  for (int i = 0; i < 8; ++i) s[i] = 7;
  shardlm::cuda::detail::copy16_async(s, src, true);
  shardlm::cuda::detail::commit_async();
  shardlm::cuda::detail::copy16_async(s + 4, src, false);  // zeros
  shardlm::cuda::detail::commit_async();
  __syncthreads();
  seen[0] = s[0], seen[1] = s[4];
  shardlm::cuda::detail::wait_async<1>();
  seen[2] = s[0], seen[3] = s[4];
  shardlm::cuda::detail::copy16_async(s, src + 4, true);
  shardlm::cuda::detail::wait_async<0>();
  seen[4] = s[0], seen[5] = s[4];
  shardlm::cuda::detail::commit_async();
  shardlm::cuda::detail::wait_async<0>();
  seen[6] = s[0], seen[7] = s[3];
}

__global__ void async_copy_to_global_kernel(const uint32_t* src, uint32_t* dst) {
  shardlm::cuda::detail::copy16_async(dst, src, true);
}

TEST(CudaEmulation, AsyncCopiesLandWhenAWaitLetsThem) {
  const std::vector<uint32_t> src = {10, 11, 12, 13, 14, 15, 16, 17};
  std::vector<uint32_t> seen(8, 99);
  launch(async_copy_kernel, "async_copy_kernel", 1, 1, 32)(src.data(), seen.data());
  ASSERT_EQ(last_error(), "");
  EXPECT_EQ(seen, (std::vector<uint32_t>{7, 7, 10, 7, 10, 0, 14, 17}));
  launch(async_copy_to_global_kernel, "async_copy_to_global_kernel", 1, 1)(src.data(), seen.data());
  const std::string e = last_error();
  EXPECT_NE(e.find("cp.async to an address outside the block's shared memory"), std::string::npos) << e;
}

// ldmatrix (kernels/cuda/ldmatrix.cuh) reads rows of the block's shared memory, 16-byte aligned:
// a lane naming a global address or a misaligned row is a kernel error. `offset` moves every
// lane's row by that many bytes; global: the rows are in `g` instead.
__global__ void ldmatrix_rows_kernel(const uint8_t* g, int offset, bool global, uint32_t* out) {
  auto* s = static_cast<uint8_t*>(::shardlm_emu::dynamic_shared());
  const uint8_t* base = global ? g : s;
  uint32_t r[4];
  shardlm::cuda::detail::ldmatrix_x4(r, base + 16 * (threadIdx.x & 31) + offset);
  out[threadIdx.x] = r[0];
}

TEST(CudaEmulation, LdmatrixRowsMustBeAlignedSharedMemory) {
  std::vector<uint8_t> g(16 * 33, 0);
  std::vector<uint32_t> out(32, 0);
  launch(ldmatrix_rows_kernel, "ldmatrix_rows_kernel", 1, 32, 16 * 33)(g.data(), 0, false, out.data());
  ASSERT_EQ(last_error(), "");
  launch(ldmatrix_rows_kernel, "ldmatrix_rows_kernel", 1, 32, 16 * 33)(g.data(), 8, false, out.data());
  std::string e = last_error();
  EXPECT_NE(e.find("names a row not 16-byte aligned"), std::string::npos) << e;
  launch(ldmatrix_rows_kernel, "ldmatrix_rows_kernel", 1, 32, 16 * 33)(g.data(), 0, true, out.data());
  e = last_error();
  EXPECT_NE(e.find("names a row outside shared memory"), std::string::npos) << e;
}

// One warpgroup's m64n64k16 wgmma (kernels/cuda/wgmma.cuh) over A and B tiles staged in the
// 128-byte swizzle, from the k-slice at byte `kk` of their rows: the accumulators keep what they held
// until the wait, then hold the product in the m64nN layout. clobber: a cp.async into A's rows
// before the wait, which the emulation reports (the device may land it before the product reads).
__global__ void wgmma_tile_kernel(const uint16_t* a, const uint16_t* b, int kk, bool clobber, float* before,
                                  float* after) {
  using namespace shardlm::cuda::detail;
  auto* s = static_cast<uint8_t*>(::shardlm_emu::dynamic_shared());
  const int t = static_cast<int>(threadIdx.x);
  for (int c = t; c < 2 * 64 * 8; c += 128) {  // 16-byte chunks: A's 64 rows, then B's
    const int r = c / 8 % 64, j = c % 8;
    const uint16_t* src = (c < 512 ? a : b) + r * 64 + 8 * j;
    std::memcpy(s + (c < 512 ? 0 : 8192) + swizzled_chunk(r, j), src, 16);
  }
  __syncthreads();
  float d[32];
  for (int i = 0; i < 32; ++i) d[i] = -7.0f;
  wgmma_fence();
  wgmma_bf16_m64n64k16(d, wgmma_desc(shared_window_address(s) + kk), wgmma_desc(shared_window_address(s + 8192) + kk),
                       false);
  wgmma_commit();
  if (clobber) {
    copy16_async(s + 16 * (t % 8), a, true);
    commit_async();
  }
  for (int i = 0; i < 32; ++i) before[t * 32 + i] = d[i];
  wgmma_wait<0>();
  for (int i = 0; i < 32; ++i) after[t * 32 + i] = d[i];
}

TEST(CudaEmulation, WgmmaReadsSwizzledTilesAndLandsAtTheWait) {
  std::vector<uint16_t> a(64 * 64), b(64 * 64);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = shardlm::bf16_bits::from_f32(static_cast<float>(static_cast<int>(i * 7 % 13) - 6));
    b[i] = shardlm::bf16_bits::from_f32(static_cast<float>(static_cast<int>(i * 5 % 11) - 5) / 4.0f);
  }
  for (const int kk : {0, 96}) {  // the first and the last 32-byte k-slice of the rows
    std::vector<float> before(128 * 32, 0), after(128 * 32, 0);
    launch(wgmma_tile_kernel, "wgmma_tile_kernel", 1, 128, 16384)(a.data(), b.data(), kk, false, before.data(),
                                                                  after.data());
    ASSERT_EQ(last_error(), "");
    for (int t = 0; t < 128; ++t)
      for (int i = 0; i < 32; ++i) {
        const int row = 16 * (t / 32) + t % 32 / 4 + 8 * (i % 4 / 2), col = 8 * (i / 4) + 2 * (t % 4) + i % 2;
        float want = 0;
        for (int k = 0; k < 16; ++k)
          want += shardlm::bf16_bits::to_f32(a[row * 64 + kk / 2 + k]) *
                  shardlm::bf16_bits::to_f32(b[col * 64 + kk / 2 + k]);
        ASSERT_EQ(before[t * 32 + i], -7.0f) << "thread " << t << " register " << i << " written before the wait";
        ASSERT_EQ(after[t * 32 + i], want) << "k-slice at byte " << kk << ", D[" << row << "][" << col << "]";
      }
  }
  std::vector<float> before(128 * 32), after(128 * 32);
  launch(wgmma_tile_kernel, "wgmma_tile_kernel", 1, 128, 16384)(a.data(), b.data(), 0, true, before.data(),
                                                                after.data());
  const std::string e = last_error();
  EXPECT_NE(e.find("that a wgmma of warp 0 not yet waited for reads"), std::string::npos) << e;
}

TEST(CudaEmulation, EveryBlockStartsWithUnwrittenSharedMemory) {
  using ::shardlm_emu::Schedule;
  ScheduleScope scope;
  for (const Schedule s : {Schedule::Forward, Schedule::Reverse, Schedule::Shuffle}) {
    ::shardlm_emu::set_schedule(s, 5);
    const int blocks = 4;
    std::vector<float> seen(3 * blocks, 0);
    launch(stale_shared_kernel, "stale_shared_kernel", blocks, 64, 16)(seen.data());
    ASSERT_EQ(last_error(), "");
    for (int b = 0; b < blocks; ++b) {
      EXPECT_TRUE(std::isnan(seen[3 * b])) << "block " << b << " read " << seen[3 * b];
      EXPECT_EQ(seen[3 * b + 1], 10.0f + b) << "block " << b << ": the second call saw the first's word";
      EXPECT_TRUE(std::isnan(seen[3 * b + 2])) << "block " << b << " read " << seen[3 * b + 2];
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
