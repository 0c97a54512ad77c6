#include "arch/weight_loader.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "model/fp8_block.h"
#include "model/tensor_slice.h"

namespace shardlm {

namespace {

std::string scale_name(const std::string& weight) { return weight + "_scale_inv"; }

float host_scalar(const TensorView& t) {
  SHARDLM_CHECK(t.numel() == 1 && (t.dtype == DType::F32 || t.dtype == DType::BF16),
                t.file << ": tensor '" << t.name << "' is a KV cache scale, so one F32 or BF16 value, but it is "
                       << dtype_name(t.dtype) << " with " << t.numel() << " elements");
  float f;
  if (t.dtype == DType::F32) {
    std::memcpy(&f, t.data, 4);
  } else {
    uint16_t h;
    std::memcpy(&h, t.data, 2);
    f = bf16_to_f32(h);
  }
  SHARDLM_CHECK(std::isfinite(f) && f > 0,
                t.file << ": KV cache scale '" << t.name << "' is " << f << ", not a finite positive number");
  return f;
}

}  // namespace

WeightLoader::KvScales WeightLoader::kv_scales(const std::string& prefix) const {
  KvScales s;
  if (ckpt_.has(prefix + "kv_scale")) s.k = s.v = host_scalar(ckpt_.get(prefix + "kv_scale"));
  if (ckpt_.has(prefix + "k_scale")) s.k = host_scalar(ckpt_.get(prefix + "k_scale"));
  if (ckpt_.has(prefix + "v_scale")) s.v = host_scalar(ckpt_.get(prefix + "v_scale"));
  return s;
}

Matrix WeightLoader::rows(const std::string& name, int64_t R, int64_t C, int64_t r0, int64_t n, WeightUse use) {
  const TensorView& t = ckpt_.get(name, {R, C});
  if (t.dtype == DType::F8_E4M3) return fp8_slice(t, r0, n, 0, C, use);
  TensorView v = slice_rows(t, r0, n);
  bytes_ += touch_pages(v);
  return b_.load_matrix(v);
}

Matrix WeightLoader::cols(const std::string& name, int64_t R, int64_t C, int64_t c0, int64_t n) {
  const TensorView& t = ckpt_.get(name, {R, C});
  if (t.dtype == DType::F8_E4M3) return fp8_slice(t, 0, R, c0, n, WeightUse::kLinear);
  owned_.emplace_back();
  TensorView v = slice_cols(t, c0, n, &owned_.back());
  bytes_ += v.nbytes;
  return b_.load_matrix(v);
}

TensorView WeightLoader::host_rows(const std::string& name, int64_t R, int64_t C, int64_t r0, int64_t n) {
  const TensorView& t = ckpt_.get(name, {R, C});
  if (t.dtype == DType::F8_E4M3) return fp8_host_slice(t, r0, n, 0, C);
  TensorView v = slice_rows(t, r0, n);
  bytes_ += touch_pages(v);
  if (v.dtype == DType::F32 || v.dtype == DType::BF16) return v;
  SHARDLM_CHECK(v.dtype == DType::F16, t.file << ": tensor '" << t.name << "' has dtype " << dtype_name(t.dtype)
                                              << "; expected F32, BF16, F16 or F8_E4M3");
  owned_.emplace_back(static_cast<size_t>(v.numel()) * sizeof(float));
  auto* f = reinterpret_cast<float*>(owned_.back().data());
  const auto* h = static_cast<const uint16_t*>(v.data);
  for (int64_t i = 0; i < v.numel(); ++i) f[i] = f16_to_f32(h[i]);
  v.dtype = DType::F32;
  v.data = f;
  v.nbytes = owned_.back().size();
  v.file_backed = false;
  return v;
}

Vector WeightLoader::vec(const std::string& name, int64_t N, int64_t r0, int64_t n) {
  TensorView v = slice_rows(ckpt_.get(name, {N}), r0, n);
  bytes_ += touch_pages(v);
  return b_.load_vector(v);
}

Matrix WeightLoader::fp8_slice(const TensorView& w, int64_t r0, int64_t nr, int64_t c0, int64_t nc, WeightUse use) {
  if (b_.takes_fp8()) {
    const std::string sname = scale_name(w.name);
    SHARDLM_CHECK(ckpt_.has(sname), w.file << ": tensor '" << w.name << "' is F8_E4M3 but its block scales '" << sname
                                           << "' are missing");
    const TensorView& s = ckpt_.get(sname);
    bytes_ += static_cast<size_t>(nr * nc) + static_cast<size_t>(s.nbytes);
    return b_.load_fp8_matrix(w, s, block_rows_, block_cols_, r0, nr, c0, nc, use == WeightUse::kLinear);
  }
  return b_.load_matrix(fp8_host_slice(w, r0, nr, c0, nc));
}

TensorView WeightLoader::fp8_host_slice(const TensorView& w, int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
  const std::string sname = scale_name(w.name);
  SHARDLM_CHECK(ckpt_.has(sname), w.file << ": tensor '" << w.name << "' is F8_E4M3 but its block scales '" << sname
                                         << "' are missing");
  const TensorView& s = ckpt_.get(sname);
  owned_.emplace_back(static_cast<size_t>(nr * nc) * 2);
  std::vector<uint8_t>& buf = owned_.back();
  dequant_fp8_block(w, s, block_rows_, block_cols_, r0, nr, c0, nc, reinterpret_cast<uint16_t*>(buf.data()));
  bytes_ += static_cast<size_t>(nr * nc) + static_cast<size_t>(s.nbytes);
  TensorView v = w;
  v.dtype = DType::BF16;
  v.shape = {nr, nc};
  v.data = buf.data();
  v.nbytes = buf.size();
  v.file_backed = false;
  return v;
}

}  // namespace shardlm
