// Model::end_step_sampled against end_step + the host Sampler, on tiny random models: the decoder
// that holds the whole vocabulary samples through ComputeBackend::sample (the host Sampler on the
// CPU backend, so the tokens and logprobs must be the same bits), the default (a model that does
// not override it) samples its host logits, and a decoder whose decode steps replay captured
// graphs (the recording backend) samples from the graph's logits. Greedy and filtered sampling
// rows, several seeds and positions, prefill chunks that do not sample and empty steps.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "arch/model.h"
#include "common/recording_backend.h"
#include "common/tiny_model.h"
#include "compute/backend.h"
#include "core/error.h"
#include "engine/sampler.h"
#include "engine/sampling_params.h"
#include "model/checkpoint.h"
#include "model/make_model.h"
#include "model/model_spec.h"

namespace shardlm {
namespace {

std::string model_dir(const std::string& config) { return test::tiny_model_dir(config, DType::F32, 11); }

// Forwards forward() to a decoder and nothing else, so that Model's default begin_step,
// end_step and end_step_sampled run (logits to the host, then the host Sampler).
class HostSampled final : public Model {
 public:
  explicit HostSampled(Model& inner) : inner_(inner) {}
  const ModelSpec& spec() const override { return inner_.spec(); }
  const ShardPlan& shard() const override { return inner_.shard(); }
  int32_t allocate_kv_cache(int64_t budget_bytes, int64_t block_size, int64_t max_blocks,
                            DType dtype = DType::F32) override {
    return inner_.allocate_kv_cache(budget_bytes, block_size, max_blocks, dtype);
  }
  int64_t kv_blocks_fitting(int64_t budget_bytes, int64_t block_size, DType dtype) const override {
    return inner_.kv_blocks_fitting(budget_bytes, block_size, dtype);
  }
  void release_kv_cache() override { inner_.release_kv_cache(); }
  void forward(const ForwardBatch& batch, float* logits) override { inner_.forward(batch, logits); }
  size_t load_bytes() const override { return inner_.load_bytes(); }
  double load_seconds() const override { return inner_.load_seconds(); }

