// WeightLoader: this rank's slices of checkpoint tensors, handed to the backend. Rows of a weight
// (output features) are contiguous in the file and stay views into the mapping; columns are read
// with pread. FP8 e4m3 weights with block scales (`<name>_scale_inv`) stay fp8 where the backend
// computes with them (WeightUse::kLinear), else are dequantised at load, exactly as the reference
// dequantisation does it (fp8 x fp32 scale, rounded to bf16). The loader owns the host copies it
// makes, and the backend may use them in place: it must outlive the model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compute/backend.h"
#include "model/checkpoint.h"

namespace shardlm {

// What a loaded matrix is for. kLinear: only linear() and grouped_linear() read it, so a backend
// that computes with fp8 weights may keep an fp8 checkpoint's weight fp8. kTable: read some other
// way (embedding rows): always F32 or BF16.
enum class WeightUse { kLinear, kTable };

class WeightLoader {
 public:
  // block_rows x block_cols: the fp8 scale blocks (the config's weight_block_size).
  WeightLoader(const Checkpoint& ckpt, ComputeBackend& backend, int64_t block_rows = 128, int64_t block_cols = 128)
      : ckpt_(ckpt), b_(backend), block_rows_(block_rows), block_cols_(block_cols) {}

  bool has(const std::string& name) const { return ckpt_.has(name); }
  // Rows [r0, r0 + n) of the [R, C] weight NAME.
  Matrix rows(const std::string& name, int64_t R, int64_t C, int64_t r0, int64_t n, WeightUse use = WeightUse::kLinear);
  Matrix whole(const std::string& name, int64_t R, int64_t C) { return rows(name, R, C, 0, R); }
  // Columns [c0, c0 + n) of the [R, C] weight NAME.
  Matrix cols(const std::string& name, int64_t R, int64_t C, int64_t c0, int64_t n);
  // Rows [r0, r0 + n) of the [R, C] weight NAME in host memory, F32 or BF16 (F16 and fp8 are
  // converted; the view lives as long as the loader), for a weight the model rearranges on the host
  // before it loads the result (MLA's kv_b_proj): nothing goes to the backend.
  TensorView host_rows(const std::string& name, int64_t R, int64_t C, int64_t r0, int64_t n);
  // Elements [r0, r0 + n) of the length-N vector NAME.
  Vector vec(const std::string& name, int64_t N, int64_t r0, int64_t n);
  Vector vec(const std::string& name, int64_t N) { return vec(name, N, 0, N); }

  // An fp8 KV cache's scales for the attention layer whose tensors start with `prefix`
  // ("model.layers.N.self_attn."): the checkpoint's prefix + "k_scale" and prefix + "v_scale" (the
  // names vLLM and llm-compressor write; an older prefix + "kv_scale" serves both), one-element F32
  // or BF16 tensors read on the host, each finite and positive; 1 where the checkpoint has none.
  struct KvScales {
    float k = 1.0f, v = 1.0f;
  };
  KvScales kv_scales(const std::string& prefix) const;

  // Bytes of checkpoint data read so far.
  size_t bytes() const { return bytes_; }
  ComputeBackend& backend() { return b_; }

 private:
  // FP8 block-scaled weight, rows [r0, r0+nr) x cols [c0, c0+nc): kept fp8 for kLinear on a backend
  // that keeps fp8 weights, else its bf16 dequantisation.
  Matrix fp8_slice(const TensorView& w, int64_t r0, int64_t nr, int64_t c0, int64_t nc, WeightUse use);
  // The host bf16 dequantisation of that slice, owned by the loader.
  TensorView fp8_host_slice(const TensorView& w, int64_t r0, int64_t nr, int64_t c0, int64_t nc);

  const Checkpoint& ckpt_;
  ComputeBackend& b_;
  int64_t block_rows_, block_cols_;
  std::vector<std::vector<uint8_t>> owned_;  // gathered columns and dequantised slices
  size_t bytes_ = 0;
};

}  // namespace shardlm
