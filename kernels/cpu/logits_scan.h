// Whole-row scans of a logits row for the host sampler: the greedy choice and one token's
// log-probability. Each reads the row a few times at vector width (about 32000 logits in
// microseconds), where a call of libm's exp per logit took about 100 us a row.
#pragma once

#include <cstdint>

namespace shardlm::cpu {

// The index of the largest logit, ties to the lowest index. NaN logits are never chosen; a row of
// NaN only gives 0. With row_max, also the largest logit itself (-inf for a row of NaN), exactly
// what log_softmax_at takes as the row's maximum.
int64_t argmax_logit(const float* x, int64_t n, float* row_max = nullptr);

// log_softmax(x)[i] = x[i] - max - log(sum_j exp(x[j] - max)): an fp32 max, each exponential in
// fp32 (exp16, within 1 ulp) and their sum in fp64, so the result is within a few 1e-8 of the
// exact value whatever the row's length.
float log_softmax_at(const float* x, int64_t n, int64_t i);
// The same with the row's maximum already known (argmax_logit's row_max): one read of the row
// fewer, the same bits.
float log_softmax_at(const float* x, int64_t n, int64_t i, float row_max);

// The k (<= kMaxTop) most likely tokens of the row, in candidate order (logit descending, ties to
// the lower id, NaN never; kernels/sample_rules.h), and their log_softmax_at values, bit for bit:
// ids[0..k), logprobs[0..k). Where the row has fewer than k tokens that are not NaN, the rest are
// -1 and NaN.
constexpr int kMaxTop = 64;
void top_logprobs(const float* x, int64_t n, int k, int32_t* ids, float* logprobs);

// The temperature sampler's bands: band[i] = min(kBands - 1, floor(kBandsPerNat * (top - x[i]) / T)),
// the last band for NaN. Bands never decrease along the candidate order (logit descending), so a
// band holds a run of it. inv_t = 1 / T.
constexpr int kBands = 1024, kBandsPerNat = 8;
// From this band on a token is more than 27.75 nats below the top, so its probability is below
// 2^-40 (exp(-27.75) = 0.97 * 2^-40) and its sampling weight (kernels/sample_rules.h) is 0.
constexpr int kWeightlessBand = 222;
void temperature_bands(const float* x, int64_t n, double top, double inv_t, uint16_t* band);
// The ids i with lo <= band[i] <= hi, ascending, into ids (room for n); returns their count. Groups
// of 32 with none are skipped at one comparison each, so a narrow band costs a fraction of a pass.
int64_t band_members(const uint16_t* band, int64_t n, int lo, int hi, int32_t* ids);

// The temperature sampler's probabilities float(exp((x - top) / T)), the exponent in double
// (exp8d) as the CUDA sampler computes it, 0 for a NaN logit: probs[i] for every i in index order,
// or, in tempered_probs_at, probs[j] for x[ids[j]].
void tempered_probs(const float* x, int64_t n, double top, double inv_t, float* probs);
void tempered_probs_at(const float* x, const int32_t* ids, int64_t m, double top, double inv_t, float* probs);

}  // namespace shardlm::cpu
