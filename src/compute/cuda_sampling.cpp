// CudaBackend's sampling: the choices made on the device (kernels/cuda/sampling.h), after the
// logit controls and penalties where a row has them (kernels/cuda/logit_edits.h), so that only the
// tokens, their logprobs and the rows' top alternatives cross to the host.
#include <cuda_runtime.h>

#include <vector>

#include "compute/cuda_backend.h"
#include "compute/cuda_check.h"
#include "core/error.h"
#include "cuda/logit_edits.h"
#include "io/request.h"
#include "cuda/sampling.h"
#include "sample_rules.h"

namespace shardlm {

void* CudaBackend::sample_buffer(int i, size_t bytes, bool ahead) {
  if (bytes > sample_bytes_[i]) {
    // The previous sample() waited for its kernels, so nothing reads the old buffer any more.
    SHARDLM_CUDA_CHECK(cudaFree(sample_buf_[i]));
    sample_buf_[i] = nullptr;
    sample_bytes_[i] = 0;
    const size_t size = ahead ? bytes + bytes / 2 : bytes;
    SHARDLM_CUDA_CHECK(cudaMalloc(&sample_buf_[i], size));
    sample_bytes_[i] = size;
  }
  return sample_buf_[i];
}

void CudaBackend::sample(const float* logits, int64_t R, int64_t V, const SampleRow* rows, const TokenEdit* edits,
                         int32_t* tokens, float* logprobs, int32_t* top_tokens, float* top_logprobs) {
  if (R == 0) return;
  SHARDLM_CHECK(!capturing_, "cuda backend: sample while capturing a CUDA graph (it writes host memory)");
  const size_t n = static_cast<size_t>(R);
  std::vector<cuda::SamplingRow> host(n);
  std::vector<cuda::LogitEditEntry> entries;
  bool any_allowed_only = false;
  for (size_t r = 0; r < n; ++r) {
    const SampleRow& row = rows[r];
    SHARDLM_CHECK(row.temperature <= 0.0 || V <= sampling::kMaxVocab,
                  "sampling: a vocabulary of " << V << " is above the sampler's " << sampling::kMaxVocab);
    host[r].temperature = row.temperature;
    host[r].top_p = row.top_p;
    host[r].min_p = row.min_p;
    host[r].top_k = row.top_k;
    host[r].seed = row.seed;
    host[r].position = row.position;
    host[r].repetition_penalty = row.repetition_penalty;
    host[r].frequency_penalty = row.frequency_penalty;
    host[r].presence_penalty = row.presence_penalty;
    // The kernel reads and writes where these say: checked here, as the host sampler checks them.
    SHARDLM_CHECK(row.target < V, "sampling: scored token " << row.target << " outside a vocabulary of " << V);
    SHARDLM_CHECK(row.top_n == 0 || (top_tokens && top_logprobs && row.top_n <= kMaxTopLogprobs && row.top_begin >= 0 &&
                                     row.top_begin + row.top_n <= top_entries(rows, R)),
                  "sampling: a row's " << row.top_n << " top logprobs at " << row.top_begin
                                       << " are outside the step's top arrays");
    host[r].target = row.target;
    host[r].top_n = row.top_n;
    host[r].top_begin = row.top_begin;
    host[r].allowed_only = row.allowed_only ? 1 : 0;
    any_allowed_only = any_allowed_only || row.allowed_only;
    if (!row.edited()) continue;
    SHARDLM_CHECK(edits || row.edits_count == 0, "sampling: an edited row without the step's token edits");
    // Without a repetition penalty or a bias, a token of the prompt alone keeps its logit: no
    // entry (unless the row bars every token it does not list).
    const bool prompt_tokens_change = row.repetition_penalty != 1.0f || row.allowed_only;
    for (int64_t i = row.edits_begin; i < row.edits_begin + row.edits_count; ++i) {
      const TokenEdit& e = edits[i];
      // The kernel writes where the token says: one outside the row would write another's logits.
      SHARDLM_CHECK(e.token >= 0 && e.token < V, "logit edits: token " << e.token << " outside a vocabulary of " << V);
      if (e.output_count > 0 || e.bias != 0.0f || prompt_tokens_change)
        entries.push_back({static_cast<int32_t>(r), e.token, e.output_count, e.bias, e.allowed});
    }
  }
  auto* d_rows = static_cast<cuda::SamplingRow*>(sample_buffer(0, n * sizeof(cuda::SamplingRow)));
  auto* d_scratch = static_cast<float*>(sample_buffer(1, n * static_cast<size_t>(V) * sizeof(float)));
  auto* d_tokens = static_cast<int32_t*>(sample_buffer(2, n * sizeof(int32_t)));
  auto* d_logprobs = static_cast<float*>(sample_buffer(3, n * sizeof(float)));
  const size_t top = static_cast<size_t>(top_entries(rows, R));
  auto* d_top_tokens = top ? static_cast<int32_t*>(sample_buffer(6, top * sizeof(int32_t))) : nullptr;
  auto* d_top_logprobs = top ? static_cast<float*>(sample_buffer(7, top * sizeof(float))) : nullptr;
  const cudaStream_t s = stream_of(stream_);
  // From pageable memory the copies return once the host vectors have been read: they may go out
  // of scope.
  SHARDLM_CUDA_CHECK(cudaMemcpyAsync(d_rows, host.data(), n * sizeof(cuda::SamplingRow), cudaMemcpyHostToDevice, s));
  const float* choice = logits;
  if (!entries.empty() || any_allowed_only) {
    // The choice reads an edited copy; the logprobs, the step's logits as they are.
    auto* d_edited = static_cast<float*>(sample_buffer(4, n * static_cast<size_t>(V) * sizeof(float)));
    auto* d_entries =
        entries.empty()
            ? nullptr
            : static_cast<cuda::LogitEditEntry*>(sample_buffer(5, entries.size() * sizeof(cuda::LogitEditEntry), true));
    SHARDLM_CUDA_CHECK(
        cudaMemcpyAsync(d_edited, logits, n * static_cast<size_t>(V) * sizeof(float), cudaMemcpyDeviceToDevice, s));
    if (d_entries) {
      SHARDLM_CUDA_CHECK(cudaMemcpyAsync(d_entries, entries.data(), entries.size() * sizeof(cuda::LogitEditEntry),
                                         cudaMemcpyHostToDevice, s));
    }
    cuda::launch_apply_logit_edits(logits, d_edited, R, V, d_rows, d_entries, static_cast<int64_t>(entries.size()),
                                   any_allowed_only, s);
    check_launch("apply_logit_edits");
    choice = d_edited;
  }
  cuda::launch_sample(logits, R, V, d_rows, d_scratch, d_tokens, d_logprobs, s, choice, d_top_tokens, d_top_logprobs);
  check_launch("sample");
  SHARDLM_CUDA_CHECK(cudaMemcpyAsync(tokens, d_tokens, n * sizeof(int32_t), cudaMemcpyDeviceToHost, s));
  SHARDLM_CUDA_CHECK(cudaMemcpyAsync(logprobs, d_logprobs, n * sizeof(float), cudaMemcpyDeviceToHost, s));
  if (top) {
    SHARDLM_CUDA_CHECK(cudaMemcpyAsync(top_tokens, d_top_tokens, top * sizeof(int32_t), cudaMemcpyDeviceToHost, s));
    SHARDLM_CUDA_CHECK(cudaMemcpyAsync(top_logprobs, d_top_logprobs, top * sizeof(float), cudaMemcpyDeviceToHost, s));
  }
  SHARDLM_CUDA_CHECK(cudaStreamSynchronize(s));
}

}  // namespace shardlm
