// The walk over cache rows shared by the CPU attention kernels (internal to them).
//
// A tile is some tokens of one sequence (a prefill chunk, or a lone decode token) and some query
// heads that read the same cache rows (the heads of one KV head; MLA: any heads). Each cache row
// is read once for the whole tile: first its key part is scored against every (token, head) that
// attends to it, kRound positions at a time; then, after each row of scores has become softmax
// probabilities, its value part is weighed into every output that attends to it. Each (token,
// head) is computed exactly as alone, in fixed position order (attention_rows.h), so the result
// does not depend on the tile.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "cpu/attention_rows.h"
#include "cpu/cache_rows.h"
#include "cpu/reduce_util.h"

namespace shardlm::cpu::detail {

constexpr int64_t kRound = 16;                      // positions scored per round (one dot16_x16_n)
constexpr int64_t kValueBytes = int64_t{32} << 10;  // value rows weighed per pass: about an L1

// A position's logical block and offset in it, by a shift and a mask when the block size is a
// power of two (the usual 16): the kernels locate every row they read, and two integer divisions
// per row cost about as much as a decode token's arithmetic on it.
struct BlockOf {
  int64_t size;
  int shift;  // log2(size), or -1 when size is not a power of two
  explicit BlockOf(int64_t block_size) : size(block_size), shift(-1) {
    if (block_size > 0 && (block_size & (block_size - 1)) == 0)
      shift = __builtin_ctzll(static_cast<uint64_t>(block_size));
  }
  int64_t block(int64_t p) const { return shift >= 0 ? p >> shift : p / size; }
  int64_t offset(int64_t p) const { return shift >= 0 ? p & (size - 1) : p % size; }
};

// Slot of logical position p of a sequence whose blocks are bt.
inline int64_t slot_of(const int32_t* bt, int64_t p, const BlockOf& b) {
  return static_cast<int64_t>(bt[b.block(p)]) * b.size + b.offset(p);
}

// Into L2 (prefetcht1), not L1: a prefetch into L1 holds one of the core's few L1 miss buffers
// until its line arrives, and a round's 64 lines filled them, so long decode attention ran at the
// rate one core's L1 misses allow (9 GB/s a thread, 18 GB/s on two threads against 37 GB/s);
// into L2 it reached 33 GB/s (EPYC, 1 x 32768 positions, 8 KV heads x 64).
template <class E>
inline void prefetch_row(const E* p, int64_t n) {
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t b = 0; b < n * int64_t{sizeof(E)}; b += 64) __builtin_prefetch(c + b, 0, 2);
}

// An fp8 cache's read-back scales, key side and value side (kv_cache_format.h); 1 for the others.
struct RowScales {
  float k = 1.0f, v = 1.0f;
};

// The row handle (attention_rows.h) the kernels reduce when they read cache rows of R: R = float
// for fp32 rows (or narrow rows read back into scratch first), R = the cache's element when its
// rows are read back as they are loaded.
template <class R>
struct RowHandle {
  using type = const R*;
};
template <>
struct RowHandle<uint8_t> {
  using type = Fp8Row;
};
template <class R>
using RowOf = typename RowHandle<R>::type;

// Cache row j of a round (n elements of E) as the rows the kernels reduce (R): the row itself (an
// fp8 row with its scale), or, for R = float from a bf16 or fp8 cache, read back into slot j of
// buf (fp8: times scale).
template <class R, class E>
inline RowOf<R> round_row(const E* row, int64_t n, float scale, std::vector<float>& buf, int64_t j) {
  if constexpr (std::is_same_v<R, E>) {
    if constexpr (std::is_same_v<E, uint8_t>) {
      return Fp8Row{row, scale};
    } else {
      return row;
    }
  } else {
    static_assert(std::is_same_v<R, float>);
    float* dst = buf.data() + j * n;
    if constexpr (std::is_same_v<E, uint8_t>) {
      widen_row(row, n, scale, dst);
    } else {
      static_assert(std::is_same_v<E, uint16_t>);
      widen_row(row, n, dst);
    }
    return dst;
  }
}

// Tiles of tokens: runs of up to max_tokens consecutive tokens with the same block table (one
// sequence); tile i is tokens [r[i], r[i + 1]).
inline std::vector<int64_t> token_tiles(const int32_t* const* block_table, int64_t T, int64_t max_tokens) {
  std::vector<int64_t> r{0};
  for (int64_t t = 1; t < T; ++t) {
    if (block_table[t] != block_table[t - 1] || t - r.back() == max_tokens) r.push_back(t);
  }
  r.push_back(T);
  return r;
}

