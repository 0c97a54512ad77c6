#include "cpu/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/attention_tile.h"
#include "cpu/threads.h"

namespace shardlm::cpu {

void kv_cache_write(const float* k, const float* v, int64_t T, const int64_t* slots, int64_t n_kv_heads,
                    int64_t head_dim, int64_t block_size, void* k_cache, void* v_cache, KvFormat fmt) {
  for (int64_t t = 0; t < T; ++t) {
    if (slots[t] < 0) continue;  // padding token: nothing to store
    const int64_t block = slots[t] / block_size, offset = slots[t] % block_size;
    for (int64_t h = 0; h < n_kv_heads; ++h) {
      const int64_t dst = ((block * n_kv_heads + h) * block_size + offset) * head_dim;
      const int64_t src = (t * n_kv_heads + h) * head_dim;
      detail::store_row(k + src, head_dim, fmt.elem, fmt.k_scale, k_cache, dst);
      detail::store_row(v + src, head_dim, fmt.elem, fmt.v_scale, v_cache, dst);
    }
  }
}

namespace {

// Tokens of one sequence (a prefill chunk) that share each cache row read. 16 against 8, a 512-token
// chunk on 2 threads (16 heads / 8 KV heads x 64) at 16384 positions, two runs: 11-13% faster over
// fp32 (598, 616 -> 521, 549 ms) and 11-16% over bf16 (530, 561 -> 473, 469 ms); 2% and 6% at
// 4096; neutral with 8 query heads per KV head (32 / 4 x 128 at 8192). A narrow cache's rows are
// read back once per tile, so it gains more.
constexpr int64_t kTileTokens = 16;

// One work item is a tile of tokens of one sequence and a run of query heads [h0, h1) of one KV
// head: each K and V row is read once for all of them (attention_tile.h). Each (token, head) is
// computed exactly as on its own, in fixed position order: scores dot16(q, k_j) * scale, a stable
// softmax in fp32, probabilities normalised, then out = sum_j p_j v_j accumulated in increasing
// position order. So the result does not depend on the tiles, the head runs or the thread count,
// i.e. on what else the step holds.
template <class E>
void attend(const float* q, int64_t T, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, const E* k_cache,
            const E* v_cache, detail::RowScales scales, int64_t block_size, const int32_t* const* block_table,
            const int32_t* pos, int64_t window, float scale, float* out) {
  const int64_t group = n_heads / n_kv_heads;
  const int64_t block_floats = n_kv_heads * block_size * head_dim;
  const detail::BlockOf bo(block_size);
  const std::vector<int64_t> tile = detail::token_tiles(block_table, T, kTileTokens);
  const int64_t tiles = static_cast<int64_t>(tile.size()) - 1;
  // Split a KV head's query heads over items only when there are fewer (tile, KV head) pairs than
  // threads, so the walk over the rows is shared as widely as the threads allow.
  const int64_t pairs = tiles * n_kv_heads;
  const int64_t threads = num_threads();
  const int64_t splits = std::min<int64_t>(group, std::max<int64_t>(1, (threads + pairs - 1) / pairs));
  const int64_t run = (group + splits - 1) / splits;
  const int64_t items = pairs * splits;
#pragma omp parallel num_threads(num_threads()) if (items > 1)
  {
    detail::TileScratch scratch;
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < items; ++i) {
      const int64_t ti = i / (n_kv_heads * splits), kvh = i / splits % n_kv_heads;
      const int64_t h0 = kvh * group + i % splits * run, h1 = std::min(h0 + run, (kvh + 1) * group);
      if (h1 <= h0) continue;
      const int32_t* bt = block_table[tile[ti]];
      const E* k_head = k_cache + kvh * block_size * head_dim;
      const E* v_head = v_cache + kvh * block_size * head_dim;
      auto row_of = [&](int64_t p) { return bt[bo.block(p)] * block_floats + bo.offset(p) * head_dim; };
      detail::attend_tile(
          tile[ti], tile[ti + 1], h1 - h0, pos,
          [&](int64_t t) { return window > 0 ? std::max<int64_t>(0, pos[t] - window + 1) : int64_t{0}; },
          [&](int64_t p) { return k_head + row_of(p); }, head_dim, [&](int64_t p) { return v_head + row_of(p); },
          head_dim,
          [&](const detail::TileQuery* qs, int nq, auto rows, detail::v16f* x) {  // rows: const R* const*
            const float* qp[2];
            for (int j = 0; j < nq; ++j) qp[j] = q + (qs[j].t * n_heads + h0 + qs[j].g) * head_dim;
            if (nq == 2) {
              detail::dot16_x16_n<2>(qp, rows, head_dim, x);
            } else {
              detail::dot16_x16_n<1>(qp, rows, head_dim, x);
            }
            for (int j = 0; j < nq; ++j) x[j] *= scale;
          },
          [&](int64_t t, int64_t g) { return out + (t * n_heads + h0 + g) * head_dim; }, scales, scratch);
    }
  }
}

}  // namespace

void paged_attention(const float* q, int64_t T, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                     const void* k_cache, const void* v_cache, KvFormat fmt, int64_t block_size,
                     const int32_t* const* block_table, const int32_t* pos, int64_t window, float scale, float* out) {
  if (fmt.elem == CacheElem::BF16) {
    attend(q, T, n_heads, n_kv_heads, head_dim, static_cast<const uint16_t*>(k_cache),
           static_cast<const uint16_t*>(v_cache), {}, block_size, block_table, pos, window, scale, out);
  } else if (fmt.elem == CacheElem::FP8) {
    attend(q, T, n_heads, n_kv_heads, head_dim, static_cast<const uint8_t*>(k_cache),
           static_cast<const uint8_t*>(v_cache), {fmt.k_scale, fmt.v_scale}, block_size, block_table, pos, window,
           scale, out);
  } else {
    attend(q, T, n_heads, n_kv_heads, head_dim, static_cast<const float*>(k_cache), static_cast<const float*>(v_cache),
           {}, block_size, block_table, pos, window, scale, out);
  }
}

}  // namespace shardlm::cpu
