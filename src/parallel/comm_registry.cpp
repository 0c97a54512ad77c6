// Backends by name: make_communicator looks the name up in one table.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/comm_mpi.h"
#include "parallel/communicator.h"

namespace shardlm {

namespace {

using Factory = std::function<std::unique_ptr<Communicator>(const std::vector<int>&, const std::string&, double)>;

struct Backend {
  const char* name;
  Factory make;
};

const std::vector<Backend>& backends() {
  static const std::vector<Backend> table = {
      {"mpi", [](const std::vector<int>& m, const std::string& n, double t) -> std::unique_ptr<Communicator> {
         return std::make_unique<MpiCommunicator>(m, n, t);
       }},
  };
  return table;
}

}  // namespace

size_t comm_dtype_size(CommDType t) {
  switch (t) {
    case CommDType::kF32: return 4;
    case CommDType::kI32: return 4;
    case CommDType::kI64: return 8;
    case CommDType::kU8: return 1;
  }
  SHARDLM_FAIL("unknown CommDType " << static_cast<int>(t));
}

std::vector<std::string> comm_backend_names() {
  std::vector<std::string> names;
  for (const Backend& b : backends()) names.emplace_back(b.name);
  return names;
}

std::unique_ptr<Communicator> make_communicator(const std::string& backend, const std::vector<int>& members,
                                                const std::string& name, double timeout_s) {
  for (const Backend& b : backends())
    if (backend == b.name) return b.make(members, name, timeout_s);
  std::string known;
  for (const std::string& n : comm_backend_names()) known += (known.empty() ? "" : ", ") + n;
  SHARDLM_FAIL("unknown communicator backend '" << backend << "' (known: " << known << ")");
}

}  // namespace shardlm