// A (token, head) of a tile.
struct TileQuery {
  int64_t t, g;
};

// A thread's scratch, reused across tiles.
struct TileScratch {
  struct Span {  // a token's attended positions [lo, hi]; its head g's scores at sc[off + g * n()]
    int64_t lo, hi, off;
    int64_t n() const { return hi >= lo ? hi - lo + 1 : 0; }
  };
  std::vector<Span> span;
  std::vector<float> sc;
  std::vector<const float*> rows;
  std::vector<const uint16_t*> rows16;  // ... of a bf16 cache
  std::vector<Fp8Row> rows8;            // ... of an fp8 cache
  std::vector<float> zero;              // the row scored past the last position of a round
  std::vector<uint16_t> zero16;         // ... of a bf16 cache (+0)
  std::vector<uint8_t> zero8;           // ... of an fp8 cache (+0)
  std::vector<float> kbuf, vbuf;        // a narrow cache's rows of a round, read back
  // The row handles and the zero row for cache rows of E.
  template <class E>
  std::vector<RowOf<E>>& rows_of() {
    if constexpr (std::is_same_v<E, float>) {
      return rows;
    } else if constexpr (std::is_same_v<E, uint16_t>) {
      return rows16;
    } else {
      return rows8;
    }
  }
  template <class E>
  std::vector<E>& zero_of() {
    if constexpr (std::is_same_v<E, float>) {
      return zero;
    } else if constexpr (std::is_same_v<E, uint16_t>) {
      return zero16;
    } else {
      return zero8;
    }
  }
};

// attend_tile's rounds over positions [P0, P1], its spans and outputs set up, reducing rows of R.
template <class R, class Key, class Value, class Score, class Out>
void attend_rounds(int64_t ta, int64_t tb, int64_t G, int64_t P0, int64_t P1, Key key, int64_t key_width, Value value,
                   int64_t width, Score score, Out out, RowScales scales, TileScratch& s) {
  std::vector<R>& zero = s.zero_of<R>();
  if (static_cast<int64_t>(zero.size()) < key_width) zero.assign(static_cast<size_t>(key_width), R{0});
  const int64_t block = std::clamp<int64_t>(kValueBytes / (width * int64_t{sizeof(R)}), kRound, 64);
  std::vector<RowOf<R>>& rows = s.rows_of<R>();
  RowOf<R> zero_row{};
  if constexpr (std::is_same_v<R, uint8_t>) {
    zero_row = Fp8Row{zero.data(), 1.0f};
  } else {
    zero_row = zero.data();
  }
  rows.resize(static_cast<size_t>(std::max(block, kRound)));
  using E = std::remove_cv_t<std::remove_pointer_t<decltype(key(int64_t{0}))>>;
  if constexpr (!std::is_same_v<R, E>) {
    s.kbuf.resize(static_cast<size_t>(kRound * key_width));
    s.vbuf.resize(static_cast<size_t>(block * width));
  }

  for (int64_t base = P0; base <= P1; base += kRound) {
    const int64_t cnt = std::min(kRound, P1 - base + 1);
    for (int64_t j = 0; j < kRound; ++j) {
      rows[j] = j < cnt ? round_row<R>(key(base + j), key_width, scales.k, s.kbuf, j) : zero_row;
      if (base + kRound + j <= P1) prefetch_row(key(base + kRound + j), key_width);
    }
    // The (token, head) pairs that attend to this round, scored two at a time.
    TileQuery qs[2];
    int nq = 0;
    auto flush = [&] {
      v16f x[2];
      score(qs, nq, rows.data(), x);
      for (int q = 0; q < nq; ++q) {
        const TileScratch::Span& sp = s.span[qs[q].t - ta];
        const int64_t a = std::max(base, sp.lo), b = std::min(base + cnt - 1, sp.hi);
        float* dst = s.sc.data() + sp.off + qs[q].g * sp.n();
        for (int64_t j = a; j <= b; ++j) dst[j - sp.lo] = x[q][j - base];
      }
      nq = 0;
    };
    for (int64_t t = ta; t < tb; ++t) {
      const TileScratch::Span& sp = s.span[t - ta];
      if (std::max(base, sp.lo) > std::min(base + cnt - 1, sp.hi)) continue;
      for (int64_t g = 0; g < G; ++g) {
        qs[nq++] = {t, g};
        if (nq == 2) flush();
      }
    }
    if (nq > 0) flush();
  }
  for (const TileScratch::Span& sp : s.span) {
    for (int64_t g = 0; g < G; ++g) softmax_in_place(s.sc.data() + sp.off + g * sp.n(), sp.n());
  }
  for (int64_t base = P0; base <= P1; base += block) {
    const int64_t cnt = std::min(block, P1 - base + 1);
    for (int64_t j = 0; j < cnt; ++j) {
      rows[j] = round_row<R>(value(base + j), width, scales.v, s.vbuf, j);
      if (base + block + j <= P1) prefetch_row(value(base + block + j), width);
    }
    AccRow acc[kAccRows];
    int nr = 0;
    for (int64_t t = ta; t < tb; ++t) {
      const TileScratch::Span& sp = s.span[t - ta];
      const int64_t a = std::max(base, sp.lo), b = std::min(base + cnt - 1, sp.hi);
      for (int64_t g = 0; g < G && a <= b; ++g) {
        acc[nr++] = {out(t, g), s.sc.data() + sp.off + g * sp.n() + (a - sp.lo), a - base, b - base + 1};
        if (nr == kAccRows) {
          accumulate_rows(acc, nr, rows.data(), cnt, width);
          nr = 0;
        }
      }
    }
    if (nr > 0) accumulate_rows(acc, nr, rows.data(), cnt, width);
  }
}

