// Measured ceilings of this machine, printed by benchmarks beside their figures.
#pragma once

namespace shardlm::cpu {

// Read bandwidth of main memory with all threads (sum over a 1 GiB buffer), best of `reps`, GB/s.
double measure_memory_bandwidth_gbs(int reps);
// fp32 FMA throughput with all threads on register-resident data, best of `reps`, GFLOP/s.
double measure_fma_peak_gflops(int reps);

}  // namespace shardlm::cpu
