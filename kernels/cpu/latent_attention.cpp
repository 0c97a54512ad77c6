// Work is split over (token, block of up to kHeadBlock heads): the heads of a block share each
// cache row while it is in L1. Grouping changes only which loop runs outermost, never the order in
// which any one (token, head) pair is reduced, so results do not depend on the block size, the
// thread count or the other tokens of the step.
#include "cpu/latent_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/reduce_util.h"
#include "cpu/threads.h"

namespace shardlm::cpu {

namespace {
constexpr int64_t kHeadBlock = 16;
}

void latent_cache_write(const float* latent, const float* k_rope, int64_t T, const int64_t* slots, int64_t kv_lora,
                        int64_t rope_dim, float* cache) {
  const int64_t row = kv_lora + rope_dim;
  for (int64_t t = 0; t < T; ++t) {
    if (slots[t] < 0) continue;  // padding token: nothing to store
    float* dst = cache + slots[t] * row;
    std::memcpy(dst, latent + t * kv_lora, kv_lora * sizeof(float));
    std::memcpy(dst + kv_lora, k_rope + t * rope_dim, rope_dim * sizeof(float));
  }
}

void latent_attention(const float* q_latent, const float* q_rope, int64_t T, int64_t n_heads, int64_t kv_lora,
                      int64_t rope_dim, const float* cache, int64_t block_size, const int32_t* const* block_table,
                      const int32_t* pos, float scale, float* out) {
  const int64_t row = kv_lora + rope_dim;
  const int64_t hblocks = (n_heads + kHeadBlock - 1) / kHeadBlock;
  const int64_t items = T * hblocks;
#pragma omp parallel num_threads(num_threads()) if (items > 1)
  {
    std::vector<float> sc;             // [hb][n] scores, then probabilities
    std::vector<const float*> rows;    // [n] cache rows in position order
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t t = it / hblocks;
      const int64_t h0 = (it % hblocks) * kHeadBlock;
      const int64_t hb = std::min(kHeadBlock, n_heads - h0);
      const int64_t n = static_cast<int64_t>(pos[t]) + 1;
      const int32_t* bt = block_table[t];
      sc.resize(static_cast<size_t>(hb * n));
      rows.resize(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) {
        const int64_t slot = static_cast<int64_t>(bt[j / block_size]) * block_size + j % block_size;
        rows[j] = cache + slot * row;
      }
      for (int64_t j = 0; j < n; ++j) {
        const float* c = rows[j];
        for (int64_t k = 0; k < hb; ++k) {
          const int64_t h = h0 + k;
          const float* ql = q_latent + (t * n_heads + h) * kv_lora;
          const float* qr = q_rope + (t * n_heads + h) * rope_dim;
          sc[k * n + j] = (detail::dot16(ql, c, kv_lora) + detail::dot16(qr, c + kv_lora, rope_dim)) * scale;
        }
      }
      for (int64_t k = 0; k < hb; ++k) {
        detail::softmax_in_place(sc.data() + k * n, n);
        float* o = out + (t * n_heads + h0 + k) * kv_lora;
        for (int64_t d = 0; d < kv_lora; ++d) o[d] = 0.0f;
      }
      for (int64_t j = 0; j < n; ++j) {
        const float* c = rows[j];
        for (int64_t k = 0; k < hb; ++k) {
          const float p = sc[k * n + j];
          float* o = out + (t * n_heads + h0 + k) * kv_lora;
          for (int64_t d = 0; d < kv_lora; ++d) o[d] += p * c[d];
        }
      }
    }
  }
}

}  // namespace shardlm::cpu
