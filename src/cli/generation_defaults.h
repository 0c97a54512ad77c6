// --generation-config auto: the sampling defaults a model ships in generation_config.json, taken as
// vLLM takes them (its --generation-config auto, the default there): temperature, top_p, top_k,
// min_p, repetition_penalty and max_new_tokens become the run's defaults where neither the
// command line nor the job file sets that option; a request's own fields still win.
#pragma once

#include <set>
#include <string>

namespace shardlm {

struct RunOptions;

// Applies MODEL/generation_config.json's sampling fields to OPT (whose `given` names the options set
// explicitly) when opt->generation_config is "auto"; a missing file changes nothing. Sets
// opt->generation_config_taken (what it took) and opt->generation_config_not_applied (the
// presence and frequency penalties it asks for, which vLLM does not read from it), each "" when
// there is none. Throws Error naming the file and field on a malformed value.
void apply_generation_config(RunOptions* opt);

}  // namespace shardlm
