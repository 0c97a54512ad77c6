// Backends by name: make_communicator looks the name up in one table.
//
// "mpi" (and "fabric") move host memory; where the CUDA runtime sees a GPU they are wrapped in
// StagedCommunicator so that device buffers work too (through pinned host memory). On CPU-only
// machines they stay plain: no pointer checks on every call. "nccl" exists only in NCCL builds and
// needs a GPU.
#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/comm_mpi.h"
#include "parallel/communicator.h"

#include "parallel/comm_staged.h"
#include "parallel/memory_space.h"
#ifdef SHARDLM_HAVE_CUDA
#include "cuda/device_info.h"
#endif
#ifdef SHARDLM_HAVE_NCCL
#include "parallel/comm_nccl.h"
#endif
#ifdef SHARDLM_HAVE_LIBFABRIC
#include "parallel/comm_fabric.h"
#endif

namespace shardlm {

namespace {

using Factory = std::function<std::unique_ptr<Communicator>(const std::vector<int>&, const std::string&, double)>;

struct Backend {
  const char* name;
  Factory make;
};

std::shared_ptr<MemorySpace> cuda_where_gpu() {
#ifdef SHARDLM_HAVE_CUDA
  if (cuda::device_count() > 0) return cuda_memory_space();
#endif
  return nullptr;
}

StagingMemory& staging_memory() {
  static StagingMemory s = &cuda_where_gpu;
  return s;
}

// A host-memory communicator, wrapped so that device buffers work too where there is a GPU.
std::unique_ptr<Communicator> staged_where_gpu(std::unique_ptr<Communicator> host) {
  std::shared_ptr<MemorySpace> memory = staging_memory()();
  if (memory) return std::make_unique<StagedCommunicator>(std::move(host), std::move(memory));
  return host;
}

const std::vector<Backend>& backends() {
  static const std::vector<Backend> table = {
      {"mpi", [](const std::vector<int>& m, const std::string& n, double t) {
         return staged_where_gpu(std::make_unique<MpiCommunicator>(m, n, t));
       }},
#ifdef SHARDLM_HAVE_LIBFABRIC
      {"fabric", [](const std::vector<int>& m, const std::string& n, double t) {
         return staged_where_gpu(std::make_unique<FabricCommunicator>(m, n, t));
       }},
#endif
#ifdef SHARDLM_HAVE_NCCL
      {"nccl", [](const std::vector<int>& m, const std::string& n, double t) -> std::unique_ptr<Communicator> {
         SHARDLM_CHECK(cuda::device_count() > 0, "communicator backend nccl for group " << n << ": no GPU on this host ("
                                                     << cuda::why_none() << "); use --comm mpi");
         return std::make_unique<NcclCommunicator>(m, n, t);
       }},
#endif
  };
  return table;
}

std::vector<std::pair<std::string, CommFactory>>& overrides() {
  static std::vector<std::pair<std::string, CommFactory>> o;
  return o;
}

}  // namespace

void override_communicator(const std::string& name, CommFactory factory) {
  for (auto& [n, f] : overrides())
    if (n == name) {
      f = factory;
      return;
    }
  overrides().emplace_back(name, factory);
}

void override_staging_memory(StagingMemory staging) { staging_memory() = staging; }

void Communicator::enqueue_all_reduce(void*, size_t, CommDType, ReduceOp, void*) {
  SHARDLM_FAIL("communicator " << name() << " cannot queue collectives on a stream (CUDA graphs need --comm nccl)");
}

void Communicator::enqueue_all_to_all(const void*, void*, size_t, CommDType, void*) {
  SHARDLM_FAIL("communicator " << name() << " cannot queue collectives on a stream (CUDA graphs need --comm nccl)");
}

size_t comm_dtype_size(CommDType t) {
  switch (t) {
    case CommDType::kF32: return 4;
    case CommDType::kI32: return 4;
    case CommDType::kI64: return 8;
    case CommDType::kU8: return 1;
    case CommDType::kBF16: return 2;
  }
  SHARDLM_FAIL("unknown CommDType " << static_cast<int>(t));
}

std::vector<std::string> comm_backend_names() {
  std::vector<std::string> names;
  for (const Backend& b : backends()) names.emplace_back(b.name);
  for (const auto& [n, f] : overrides())
    if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  return names;
}

std::unique_ptr<Communicator> make_communicator(const std::string& backend, const std::vector<int>& members,
                                                const std::string& name, double timeout_s) {
  for (const auto& [n, f] : overrides())
    if (backend == n) return f(members, name, timeout_s);
  for (const Backend& b : backends())
    if (backend == b.name) return b.make(members, name, timeout_s);
  std::string known;
  for (const std::string& n : comm_backend_names()) known += (known.empty() ? "" : ", ") + n;
  SHARDLM_FAIL("unknown communicator backend '" << backend << "' (known: " << known << ")");
}

}  // namespace shardlm
