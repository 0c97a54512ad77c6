// Runs the engine in-process on a model directory with requests given as a vector.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "arch/model.h"
#include "compute/backend.h"
#include "engine/engine.h"
#include "model/checkpoint.h"
#include "model/model_spec.h"
#include "tokenizer/tokenizer.h"

namespace shardlm::test {

class VectorSource final : public RequestSource {
 public:
  explicit VectorSource(std::vector<ParsedRequest> reqs) : reqs_(std::move(reqs)) {}
  std::optional<ParsedRequest> next() override {
    if (i_ >= reqs_.size()) return std::nullopt;
    return reqs_[i_++];
  }

 private:
  std::vector<ParsedRequest> reqs_;
  size_t i_ = 0;
};

class CollectSink final : public ResultSink {
 public:
  void on_result(const RequestResult& r) override { results.push_back(r); }
  void on_step(const StepRecord& s) override { steps.push_back(s); }
  const RequestResult& by_id(const std::string& id) const {
    for (const auto& r : results) {
      if (r.id == id) return r;
    }
    throw std::runtime_error("no result for " + id);
  }
  std::vector<RequestResult> results;
  std::vector<StepRecord> steps;
  RunStats stats;  // what Engine::run returned
};

struct LoadedModel {
  explicit LoadedModel(const std::string& dir)
      : spec(ModelSpec::load(dir)),
        tok(Tokenizer::load(dir)),
        ckpt(Checkpoint::open(dir)),
        backend(make_backend("cpu")),
        model(build_model(spec, *ckpt, *backend)) {}

  CollectSink run(std::vector<ParsedRequest> reqs, EngineConfig cfg = {}) {
    cfg.progress_interval_s = 0;
    if (cfg.kv_cache_bytes == (4LL << 30)) cfg.kv_cache_bytes = 64LL << 20;
    Engine engine(*model, *tok, cfg);
    VectorSource src(std::move(reqs));
    CollectSink sink;
    sink.stats = engine.run(src, sink);
    return sink;
  }

  ModelSpec spec;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<Checkpoint> ckpt;
  std::unique_ptr<ComputeBackend> backend;
  std::unique_ptr<Model> model;
};

inline ParsedRequest ids_request(const std::string& id, std::vector<int32_t> ids, int64_t max_tokens) {
  ParsedRequest r;
  r.id = id;
  r.prompt_token_ids = std::move(ids);
  r.overrides.max_tokens = max_tokens;
  return r;
}

inline ParsedRequest text_request(const std::string& id, const std::string& text, int64_t max_tokens) {
  ParsedRequest r;
  r.id = id;
  r.prompt = text;
  r.overrides.max_tokens = max_tokens;
  return r;
}

}  // namespace shardlm::test