 private:
  Model& inner_;
};

constexpr int64_t kBlockSize = 4, kBlocksPerSeq = 16;

struct Seq {
  std::vector<int32_t> tokens;
  std::vector<int32_t> table;
  SamplingParams params;
};

// Greedy and filtered settings; each sequence gets one, with its own seed.
std::vector<Seq> make_seqs(int n) {
  const SamplingParams base;
  std::vector<SamplingParams> settings(6, base);
  settings[1].temperature = 0.8;
  settings[2].temperature = 1.0;
  settings[2].top_k = 5;
  settings[3].temperature = 1.2;
  settings[3].top_p = 0.9;
  settings[4].temperature = 0.7;
  settings[4].min_p = 0.05;
  settings[5].temperature = 1.0;
  settings[5].top_k = 40;
  settings[5].top_p = 0.95;
  settings[5].min_p = 0.01;
  std::vector<Seq> seqs(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    Seq& s = seqs[i];
    for (int64_t k = 0; k < 3 + 2 * i; ++k) s.tokens.push_back(static_cast<int32_t>((i * 41 + k * 13 + 5) % 500));
    for (int64_t b = 0; b < kBlocksPerSeq; ++b) s.table.push_back(static_cast<int32_t>(i * kBlocksPerSeq + b));
    s.params = settings[static_cast<size_t>(i) % settings.size()];
    s.params.seed = 1000 + 7 * static_cast<uint64_t>(i);
  }
  return seqs;
}

// The first step prefills every prompt but its last token (rows that do not sample: the chunks
// want no logits), the next takes the last prompt token of each, then one decode token each.
ForwardBatch next_batch(const std::vector<Seq>& seqs, int step) {
  ForwardBatch b;
  b.clear();
  for (const Seq& s : seqs) {
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    if (step == 0) {
      b.add_chunk(s.tokens.data(), 0, n - 1, s.table, kBlockSize, false);
    } else {
      b.add_chunk(s.tokens.data(), n - 1, 1, s.table, kBlockSize, true);
    }
  }
  return b;
}

// The reference: logits to the host, then the host Sampler with the sequence's params.
void reference_step(Model& m, const std::vector<Seq>& seqs, const ForwardBatch& batch, std::vector<Sample>* out) {
  const int64_t V = m.spec().vocab_size;
  std::vector<float> logits(batch.logit_rows.size() * static_cast<size_t>(V));
  m.begin_step(batch);
  m.end_step(logits.data());
  Sampler sampler;
  out->clear();
  for (size_t r = 0; r < batch.logit_rows.size(); ++r) {
    const Seq& s = seqs[r];
    out->push_back(sampler.sample(logits.data() + static_cast<int64_t>(r) * V, V, s.params,
                                  static_cast<int64_t>(s.tokens.size())));
  }
}

ForwardBatch with_sample_rows(const std::vector<Seq>& seqs, ForwardBatch batch) {
  for (size_t r = 0; r < batch.logit_rows.size(); ++r)
    batch.sample_rows.push_back(sample_row(seqs[r].params, static_cast<int64_t>(seqs[r].tokens.size())));
  return batch;
}

void sampled_step(Model& m, const std::vector<Seq>& seqs, const ForwardBatch& batch, std::vector<int32_t>* tokens,
                  std::vector<float>* logprobs) {
  m.begin_step(with_sample_rows(seqs, batch));
  StepChoices c;
  m.end_step_sampled(&c);
  *tokens = c.tokens;
  *logprobs = c.logprobs;
}

// Runs `steps` steps on the reference and on each model under test; every step's choices must be
// the reference's, bit for bit. The sequences grow by the chosen tokens.
void expect_same_choices(Model& ref, const std::vector<Model*>& tested, int n_seqs, int steps,
                         const std::string& what) {
  for (Model* m : tested) m->allocate_kv_cache(64LL << 20, kBlockSize, n_seqs * kBlocksPerSeq);
  ref.allocate_kv_cache(64LL << 20, kBlockSize, n_seqs * kBlocksPerSeq);
  std::vector<Seq> seqs = make_seqs(n_seqs);
  int sampled_rows = 0;
  for (int step = 0; step < steps; ++step) {
    const ForwardBatch batch = next_batch(seqs, step);
    std::vector<Sample> want;
    reference_step(ref, seqs, batch, &want);
    for (size_t i = 0; i < tested.size(); ++i) {
      std::vector<int32_t> tokens(3, -7);  // stale contents must be replaced
      std::vector<float> logprobs(5, 1.0f);
      sampled_step(*tested[i], seqs, batch, &tokens, &logprobs);
      ASSERT_EQ(tokens.size(), want.size()) << what << " model " << i << " step " << step;
      ASSERT_EQ(logprobs.size(), want.size()) << what << " model " << i << " step " << step;
      for (size_t r = 0; r < want.size(); ++r) {
        EXPECT_EQ(tokens[r], want[r].token) << what << " model " << i << " step " << step << " row " << r;
        EXPECT_EQ(std::memcmp(&logprobs[r], &want[r].logprob, sizeof(float)), 0)
            << what << " model " << i << " step " << step << " row " << r << ": " << logprobs[r] << " vs "
            << want[r].logprob;
      }
    }
    if (step > 0) {
      for (size_t r = 0; r < want.size(); ++r) seqs[r].tokens.push_back(want[r].token);
      sampled_rows += static_cast<int>(want.size());
    }
  }
  EXPECT_EQ(sampled_rows, n_seqs * (steps - 1)) << what;
}

class SampledSteps : public ::testing::TestWithParam<const char*> {};

// The decoder on the CPU backend (ComputeBackend::sample) and Model's default, against the host
// path; dense, MoE and MLA models.
TEST_P(SampledSteps, SameChoicesAsHostSampler) {
  const std::string dir = model_dir(GetParam());
  const ModelSpec spec = ModelSpec::load(dir);
  auto ckpt = Checkpoint::open(dir);
  auto backend = make_backend("cpu");
  auto ref = build_model(spec, *ckpt, *backend);
  auto device = build_model(spec, *ckpt, *backend);
  auto inner = build_model(spec, *ckpt, *backend);
  HostSampled host(*inner);
  expect_same_choices(*ref, {device.get(), &host}, 6, 8, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Models, SampledSteps,
                         ::testing::Values("tiny-llama", "tiny-qwen2", "tiny-qwen3-moe", "tiny-deepseek-v3"));

// Decode steps replayed from captured graphs sample from the graph's logits slot.
TEST(SampledSteps, GraphStepsSampleTheGraphsLogits) {
  const std::string dir = model_dir("tiny-llama");
  const ModelSpec spec = ModelSpec::load(dir);
  auto ckpt = Checkpoint::open(dir);
  auto cpu = make_backend("cpu");
  test::RecordingBackend rec;
  auto ref = build_model(spec, *ckpt, *cpu);
  auto graphed = build_model(spec, *ckpt, rec);
  ASSERT_EQ(graphed->enable_step_graphs(), "");
  expect_same_choices(*ref, {graphed.get()}, 5, 6, "graphs");
  EXPECT_GE(rec.captures(), 1);
  EXPECT_GT(rec.replays(), 0);
}

// A step without tokens (or whose chunks all skip sampling) ends with no choices; sample rows
// must match the logit rows, and each step is ended the way it was begun. The decoder and
// Model's default alike.
TEST(SampledSteps, StepsWithoutRowsGiveNoChoices) {
  const std::string dir = model_dir("tiny-llama");
  const ModelSpec spec = ModelSpec::load(dir);
  auto ckpt = Checkpoint::open(dir);
  auto backend = make_backend("cpu");
  auto decoder = build_model(spec, *ckpt, *backend);
  auto inner = build_model(spec, *ckpt, *backend);
  HostSampled host(*inner);
  for (Model* model : {decoder.get(), static_cast<Model*>(&host)}) {
    model->allocate_kv_cache(16LL << 20, kBlockSize, kBlocksPerSeq);
    StepChoices c;
    c.resize(2, 0);
    const std::vector<int32_t>& tokens = c.tokens;
    const std::vector<float>& logprobs = c.logprobs;
    ForwardBatch empty;
    empty.clear();
    model->begin_step(empty);
    model->end_step_sampled(&c);
    EXPECT_TRUE(tokens.empty());
    EXPECT_TRUE(logprobs.empty());
    std::vector<Seq> seqs = make_seqs(1);
    model->begin_step(next_batch(seqs, 0));
    model->end_step_sampled(&c);
    EXPECT_TRUE(tokens.empty());
    // Sample rows must match the step's logit rows.
    ForwardBatch two_rows = with_sample_rows(seqs, next_batch(seqs, 1));
    two_rows.sample_rows.push_back(two_rows.sample_rows[0]);
    EXPECT_THROW(model->begin_step(two_rows), Error);
    // A step begun without sample rows has no choices to give, and one begun with them no logits.
    std::vector<float> logits(static_cast<size_t>(spec.vocab_size));
    model->begin_step(next_batch(seqs, 1));
    EXPECT_THROW(model->end_step_sampled(&c), Error);
    model->begin_step(with_sample_rows(seqs, next_batch(seqs, 1)));
    if (model == decoder.get()) {
      EXPECT_THROW(model->end_step(logits.data()), Error);
    } else {
      model->end_step_sampled(&c);
      EXPECT_EQ(tokens.size(), 1u);
    }
  }
}

}  // namespace
}  // namespace shardlm
