// The pure parts of `shardlm bench-comm` (sizes, bandwidth factors, the data each rank sends and
// the data it must receive), kept apart from the MPI driver so that they can be unit-tested.
//
// Sizes follow nccl-tests: `size` is the largest buffer of one rank in bytes (all_reduce: the
// buffer; all_gather: the gathered output; reduce_scatter: the input; all_to_all: either buffer;
// sendrecv: the message), `count` = size / element size, and a block (what one rank contributes
// or gets) is count / nranks elements for all_gather, reduce_scatter and all_to_all.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace shardlm::bench_comm {

enum class Op { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kSendRecv };

const char* op_name(Op op);              // "all_reduce", ...
const char* nccl_tests_binary(Op op);    // "all_reduce_perf", ...
// "all" or a comma-separated list of op names; throws Error naming --op otherwise.
std::vector<Op> parse_ops(const std::string& text);

// "8", "64K", "64M", "1G" (binary: K = 2^10; k/m/g too); throws Error naming `option` on
// anything else (empty, signs, fractions, other suffixes, overflow).
uint64_t parse_size(const std::string& text, const std::string& option);

// nccl-tests bus bandwidth factor: all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all
// (n-1)/n; sendrecv 1.
double bus_factor(Op op, int nranks);

// Elements per block for a size in bytes (rounded down), and the size those blocks make.
uint64_t block_count(Op op, int nranks, uint64_t bytes, size_t elem_size);
uint64_t size_bytes(Op op, int nranks, uint64_t block, size_t elem_size);
uint64_t send_elems(Op op, int nranks, uint64_t block);  // elements of the input buffer
uint64_t recv_elems(Op op, int nranks, uint64_t block);  // elements of the output buffer

// Element `index` of rank `rank`'s input: a small integer in [-8, 8] that depends on both, so
// that sums over ranks are exact in float and misrouted data shows.
int input_value(int rank, uint64_t index);
// Element `index` of rank `rank`'s output after `op` (sum reductions; sendrecv on a ring: rank r
// sends to r+1 and receives from r-1).
int64_t expected_value(Op op, int nranks, int rank, uint64_t block, uint64_t index);

}  // namespace shardlm::bench_comm
