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
  sample_rows.clear();
  token_edits.clear();
}

bool ForwardBatch::sampled() const {
  SHARDLM_CHECK(sample_rows.empty() || sample_rows.size() == logit_rows.size(),
                "a step with " << logit_rows.size() << " logit rows carries " << sample_rows.size() << " sample rows");
  // The samplers read each row's token edits where it says, unchecked.
  const int64_t seen = static_cast<int64_t>(token_edits.size());
  // Each row's top alternatives begin where the previous row's end, so the arrays' length is
  // known from the last row (top_entries).
  int64_t top = 0;
  for (const SampleRow& r : sample_rows) {
    SHARDLM_CHECK(
        r.edits_begin >= 0 && r.edits_count >= 0 && r.edits_begin <= seen && r.edits_count <= seen - r.edits_begin,
        "a sample row's token edits [" << r.edits_begin << ", +" << r.edits_count << ") are outside the step's "
                                       << seen);
    SHARDLM_CHECK(r.top_n >= 0 && r.top_n <= kMaxTopLogprobs && r.top_begin == top,
                  "a sample row's top alternatives [" << r.top_begin << ", +" << r.top_n
                                                      << ") do not follow the previous "
                                                      << "row's end " << top << " (at most " << kMaxTopLogprobs << ")");
    SHARDLM_CHECK(r.target >= -1, "a sample row's scored token " << r.target << " is negative");
    top += r.top_n;
  }
  return !sample_rows.empty();
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
  batch.sampled();
  forward(batch, buf.data());
  finished_logits_.push_back(std::move(buf));
  finished_rows_.push_back({batch.sample_rows, batch.token_edits});
}

void Model::end_step(float* logits) {
  SHARDLM_CHECK(!finished_logits_.empty(), "end_step without a begun step");
  std::copy(finished_logits_.front().begin(), finished_logits_.front().end(), logits);
  spare_logits_.push_back(std::move(finished_logits_.front()));
  finished_logits_.pop_front();
  finished_rows_.pop_front();
}

void Model::end_step_sampled(StepChoices* out) {
  SHARDLM_CHECK(!finished_rows_.empty(), "end_step_sampled without a begun step");
  const std::vector<SampleRow> rows = std::move(finished_rows_.front().rows);
  const std::vector<TokenEdit> seen = std::move(finished_rows_.front().seen);
  const int64_t V = spec().vocab_size;
  sampled_logits_.resize(finished_logits_.front().size());
  end_step(sampled_logits_.data());  // ends the step either way, like the decoder
  SHARDLM_CHECK(rows.size() * static_cast<size_t>(V) == sampled_logits_.size(),
                "end_step_sampled on a step begun without sample rows (end it with end_step)");
  out->resize(static_cast<int64_t>(rows.size()), top_entries(rows.data(), static_cast<int64_t>(rows.size())));
  for (size_t r = 0; r < rows.size(); ++r) {
    const float* row = sampled_logits_.data() + static_cast<int64_t>(r) * V;
    const Sample s = sampler_.sample(row, V, rows[r], seen.data());
    out->tokens[r] = s.token;
    out->logprobs[r] = s.logprob;
    write_top_logprobs(row, V, rows[r], out->top_tokens.data(), out->top_logprobs.data());
  }
}

}  // namespace shardlm
