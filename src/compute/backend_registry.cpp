// Backend registry: one {name, factory} row per backend.
#include <sstream>

#include "compute/backend.h"
#include "compute/cpu_backend.h"
#ifdef SHARDLM_HAVE_CUDA
#include "compute/cuda_backend.h"
#endif
#include "core/error.h"

namespace shardlm {
namespace {

struct BackendEntry {
  const char* name;
  std::unique_ptr<ComputeBackend> (*factory)();
};

const BackendEntry kBackends[] = {
    {"cpu", &make_cpu_backend},
#ifdef SHARDLM_HAVE_CUDA
    {"cuda", &make_cuda_backend},
#endif
};

}  // namespace

std::unique_ptr<ComputeBackend> make_backend(const std::string& name) {
  for (const auto& e : kBackends)
    if (name == e.name) return e.factory();
  std::ostringstream known;
  for (const auto& e : kBackends) known << (known.tellp() > 0 ? ", " : "") << e.name;
  SHARDLM_FAIL("unknown compute backend '" << name << "'; known backends: " << known.str());
}

std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (const auto& e : kBackends) names.emplace_back(e.name);
  return names;
}

}  // namespace shardlm
