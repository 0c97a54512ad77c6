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

void ComputeBackend::begin_capture() {
  SHARDLM_FAIL("backend " << name() << " cannot capture steps as graphs (--cuda-graphs needs --backend cuda)");
}

int64_t ComputeBackend::end_capture() { SHARDLM_FAIL("backend " << name() << " cannot capture steps as graphs"); }

void ComputeBackend::replay(int64_t) { SHARDLM_FAIL("backend " << name() << " cannot replay captured graphs"); }

void ComputeBackend::drop_captures() {}

}  // namespace shardlm
