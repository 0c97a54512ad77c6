// Slices of checkpoint tensors for sharded loading: a rank takes only the rows or columns it owns.
#pragma once

#include <cstdint>
#include <vector>

#include "model/checkpoint.h"

namespace shardlm {

// Rows [r0, r0 + n) of a 1-D or 2-D tensor: a view into the same mapping (rows are contiguous).
TensorView slice_rows(const TensorView& t, int64_t r0, int64_t n);
// Columns [c0, c0 + n) of a 2-D tensor, gathered into `storage` (which must outlive the view);
// only those byte ranges of the mapping are read.
TensorView slice_cols(const TensorView& t, int64_t c0, int64_t n, std::vector<uint8_t>* storage);
// Reads one byte of every page of the view so the bytes are in memory before timing stops (and
// the load's GB/s is real); returns the byte count.
size_t touch_pages(const TensorView& t);

}  // namespace shardlm
