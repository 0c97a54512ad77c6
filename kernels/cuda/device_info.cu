#include "cuda/device_info.h"

#include <cuda_runtime.h>

namespace shardlm::cuda {

namespace {
struct Probe {
  int count = 0;
  cudaError_t err = cudaSuccess;
  Probe() {
    err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      count = 0;
      cudaGetLastError();  // clear the sticky-free error so later calls start clean
    }
  }
};
const Probe& probe() {
  static const Probe p;
  return p;
}
}  // namespace

int device_count() { return probe().count; }

std::string why_none() {
  const Probe& p = probe();
  if (p.count > 0) return "";
  if (p.err != cudaSuccess) return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(p.err);
  return "the CUDA runtime reports 0 devices";
}

int runtime_version() {
  int v = 0;
  if (cudaRuntimeGetVersion(&v) != cudaSuccess) return 0;
  return v;
}

int driver_version() {
  int v = 0;
  if (cudaDriverGetVersion(&v) != cudaSuccess) return 0;
  return v;
}

std::string device_name(int dev) {
  if (dev < 0 || dev >= device_count()) return "";
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess) return "";
  return prop.name;
}

int compute_capability(int dev) {
  if (dev < 0 || dev >= device_count()) return 0;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess) return 0;
  return 10 * prop.major + prop.minor;
}

}  // namespace shardlm::cuda
