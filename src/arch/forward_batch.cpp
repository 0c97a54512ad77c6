#include "arch/model.h"

#include <algorithm>

#include "core/error.h"

namespace shardlm {

void ForwardBatch::clear() {
  tokens.clear();
  positions.clear();
  slots.clear();
  token_seq.clear();
  seq_block_start.assign(1, 0);
  blocks.clear();
  logit_rows.clear();
}

void ForwardBatch::add_chunk(const int32_t* seq_tokens, int64_t start, int64_t len, const std::vector<int32_t>& table,
                             int64_t block_size, bool wants_logits) {
  if (seq_block_start.empty()) seq_block_start.push_back(0);
  const int32_t seq = static_cast<int32_t>(seq_block_start.size()) - 1;
  blocks.insert(blocks.end(), table.begin(), table.end());
  seq_block_start.push_back(static_cast<int32_t>(blocks.size()));
  for (int64_t p = start; p < start + len; ++p) {
    tokens.push_back(seq_tokens[p]);
    positions.push_back(static_cast<int32_t>(p));
    slots.push_back(static_cast<int64_t>(table[p / block_size]) * block_size + p % block_size);
    token_seq.push_back(seq);
  }
  if (wants_logits) logit_rows.push_back(static_cast<int32_t>(tokens.size()) - 1);
}

void Model::begin_step(const ForwardBatch& batch) {
  // Buffers are reused step after step: a batch's logits are rows x vocab floats.
  std::vector<float> buf;
  if (!spare_logits_.empty()) {
    buf = std::move(spare_logits_.back());
    spare_logits_.pop_back();
  }
  buf.resize(batch.logit_rows.size() * static_cast<size_t>(spec().vocab_size));
  forward(batch, buf.data());
  finished_logits_.push_back(std::move(buf));
}

void Model::end_step(float* logits) {
  SHARDLM_CHECK(!finished_logits_.empty(), "end_step without a begun step");
  std::copy(finished_logits_.front().begin(), finished_logits_.front().end(), logits);
  spare_logits_.push_back(std::move(finished_logits_.front()));
  finished_logits_.pop_front();
}

void Model::end_step_sampled(const std::vector<SampleRow>& rows, std::vector<int32_t>* tokens,
                             std::vector<float>* logprobs) {
  const int64_t V = spec().vocab_size;
  sampled_logits_.resize(rows.size() * static_cast<size_t>(V));
  end_step(sampled_logits_.data());
  tokens->resize(rows.size());
  logprobs->resize(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    const Sample s = sampler_.sample(sampled_logits_.data() + static_cast<int64_t>(r) * V, V, rows[r]);
    (*tokens)[r] = s.token;
    (*logprobs)[r] = s.logprob;
  }
}

}  // namespace shardlm
