// What the CUDA runtime sees on this machine. Safe to call where there is no GPU or no driver:
// device_count() is then 0 and why_none() says why (for test skips and the preflight report).
#pragma once

#include <string>

namespace shardlm::cuda {

int device_count();
std::string why_none();           // "" when device_count() > 0
int runtime_version();            // e.g. 13000 for CUDA 13.0
int driver_version();             // 0 without a driver
std::string device_name(int dev);  // "" when dev does not exist
int compute_capability(int dev);   // 10 major + minor (90: Hopper), 0 when dev does not exist

}  // namespace shardlm::cuda
