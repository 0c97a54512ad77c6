// Embedding row gather into fp32.
#pragma once

#include <cstdint>

namespace shardlm::cpu {

// out[t, :] = table[ids[t], :]; table [vocab, dim] fp32 or bf16 bits. ids must be below the
// table's rows; a negative id gives a zero row (the ids a vocabulary-parallel shard does not own).
void embedding_f32(const int32_t* ids, int64_t T, const float* table, int64_t dim, float* out);
void embedding_bf16(const int32_t* ids, int64_t T, const uint16_t* table, int64_t dim, float* out);

}  // namespace shardlm::cpu
