// CommDType / ReduceOp to NCCL's enums. NCCL builds only.
#pragma once

#ifdef SHARDLM_HAVE_NCCL
#include <nccl.h>

#include "core/error.h"
#include "parallel/communicator.h"

namespace shardlm {

inline ncclDataType_t nccl_dtype(CommDType t) {
  switch (t) {
    case CommDType::kF32: return ncclFloat32;
    case CommDType::kI32: return ncclInt32;
    case CommDType::kI64: return ncclInt64;
    case CommDType::kU8: return ncclUint8;
    case CommDType::kBF16: return ncclBfloat16;
  }
  SHARDLM_FAIL("unknown CommDType " << static_cast<int>(t));
}

inline ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  SHARDLM_FAIL("unknown ReduceOp " << static_cast<int>(op));
}

}  // namespace shardlm
#endif
