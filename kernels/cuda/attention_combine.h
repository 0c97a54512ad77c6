// The second pass of a split attention launch (attention_partitions.h): merges each token's
// partition states in partition order and writes the normalised output, with the same operations
// an unsplit launch merges with, so the output has the same bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm::cuda {

// states: [T, n_heads, parts, width + 2] as the attention kernel wrote them (m, l, accumulators
// per partition, counted from the token's first); out: [T, n_heads, width]. Tokens with fewer than
// two partitions (pos and window as the attention call had them) are left alone: the attention
// kernel wrote their output. width <= 512. twin: null, or out's bf16 twin, written beside it (the
// attention kernel writes the rows it writes). Device pointers.
void attention_combine(int64_t T, int64_t n_heads, int64_t width, const int32_t* pos, int64_t window, int64_t parts,
                       const float* states, float* out, uint16_t* twin, cudaStream_t stream);

}  // namespace shardlm::cuda
