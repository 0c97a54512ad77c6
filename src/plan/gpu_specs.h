// Accelerator and interconnect figures for `shardlm plan`: marketed peak numbers from vendor
// datasheets, used as roofline ceilings. Real kernels reach some fraction of them.
#pragma once

#include <string>
#include <vector>

namespace shardlm::plan {

struct GpuSpec {
  std::string name;         // "h200"
  std::string description;  // "NVIDIA H200 SXM 141 GB (AWS p5en)"
  double hbm_bytes;         // HBM capacity, bytes (marketed GB, 1e9)
  double hbm_bw;            // HBM bandwidth, bytes/s
  double bf16_flops;        // dense (no sparsity) BF16 tensor-core FLOP/s
  double fp8_flops;         // dense (no sparsity) FP8 tensor-core FLOP/s
  double fp32_flops;        // FP32 FLOP/s on the CUDA cores (no tensor cores): kernels that stay in fp32
  double nvlink_bw;         // NVLink bytes/s per GPU per direction
  double node_net_bw;       // inter-node bytes/s per node (all NICs of the node together)
  int gpus_per_node;        // GPUs in the usual node of this kind
};

// The spec named `name` (case-insensitive); throws Error listing the known names otherwise.
const GpuSpec& gpu_spec(const std::string& name);
const std::vector<GpuSpec>& gpu_specs();

// The spec whose datasheet describes the device the CUDA runtime names `device_name` ("NVIDIA
// H200", "NVIDIA H100 80GB HBM3"), or null. The model must be a whole word of the name, and the
// form factors the table does not hold are not taken for it: an H100 PCIe or NVL (2.0 / 3.9 TB/s
// and lower clocks), an H200 NVL, or a GH200 (whose name contains "h200") would get the SXM
// part's ceilings.
const GpuSpec* datasheet_spec(const std::string& device_name);

}  // namespace shardlm::plan
