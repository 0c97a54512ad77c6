// Thread count used by the CPU kernels (OpenMP). Defaults to the number of cores.
#pragma once

namespace shardlm::cpu {

void set_num_threads(int n);
int num_threads();

}  // namespace shardlm::cpu
