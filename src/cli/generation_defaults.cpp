#include "cli/generation_defaults.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/run_options.h"
#include "core/error.h"

namespace shardlm {

namespace {

using json = nlohmann::json;

double number(const json& j, const char* key, const std::string& file) {
  SHARDLM_CHECK(j[key].is_number(), file << ": field '" << key << "' must be a number, got " << j[key].dump());
  return j[key].get<double>();
}

int64_t integer(const json& j, const char* key, const std::string& file) {
  SHARDLM_CHECK(j[key].is_number_integer(),
                file << ": field '" << key << "' must be an integer, got " << j[key].dump());
  return j[key].get<int64_t>();
}

}  // namespace

void apply_generation_config(RunOptions* opt) {
  if (opt->generation_config == "none") return;
  SHARDLM_CHECK(opt->generation_config == "auto",
                "--generation-config must be auto or none, not '" << opt->generation_config << "'");
  const std::string file = (std::filesystem::path(opt->model) / "generation_config.json").string();
  std::ifstream in(file);
  if (!in) return;
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    SHARDLM_FAIL(file << ": not valid JSON: " << e.what());
  }
  SHARDLM_CHECK(j.is_object(), file << ": not a JSON object");
  std::ostringstream taken, ignored;
  // The fields vLLM reads (get_diff_sampling_param), each where the run does not set its option.
  const auto take = [&](const char* key, const char* option, auto* target, auto read) {
    if (!j.contains(key) || j[key].is_null() || opt->given.count(option)) return;
    *target = read(j, key, file);
    taken << (taken.tellp() > 0 ? ", " : "") << option << " " << j[key].dump();
  };
  take("temperature", "temperature", &opt->temperature, number);
  take("top_p", "top-p", &opt->top_p, number);
  take("top_k", "top-k", &opt->top_k, integer);
  take("min_p", "min-p", &opt->min_p, number);
  take("repetition_penalty", "repetition-penalty", &opt->repetition_penalty, number);
  take("max_new_tokens", "max-new-tokens", &opt->max_new_tokens, integer);
  // Penalties vLLM does not take from the file either (not generation-config fields of
  // transformers): said, not silently dropped.
  for (const char* key : {"presence_penalty", "frequency_penalty"}) {
    if (j.contains(key) && j[key].is_number() && j[key].get<double>() != 0.0)
      ignored << (ignored.tellp() > 0 ? ", " : "") << key << " " << j[key].dump();
  }
  if (taken.tellp() > 0)
    opt->generation_config_taken =
        "sampling defaults from " + file + ": " + taken.str() + " (--generation-config auto)";
  if (ignored.tellp() > 0)
    opt->generation_config_not_applied = file + " asks for " + ignored.str() +
                                         ", which is not read from it (as in vLLM): give --" +
                                         "presence-penalty / --frequency-penalty or the request fields";
}

}  // namespace shardlm
