// Embedding row gather into fp32 (the device form of cpu/embedding.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm::cuda {

// out[t, :] = table[ids[t], :]; table [vocab, dim] fp32 or bf16 bits; ids, table and out are device
// pointers. A negative id gives a zero row (an id a vocabulary-parallel shard does not own).
void embedding_f32(const int32_t* ids, int64_t T, const float* table, int64_t dim, float* out, cudaStream_t stream);
void embedding_bf16(const int32_t* ids, int64_t T, const uint16_t* table, int64_t dim, float* out,
                    cudaStream_t stream);

}  // namespace shardlm::cuda
