#include "tokenizer/tokenizer_config.h"

#include "core/error.h"
#include "core/file_util.h"

namespace shardlm::tok {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// "bos_token": "<s>" or {"content": "<s>", ...} or null.
std::optional<std::string> token_content(const json& cfg, const char* key) {
  if (!cfg.contains(key)) return std::nullopt;
  const auto& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

void add_eos_ids(const json& v, std::vector<int32_t>& eos) {
  auto add = [&](const json& x) {
    if (!x.is_number_integer()) return;
    auto id = x.get<int32_t>();
    for (int32_t e : eos)
      if (e == id) return;
    eos.push_back(id);
  };
  if (v.is_array()) {
    for (const auto& x : v) add(x);
  } else {
    add(v);
  }
}

}  // namespace

json read_json(const fs::path& path) {
  const std::string text = read_file(path.string());
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    SHARDLM_FAIL(path.string() << ": malformed JSON: " << e.what());
  }
}

std::optional<json> read_optional_json(const fs::path& path) {
  if (!fs::exists(path)) return std::nullopt;
  return read_json(path);
}

bool bool_field(const json& j, const char* key, bool dflt) {
  return j.contains(key) && j[key].is_boolean() ? j[key].get<bool>() : dflt;
}

AddedToken parse_added_token(const json& a, int64_t id, const std::string& file, const std::string& where) {
  SHARDLM_CHECK(a.is_object() && id >= 0 && id < (int64_t{1} << 30) && a.contains("content") &&
                    a["content"].is_string(),
                file << ": malformed entry in " << where);
  AddedToken t;
  t.id = static_cast<int32_t>(id);
  t.content = a["content"].get<std::string>();
  t.special = bool_field(a, "special", false);
  t.lstrip = bool_field(a, "lstrip", false);
  t.rstrip = bool_field(a, "rstrip", false);
  t.single_word = bool_field(a, "single_word", false);
  t.normalized = bool_field(a, "normalized", !t.special);
  return t;
}

TokenizerConfigFiles read_tokenizer_config_files(const fs::path& dir) {
  TokenizerConfigFiles f;
  f.tokenizer_config_name = (dir / "tokenizer_config.json").string();
  f.tokenizer_config = read_optional_json(f.tokenizer_config_name);
  f.generation_config = read_optional_json(dir / "generation_config.json");
  if (!f.generation_config) f.model_config = read_optional_json(dir / "config.json");
  return f;
}

SpecialIds resolve_special_ids(const TokenizerConfigFiles& files,
                               const std::function<std::optional<int32_t>(const std::string&)>& token_to_id,
                               std::optional<int32_t> default_bos) {
  SpecialIds ids;
  const auto& cfg = files.tokenizer_config;
  const std::string& cfg_name = files.tokenizer_config_name;
  if (cfg && cfg->contains("add_bos_token") && (*cfg)["add_bos_token"].is_boolean()) {
    if ((*cfg)["add_bos_token"].get<bool>()) {
      auto content = token_content(*cfg, "bos_token");
      SHARDLM_CHECK(content.has_value(), cfg_name << ": add_bos_token is true but bos_token is missing");
      ids.bos = token_to_id(*content);
      SHARDLM_CHECK(ids.bos.has_value(), cfg_name << ": bos_token \"" << *content << "\" is not in the vocabulary");
    }
  } else {
    ids.bos = default_bos;
  }

  if (cfg) {
    if (auto content = token_content(*cfg, "eos_token")) {
      auto id = token_to_id(*content);
      SHARDLM_CHECK(id.has_value(), cfg_name << ": eos_token \"" << *content << "\" is not in the vocabulary");
      ids.eos.push_back(*id);
    }
  }
  const auto& gen = files.generation_config;
  const auto& model_cfg = files.model_config;
  if (gen && gen->is_object() && gen->contains("eos_token_id")) add_eos_ids((*gen)["eos_token_id"], ids.eos);
  if (model_cfg && model_cfg->is_object() && model_cfg->contains("eos_token_id"))
    add_eos_ids((*model_cfg)["eos_token_id"], ids.eos);
  return ids;
}

}  // namespace shardlm::tok
