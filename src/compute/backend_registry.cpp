// Backend registry: one {name, factory} row per backend.
#include <algorithm>
#include <sstream>
#include <utility>

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

std::vector<std::pair<std::string, std::unique_ptr<ComputeBackend> (*)()>>& overrides() {
  static std::vector<std::pair<std::string, std::unique_ptr<ComputeBackend> (*)()>> o;
  return o;
}

}  // namespace

std::unique_ptr<ComputeBackend> make_backend(const std::string& name) {
  for (const auto& [n, factory] : overrides())
    if (name == n) return factory();
  for (const auto& e : kBackends)
    if (name == e.name) return e.factory();
  std::ostringstream known;
  for (const auto& n : backend_names()) known << (known.tellp() > 0 ? ", " : "") << n;
  SHARDLM_FAIL("unknown compute backend '" << name << "'; known backends: " << known.str());
}

std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (const auto& e : kBackends) names.emplace_back(e.name);
  for (const auto& [n, factory] : overrides())
    if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  return names;
}

void override_backend(const std::string& name, std::unique_ptr<ComputeBackend> (*factory)()) {
  for (auto& [n, f] : overrides())
    if (n == name) {
      f = factory;
      return;
    }
  overrides().emplace_back(name, factory);
}

}  // namespace shardlm
