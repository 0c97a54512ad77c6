#include "cpu/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/reduce_util.h"
#include "cpu/threads.h"

namespace shardlm::cpu {

void kv_cache_write(const float* k, const float* v, int64_t T, const int64_t* slots, int64_t n_kv_heads,
                    int64_t head_dim, float* k_cache, float* v_cache) {
  const int64_t row = n_kv_heads * head_dim;
  for (int64_t t = 0; t < T; ++t) {
    if (slots[t] < 0) continue;  // padding token: nothing to store
    std::memcpy(k_cache + slots[t] * row, k + t * row, row * sizeof(float));
    std::memcpy(v_cache + slots[t] * row, v + t * row, row * sizeof(float));
  }
}

// Rows are prefetched this many positions ahead: consecutive positions of one head are a whole
// cache row (every KV head) apart, a stride the hardware prefetchers lose at each page boundary.
constexpr int64_t kAhead = 8;

// One (token, head) pair: scores in fixed position order, stable softmax in fp32, probabilities
// normalised, then out = sum_j p_j v_j accumulated in increasing position order.
void paged_attention(const float* q, int64_t T, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                     const float* k_cache, const float* v_cache, int64_t block_size, const int32_t* const* block_table,
                     const int32_t* pos, int64_t window, float scale, float* out) {
  const int64_t group = n_heads / n_kv_heads;
  const int64_t row = n_kv_heads * head_dim;
  const int64_t pairs = T * n_heads;
#pragma omp parallel num_threads(num_threads()) if (pairs > 1)
  {
    std::vector<float> sc;
    std::vector<const float*> vrow;
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < pairs; ++i) {
      const int64_t t = i / n_heads, h = i % n_heads;
      const int64_t kvh = h / group;
      const float* qv = q + (t * n_heads + h) * head_dim;
      float* o = out + (t * n_heads + h) * head_dim;
      const int64_t p1 = pos[t];
      const int64_t p0 = window > 0 ? std::max<int64_t>(0, p1 - window + 1) : 0;
      const int64_t n = p1 - p0 + 1;
      const int32_t* bt = block_table[t];
      sc.resize(n);
      vrow.resize(n);
      float mx = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        const int64_t p = p0 + j;
        const int64_t slot = static_cast<int64_t>(bt[p / block_size]) * block_size + p % block_size;
        const float* kv = k_cache + slot * row + kvh * head_dim;
        vrow[j] = v_cache + slot * row + kvh * head_dim;
        if (j + kAhead < n) {
          const int64_t pa = p + kAhead;
          const int64_t sa = static_cast<int64_t>(bt[pa / block_size]) * block_size + pa % block_size;
          const float* ka = k_cache + sa * row + kvh * head_dim;
          for (int64_t d = 0; d < head_dim; d += 16) __builtin_prefetch(ka + d);
        }
        const float s = detail::dot16(qv, kv, head_dim) * scale;
        sc[j] = s;
        mx = std::max(mx, s);
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        sc[j] = std::exp(sc[j] - mx);
        sum += sc[j];
      }
      const float inv = 1.0f / sum;
      for (int64_t d = 0; d < head_dim; ++d) o[d] = 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        if (j + kAhead < n) {
          for (int64_t d = 0; d < head_dim; d += 16) __builtin_prefetch(vrow[j + kAhead] + d);
        }
        const float p = sc[j] * inv;
        const float* vv = vrow[j];
        for (int64_t d = 0; d < head_dim; ++d) o[d] += p * vv[d];
      }
    }
  }
}

}  // namespace shardlm::cpu
