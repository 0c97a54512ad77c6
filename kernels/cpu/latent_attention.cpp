// Work is split over (tile of tokens of one sequence, block of up to kHeadBlock heads): every
// (token, head) of an item shares each cache row read (attention_tile.h). Grouping changes only
// which loop runs outermost, never the order in which any one (token, head) pair is reduced, so
// results do not depend on the tiles, the block size, the thread count or the other tokens of the
// step.
#include "cpu/latent_attention.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "cpu/attention_tile.h"
#include "cpu/threads.h"

namespace shardlm::cpu {

namespace {
constexpr int64_t kHeadBlock = 16;
constexpr int64_t kTileTokens = 8;  // tokens of one sequence (a prefill chunk) sharing each row read
}  // namespace

void latent_cache_write(const float* latent, const float* k_rope, int64_t T, const int64_t* slots, int64_t kv_lora,
                        int64_t rope_dim, void* cache, KvFormat fmt) {
  const int64_t row = kv_lora + rope_dim;
  for (int64_t t = 0; t < T; ++t) {
    if (slots[t] < 0) continue;  // padding token: nothing to store
    detail::store_row(latent + t * kv_lora, kv_lora, fmt.elem, fmt.k_scale, cache, slots[t] * row);
    detail::store_row(k_rope + t * rope_dim, rope_dim, fmt.elem, fmt.k_scale, cache, slots[t] * row + kv_lora);
  }
}

namespace {

template <class E>
void attend(const float* q_latent, const float* q_rope, int64_t T, int64_t n_heads, int64_t kv_lora, int64_t rope_dim,
            const E* cache, float cache_scale, int64_t block_size, const int32_t* const* block_table,
            const int32_t* pos, float scale, float* out) {
  const int64_t row = kv_lora + rope_dim;
  const detail::BlockOf bo(block_size);
  const std::vector<int64_t> tile = detail::token_tiles(block_table, T, kTileTokens);
  const int64_t tiles = static_cast<int64_t>(tile.size()) - 1;
  // Smaller head blocks only when there are fewer tiles than threads (a lone decode token).
  const int64_t ways = (num_threads() + tiles - 1) / tiles;
  const int64_t head_block = std::clamp<int64_t>((n_heads + ways - 1) / ways, 1, kHeadBlock);
  const int64_t hblocks = (n_heads + head_block - 1) / head_block;
  const int64_t items = tiles * hblocks;
#pragma omp parallel num_threads(num_threads()) if (items > 1)
  {
    detail::TileScratch scratch;
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t ti = it / hblocks;
      const int64_t h0 = (it % hblocks) * head_block;
      const int32_t* bt = block_table[tile[ti]];
      auto cache_row = [&](int64_t p) { return cache + detail::slot_of(bt, p, bo) * row; };
      detail::attend_tile(
          tile[ti], tile[ti + 1], std::min(head_block, n_heads - h0), pos, [](int64_t) { return int64_t{0}; },
          cache_row, row, cache_row, kv_lora,
          [&](const detail::TileQuery* qs, int nq, auto rows, detail::v16f* x) {  // rows: const R* const*
            std::remove_const_t<std::remove_pointer_t<decltype(rows)>> rope_rows[detail::kRound];
            for (int64_t i = 0; i < detail::kRound; ++i) rope_rows[i] = rows[i] + kv_lora;
            const float *ql[2], *qr[2];
            for (int j = 0; j < nq; ++j) {
              const int64_t h = qs[j].t * n_heads + h0 + qs[j].g;
              ql[j] = q_latent + h * kv_lora;
              qr[j] = q_rope + h * rope_dim;
            }
            detail::v16f lat[2], rope[2];
            if (nq == 2) {
              detail::dot16_x16_n<2>(ql, rows, kv_lora, lat);
              detail::dot16_x16_n<2>(qr, rope_rows, rope_dim, rope);
            } else {
              detail::dot16_x16_n<1>(ql, rows, kv_lora, lat);
              detail::dot16_x16_n<1>(qr, rope_rows, rope_dim, rope);
            }
            for (int j = 0; j < nq; ++j) x[j] = (lat[j] + rope[j]) * scale;
          },
          [&](int64_t t, int64_t g) { return out + (t * n_heads + h0 + g) * kv_lora; },
          detail::RowScales{cache_scale, cache_scale}, scratch);
    }
  }
}

}  // namespace

void latent_attention(const float* q_latent, const float* q_rope, int64_t T, int64_t n_heads, int64_t kv_lora,
                      int64_t rope_dim, const void* cache, KvFormat fmt, int64_t block_size,
                      const int32_t* const* block_table, const int32_t* pos, float scale, float* out) {
  if (fmt.elem == CacheElem::BF16) {
    attend(q_latent, q_rope, T, n_heads, kv_lora, rope_dim, static_cast<const uint16_t*>(cache), 1.0f, block_size,
           block_table, pos, scale, out);
  } else if (fmt.elem == CacheElem::FP8) {
    attend(q_latent, q_rope, T, n_heads, kv_lora, rope_dim, static_cast<const uint8_t*>(cache), fmt.k_scale, block_size,
           block_table, pos, scale, out);
  } else {
    attend(q_latent, q_rope, T, n_heads, kv_lora, rope_dim, static_cast<const float*>(cache), 1.0f, block_size,
           block_table, pos, scale, out);
  }
}

}  // namespace shardlm::cpu
