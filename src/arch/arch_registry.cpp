#include <sstream>

#include "arch/decoder.h"
#include "arch/model.h"
#include "core/error.h"

namespace shardlm {

// One line per architecture. A new architecture is a new file with its builder plus a line here.
const std::vector<ArchEntry>& arch_registry() {
  static const std::vector<ArchEntry> kArchs = {
      {"LlamaForCausalLM", &build_decoder},
      {"MistralForCausalLM", &build_decoder},
      {"Qwen2ForCausalLM", &build_decoder},
      {"Qwen3ForCausalLM", &build_decoder},
      {"MixtralForCausalLM", &build_decoder},
      {"Qwen2MoeForCausalLM", &build_decoder},
      {"Qwen3MoeForCausalLM", &build_decoder},
      {"DeepseekV3ForCausalLM", &build_decoder},
  };
  return kArchs;
}

std::unique_ptr<Model> build_model(const ModelSpec& spec, const Checkpoint& ckpt, ComputeBackend& backend,
                                   const ShardPlan& plan, const ShardComms& comms) {
  const ShardPlan whole = plan.last_layer < 0 ? ShardPlan::make(spec) : plan;
  std::ostringstream known;
  for (const auto& e : arch_registry()) {
    if (spec.architecture == e.architecture) return e.build(spec, ckpt, backend, whole, comms);
    known << " " << e.architecture;
  }
  SHARDLM_FAIL("architecture '" << spec.architecture << "' is not supported; supported:" << known.str());
}

}  // namespace shardlm
