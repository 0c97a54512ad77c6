// Thread count used by the CPU kernels (OpenMP). Defaults to the number of cores.
#pragma once

#include <cstdint>

namespace shardlm::cpu {

// A row-parallel kernel spreads its rows over the threads past this many values; below it one
// thread is faster than waking the others. Each output row is computed alone, in the same order,
// so the bits do not depend on the thread count.
constexpr int64_t kParallelValues = 32768;

void set_num_threads(int n);
int num_threads();

}  // namespace shardlm::cpu
