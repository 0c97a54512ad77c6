// Stores a step's keys and values into the paged KV cache (the device form of
// cpu::kv_cache_write). Cache layout per layer: [num_blocks, block_size, n_kv_heads, head_dim]
// fp32, or bf16 (bf16_cache: each value rounded as kernels/bf16_bits.h rounds it); a slot is
// block * block_size + offset. Device pointers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm::cuda {

// k, v: [T, n_kv_heads, head_dim]; slots: [T], a negative slot (padding token) stores nothing.
void kv_cache_write(const float* k, const float* v, int64_t T, const int64_t* slots, int64_t n_kv_heads,
                    int64_t head_dim, void* k_cache, void* v_cache, bool bf16_cache, cudaStream_t stream);

}  // namespace shardlm::cuda
