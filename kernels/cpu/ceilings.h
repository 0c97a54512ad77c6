// Measured ceilings of this machine, printed by benchmarks beside their figures. Each is the best
// of many short timed runs: on a shared machine a long run is rarely undisturbed.
#pragma once

#include <algorithm>

namespace shardlm::cpu {

struct MemoryBandwidth {
  double plain;       // GB/s, plain streaming sum
  double prefetched;  // GB/s, with software prefetch 4 KiB ahead (as the M=1 matmul streams)
  double best() const { return std::max(plain, prefetched); }
};

// Read bandwidth of main memory with all threads: a 1 GiB buffer walked in 64 MiB chunks, each
// timed on its own, best chunk over `reps` passes.
MemoryBandwidth measure_memory_bandwidth(int reps);
// fp32 FMA throughput with all threads on register-resident data, best of `reps` short runs,
// GFLOP/s.
double measure_fma_peak_gflops(int reps);

}  // namespace shardlm::cpu
