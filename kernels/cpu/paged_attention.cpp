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

// Slot of logical position p of a sequence whose blocks are bt.
inline int64_t slot_of(const int32_t* bt, int64_t p, int64_t block_size) {
  return static_cast<int64_t>(bt[p / block_size]) * block_size + p % block_size;
}

// One work item is a token and a run of query heads [h0, h1) of one KV head, which read the same
// K and V rows: each row is read once for all of them. For each head, in fixed position order:
// scores, a stable softmax in fp32, probabilities normalised, then out = sum_j p_j v_j accumulated
// in increasing position order, the same operations whatever the run, so the result does not
// depend on how heads are grouped into items (nor on the thread count).
void paged_attention(const float* q, int64_t T, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                     const float* k_cache, const float* v_cache, int64_t block_size, const int32_t* const* block_table,
                     const int32_t* pos, int64_t window, float scale, float* out) {
  const int64_t group = n_heads / n_kv_heads;
  const int64_t row = n_kv_heads * head_dim;
  // Split a KV head's query heads over items only when there are fewer (token, KV head) pairs than
  // threads, so the walk over the rows is shared as widely as the threads allow.
  const int64_t pairs = T * n_kv_heads;
  const int64_t threads = num_threads();
  const int64_t splits = std::min<int64_t>(group, std::max<int64_t>(1, (threads + pairs - 1) / pairs));
  const int64_t run = (group + splits - 1) / splits;
  const int64_t items = pairs * splits;
#pragma omp parallel num_threads(num_threads()) if (items > 1)
  {
    std::vector<float> sc;  // [heads of the run][positions]
    std::vector<const float*> vrow;
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < items; ++i) {
      const int64_t t = i / (n_kv_heads * splits), kvh = i / splits % n_kv_heads;
      const int64_t h0 = kvh * group + i % splits * run, h1 = std::min(h0 + run, (kvh + 1) * group);
      const int64_t G = h1 - h0;
      if (G <= 0) continue;
      const int64_t p1 = pos[t];
      const int64_t p0 = window > 0 ? std::max<int64_t>(0, p1 - window + 1) : 0;
      const int64_t n = p1 - p0 + 1;
      const int32_t* bt = block_table[t];
      sc.resize(static_cast<size_t>(G * n));
      vrow.resize(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) {
        const int64_t p = p0 + j;
        const int64_t slot = slot_of(bt, p, block_size);
        const float* kv = k_cache + slot * row + kvh * head_dim;
        vrow[j] = v_cache + slot * row + kvh * head_dim;
        if (j + kAhead < n) {
          const float* ka = k_cache + slot_of(bt, p + kAhead, block_size) * row + kvh * head_dim;
          for (int64_t d = 0; d < head_dim; d += 16) __builtin_prefetch(ka + d);
        }
        for (int64_t g = 0; g < G; ++g)
          sc[g * n + j] = detail::dot16(q + (t * n_heads + h0 + g) * head_dim, kv, head_dim) * scale;
      }
      for (int64_t g = 0; g < G; ++g) {
        detail::softmax_in_place(sc.data() + g * n, n);
        float* o = out + (t * n_heads + h0 + g) * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) o[d] = 0.0f;
      }
      for (int64_t j = 0; j < n; ++j) {
        if (j + kAhead < n) {
          for (int64_t d = 0; d < head_dim; d += 16) __builtin_prefetch(vrow[j + kAhead] + d);
        }
        const float* vv = vrow[j];
        for (int64_t g = 0; g < G; ++g) {
          const float p = sc[g * n + j];
          float* o = out + (t * n_heads + h0 + g) * head_dim;
          for (int64_t d = 0; d < head_dim; ++d) o[d] += p * vv[d];
        }
      }
    }
  }
}

}  // namespace shardlm::cpu