// Attention for tokens [ta, tb) (one sequence) and heads g in [0, G):
//  - token t attends to [first(t), pos[t]] (pos[t] < 0: a padding token, output zeros);
//  - key(p), value(p): the cache rows of position p the scores and the outputs read (value rows
//    are `width` elements, key rows at least key_width), as const float* or, for a bf16 cache, as
//    const uint16_t*, for an fp8 cache as const uint8_t* (read back times scales.k / scales.v);
//  - score(qs, nq, rows, x): x[j] = the 16 scaled scores of (token, head) qs[j] against key rows
//    rows[0..16) (row handles, const RowOf<R>*: fp32 rows, or a narrow cache's own, see below),
//    for nq = 1 or 2 (rows past the round's last position are a zero row); pairs let a kernel load
//    each row chunk once for two queries (dot16_x16_n<2>);
//  - out(t, g): the output row, `width` floats.
template <class First, class Key, class Value, class Score, class Out>
void attend_tile(int64_t ta, int64_t tb, int64_t G, const int32_t* pos, First first, Key key, int64_t key_width,
                 Value value, int64_t width, Score score, Out out, RowScales scales, TileScratch& s) {
  s.span.resize(static_cast<size_t>(tb - ta));
  int64_t P0 = INT64_MAX, P1 = -1, total = 0;  // [P0, P1]: every position the tile attends to
  for (int64_t t = ta; t < tb; ++t) {
    TileScratch::Span& sp = s.span[t - ta];
    sp.hi = pos[t];
    sp.lo = first(t);
    sp.off = total;
    total += sp.n() * G;
    if (sp.n() > 0) P0 = std::min(P0, sp.lo), P1 = std::max(P1, sp.hi);
    for (int64_t g = 0; g < G; ++g) std::fill(out(t, g), out(t, g) + width, 0.0f);
  }
  s.sc.resize(static_cast<size_t>(total));
  using E = std::remove_cv_t<std::remove_pointer_t<decltype(key(int64_t{0}))>>;
  static_assert(std::is_same_v<E, float> || std::is_same_v<E, uint16_t> || std::is_same_v<E, uint8_t>,
                "cache rows are fp32, bf16 or fp8");
  // A narrow tile that reads each row for one pair of queries (a decode token of a KV head with
  // two query heads) reads it back as it loads it (R = E; fp8 with the side's scale): no store and
  // reload. One that reads it for more (a prefill chunk, larger groups) reads a round of rows back
  // once into scratch (R = float), so that its many loads stay plain (measured: 28% slower prefill
  // attention loading bf16 for every pair). The same values either way, so the same bits.
  // Measured for fp8, one decode token over 4096 positions (16 / 8 heads x 64, 2 threads, the F16C
  // read-back both times): 885-1014 us reading every round into scratch, 741-803 as loaded.
  if constexpr (!std::is_same_v<E, float>) {
    if ((tb - ta) * G <= 2) {
      attend_rounds<E>(ta, tb, G, P0, P1, key, key_width, value, width, score, out, scales, s);
      return;
    }
  }
  attend_rounds<float>(ta, tb, G, P0, P1, key, key_width, value, width, score, out, scales, s);
}

}  // namespace shardlm::cpu::detail
