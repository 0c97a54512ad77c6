// Stores a step's keys and values into the paged KV cache (the device form of
// cpu::kv_cache_write). Cache layout per layer: [num_blocks, block_size, n_kv_heads, head_dim]
// of cache_fmt.elem: fp32, bf16 or fp8, each value stored as kernels/kv_cache_format.h stores it
// (the CPU kernels' bits); a slot is block * block_size + offset. Device pointers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kv_cache_format.h"

namespace shardlm::cuda {

// k, v: [T, n_kv_heads, head_dim]; slots: [T], a negative slot (padding token) stores nothing.
void kv_cache_write(const float* k, const float* v, int64_t T, const int64_t* slots, int64_t n_kv_heads,
                    int64_t head_dim, void* k_cache, void* v_cache, KvFormat cache_fmt, cudaStream_t stream);

}  // namespace shardlm::cuda
