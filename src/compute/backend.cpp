// Defaults of the optional ComputeBackend operations.
#include "compute/backend.h"

#include "core/error.h"
#include "model/checkpoint.h"

namespace shardlm {

Matrix ComputeBackend::load_fp8_matrix(const TensorView& w, const TensorView&, int64_t, int64_t, int64_t, int64_t,
                                       int64_t, int64_t) {
  SHARDLM_FAIL("backend " << name() << " does not dequantise fp8 weights itself ('" << w.name
                          << "'): the weight loader must dequantise them on the host");
}

}  // namespace shardlm
