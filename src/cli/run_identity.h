// What decides a run's outputs besides its prompts: the model (its config.json's hash) and the
// settings that choose the tokens (the prompt format, sampling, limits, stop strings; a context
// limit only where both asked for one). A file that a run resumes, and the inputs of a merge, must
// agree on them: one file would otherwise hold two runs' outputs under the config of one. The
// layout, the backend and the cache dtype may change (a requeue onto other nodes); they move
// logprobs in the last bits, not what was asked.
#pragma once

#include <string>
#include <vector>

namespace shardlm {

// One line per output-deciding setting on which two recorded runs differ, e.g.
// "temperature = 0 vs 0.7". config_*: the runs' recorded options (to_ini's text; keys missing from
// either, as in files from older versions, are not compared); hash_*: their model_config_hash
// ("" when unknown).
// The --max-model-len a recorded config asked for; 0 for none (or a config without the key).
int64_t recorded_max_model_len(const std::string& config);

std::vector<std::string> output_differences(const std::string& config_a, const std::string& hash_a,
                                            const std::string& config_b, const std::string& hash_b);

}  // namespace shardlm
