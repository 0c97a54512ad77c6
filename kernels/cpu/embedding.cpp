#include "cpu/embedding.h"

#include <cstring>

namespace shardlm::cpu {

void embedding_f32(const int32_t* ids, int64_t T, const float* table, int64_t dim, float* out) {
  for (int64_t t = 0; t < T; ++t) {
    if (ids[t] < 0) {
      std::memset(out + t * dim, 0, dim * sizeof(float));
      continue;
    }
    std::memcpy(out + t * dim, table + static_cast<int64_t>(ids[t]) * dim, dim * sizeof(float));
  }
}

void embedding_bf16(const int32_t* ids, int64_t T, const uint16_t* table, int64_t dim, float* out) {
  for (int64_t t = 0; t < T; ++t) {
    if (ids[t] < 0) {
      std::memset(out + t * dim, 0, dim * sizeof(float));
      continue;
    }
    const uint16_t* src = table + static_cast<int64_t>(ids[t]) * dim;
    uint32_t* dst = reinterpret_cast<uint32_t*>(out + t * dim);
    for (int64_t i = 0; i < dim; ++i) dst[i] = static_cast<uint32_t>(src[i]) << 16;
  }
}

}  // namespace shardlm::cpu
