#include "cli/run_identity.h"

#include <algorithm>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

namespace shardlm {
namespace {

// The options of to_ini that decide which tokens a prompt gets.
// clang-format off
constexpr const char* kOutputKeys[] = {"format", "max-new-tokens", "temperature", "top-p", "top-k", "min-p",
                                       "repetition-penalty", "frequency-penalty", "presence-penalty", "seed", "stop",
                                       "ignore-eos"};
// clang-format on

// key -> its values in order ("stop" repeats), from "key = value" lines; a JSON-quoted value (a
// stop string, as to_ini writes it now) decoded, so that older files' plain ones compare equal.
std::map<std::string, std::vector<std::string>> ini_values(const std::string& text) {
  std::map<std::string, std::vector<std::string>> v;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find(" = ");
    if (eq == std::string::npos) continue;
    std::string value = line.substr(eq + 3);
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') {
      try {
        value = nlohmann::json::parse(value).get<std::string>();
      } catch (const nlohmann::json::exception&) {
      }
    }
    v[line.substr(0, eq)].push_back(std::move(value));
  }
  return v;
}

std::string joined(const std::vector<std::string>& values) {
  if (values.empty()) return "(none)";
  std::string s;
  for (const std::string& x : values) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

int64_t recorded_max_model_len(const std::string& config) {
  const auto v = ini_values(config);
  const auto it = v.find("max-model-len");
  if (it == v.end() || it->second.size() != 1) return 0;
  try {
    return std::max<int64_t>(0, std::stoll(it->second[0]));
  } catch (const std::exception&) {
    return 0;
  }
}

std::vector<std::string> output_differences(const std::string& config_a, const std::string& hash_a,
                                            const std::string& config_b, const std::string& hash_b) {
  std::vector<std::string> diff;
  if (!hash_a.empty() && !hash_b.empty() && hash_a != hash_b)
    diff.push_back("model_config_hash = " + hash_a + " vs " + hash_b);
  const auto a = ini_values(config_a), b = ini_values(config_b);
  // Known only where both runs recorded their options (stop, which may be absent, with them).
  if (a.count("temperature") == 0 || b.count("temperature") == 0) return diff;
  for (const char* key : kOutputKeys) {
    const auto ia = a.find(key), ib = b.find(key);
    const std::vector<std::string> none;
    const std::vector<std::string>& va = ia == a.end() ? none : ia->second;
    const std::vector<std::string>& vb = ib == b.end() ? none : ib->second;
    if (va != vb) diff.push_back(std::string(key) + " = " + joined(va) + " vs " + joined(vb));
  }
  // A context limit, where both runs asked for one (0 and older files: none asked for; the limit
  // their caches set is not a setting, cli/context_limit.h).
  const int64_t la = recorded_max_model_len(config_a), lb = recorded_max_model_len(config_b);
  if (la > 0 && lb > 0 && la != lb)
    diff.push_back("max-model-len = " + std::to_string(la) + " vs " + std::to_string(lb));
  return diff;
}

}  // namespace shardlm
