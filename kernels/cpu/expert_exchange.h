// The index plans of a fixed-capacity expert-parallel exchange (src/arch/expert_exchange.h): a
// dispatch and combine whose message sizes do not depend on the routing, so that a CUDA graph can
// hold them. The reference the CUDA kernels of kernels/cuda/expert_exchange.h are tested against
// (the same integers).
//
// Geometry: ep ranks, rank p owning the L = E / ep experts [p*L, (p+1)*L); kl = min(k, L) expert
// slots a record; every rank sends every rank (itself included) a dispatch block of R rows of H
// floats, C records' rows and then their meta (M = 1 + C*kl int32, -1 padded to whole rows), so
// that one all-to-all moves both, and returns to every rank a block of Cc result rows.
//
//   send plan   on each rank, for its share of the step's T tokens (topk ids [T, k]): the real
//               rows are [0, n), n = 1 + the last row with pos[t] >= 0 (T when pos is null; the
//               padding rows of a captured step come last), and tp rank r of tp ranks takes
//               [n*r/tp, n*(r+1)/tp) of them, as an eager step of the n rows splits them. The
//               share follows the real rows, not the padded T, so that a token is routed by the
//               same tp rank in a captured step as in an eager one (a rank's share and the others'
//               partial sums meet in the tp all-reduce in that order);
//     records   a token travels once to each rank owning one of its experts; block p holds the
//               tokens for p in ascending order, the first C of them: record i is row
//               rec_token[p*R + i] of the step (-1 past the block's records; kKeepRow for the
//               meta rows, so that gather_rows over all ep*R fills the records' rows and keeps
//               the meta); the block's meta m = block_meta(blocks, p): m[0] is the block's record
//               count and m[1 + i*kl + s] the record's local expert indices, ascending, -1 padded.
//     pairs     pair (t, j) of a kept record comes back as row pair_row[t*k + j] = p*Cc + q of the
//               returned blocks, q its index among the block's pairs in (local expert, record)
//               order, which is (expert, token) order; -1 for tokens outside the share, padding
//               tokens (pos[t] < 0, pos may be null) and pairs that did not fit.
//     overflow  a block that would hold more than C records, or more than Cc pairs in its kept
//               records, keeps the first ones and sets *overflow = 1 (never clears it): the step's
//               result is incomplete and must be redone another way.
//     counts    [E] (may be null) += the share's pairs per expert, kept or not (the routing's loads).
//   recv plan   on the owner, from the dispatch blocks received (block s from rank s):
//     rows      the owner runs the pairs grouped per local expert, each group in (source, record)
//               order: offsets [L + 1]; row_src[r] = s*R + i, the received row of record i from
//               s; back_row[s*Cc + q] = r, the owner row of the q-th pair returned to s (-1 where
//               s's block has no pair q). A source's pairs past Cc are skipped (as its send plan
//               did), so rows <= ep * Cc.
#pragma once

#include <cstdint>

#include "cpu/expert_rows.h"

namespace shardlm::cpu {

// Tp rank `rank` of `size`: whose share of a step's rows a send plan takes.
struct RowShare {
  int64_t rank = 0, size = 1;
  int64_t begin(int64_t n) const { return n * rank / size; }
  int64_t end(int64_t n) const { return n * (rank + 1) / size; }
};

struct ExchangeShape {
  int64_t ep = 1;  // ranks of the group
  int64_t L = 0;   // experts a rank owns (E = ep * L)
  int64_t k = 1;   // experts per token
  int64_t C = 0;   // records a block holds
  int64_t Cc = 0;  // result rows a returned block holds
  int64_t H = 1;   // floats a row
  int64_t kl() const { return k < L ? k : L; }
  int64_t meta() const { return 1 + C * kl(); }               // int32 of a block's meta
  int64_t meta_rows() const { return (meta() + H - 1) / H; }  // rows it takes
  int64_t block_rows() const { return C + meta_rows(); }      // R
};

static_assert(sizeof(float) == sizeof(int32_t), "the meta travels as the rows' 4-byte words");

// Block p's meta in dispatch blocks [ep*R*H] (its rows from C on, as int32).
inline int32_t* block_meta(const ExchangeShape& s, float* blocks, int64_t p) {
  return reinterpret_cast<int32_t*>(blocks + (p * s.block_rows() + s.C) * s.H);
}
inline const int32_t* block_meta(const ExchangeShape& s, const float* blocks, int64_t p) {
  return reinterpret_cast<const int32_t*>(blocks + (p * s.block_rows() + s.C) * s.H);
}

// rec_token [ep*R], pair_row [T*k] (all written); blocks [ep*R*H]: the meta rows written, the
// records' rows not touched (gather_rows by rec_token fills them).
void expert_send_plan(const ExchangeShape& s, const int32_t* topk_ids, int64_t T, RowShare share, const int32_t* pos,
                      int32_t* rec_token, float* blocks, int32_t* pair_row, int64_t* counts, int32_t* overflow);

// blocks [ep*R*H] received (their meta read); offsets [L + 1], row_src [ep*Cc] (rows < offsets[L]
// written), back_row [ep*Cc].
void expert_recv_plan(const ExchangeShape& s, const float* blocks, int32_t* offsets, int32_t* row_src,
                      int32_t* back_row);

}  // namespace shardlm::cpu
