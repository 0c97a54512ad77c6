// Tokenizer::load: reads DIR/tokenizer.json (+ tokenizer_config.json, generation_config.json,
// config.json when present) and builds an HfTokenizer.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/file_util.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/tokenizer_json_sax.h"
#include "tokenizer/tokenizer.h"

namespace shardlm {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

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

// "bos_token": "<s>" or {"content": "<s>", ...} or null.
std::optional<std::string> token_content(const json& cfg, const char* key) {
  if (!cfg.contains(key)) return std::nullopt;
  const auto& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

bool bool_field(const json& j, const char* key, bool dflt) {
  return j.contains(key) && j[key].is_boolean() ? j[key].get<bool>() : dflt;
}

std::vector<tok::AddedToken> parse_added(const json& root, const std::string& file) {
  std::vector<tok::AddedToken> out;
  if (!root.contains("added_tokens") || root["added_tokens"].is_null()) return out;
  SHARDLM_CHECK(root["added_tokens"].is_array(), file << ": \"added_tokens\" must be an array");
  for (const auto& a : root["added_tokens"]) {
    SHARDLM_CHECK(a.is_object() && a.contains("id") && a["id"].is_number_integer() && a["id"].get<int64_t>() >= 0 &&
                      a["id"].get<int64_t>() < (int64_t{1} << 30) && a.contains("content") && a["content"].is_string(),
                  file << ": malformed entry in \"added_tokens\"");
    tok::AddedToken t;
    t.id = static_cast<int32_t>(a["id"].get<int64_t>());
    t.content = a["content"].get<std::string>();
    t.special = bool_field(a, "special", false);
    t.lstrip = bool_field(a, "lstrip", false);
    t.rstrip = bool_field(a, "rstrip", false);
    t.single_word = bool_field(a, "single_word", false);
    t.normalized = bool_field(a, "normalized", !t.special);
    out.push_back(std::move(t));
  }
  return out;
}

// First SpecialToken of a TemplateProcessing "single" template (searching a Sequence processor).
std::optional<int32_t> template_bos(const json& pp, const tok::HfTokenizer& tk) {
  if (!pp.is_object() || !pp.contains("type") || !pp["type"].is_string()) return std::nullopt;
  const std::string type = pp["type"].get<std::string>();
  if (type == "Sequence" && pp.contains("processors") && pp["processors"].is_array()) {
    for (const auto& sub : pp["processors"])
      if (auto b = template_bos(sub, tk)) return b;
    return std::nullopt;
  }
  if (type != "TemplateProcessing" || !pp.contains("single") || !pp["single"].is_array() || pp["single"].empty())
    return std::nullopt;
  const auto& first = pp["single"][0];
  if (!first.is_object() || !first.contains("SpecialToken")) return std::nullopt;
  const auto& st = first["SpecialToken"];
  if (!st.contains("id") || !st["id"].is_string()) return std::nullopt;
  const std::string name = st["id"].get<std::string>();
  if (pp.contains("special_tokens") && pp["special_tokens"].contains(name)) {
    const auto& ids = pp["special_tokens"][name].value("ids", json::array());
    if (ids.is_array() && !ids.empty() && ids[0].is_number_integer()) return ids[0].get<int32_t>();
  }
  return tk.token_to_id(name);
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

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& dir_or_file) {
  fs::path dir = dir_or_file, file = dir / "tokenizer.json";
  if (fs::is_regular_file(dir)) {
    file = dir;
    dir = dir.parent_path();
  }
  const std::string fname = file.string();
  SHARDLM_CHECK(fs::exists(file), "tokenizer file " << fname << " does not exist");
  std::string text = read_file(fname);
  auto data = tok::parse_tokenizer_json(text, fname);
  text.clear();
  const json& root = data.root;
  SHARDLM_CHECK(root.is_object(), fname << ": top level must be a JSON object");
  SHARDLM_CHECK(root.contains("model"), fname << ": no \"model\"");

  tok::HfTokenizerParts parts;
  parts.model = tok::BpeModel::build(root["model"], data.vocab ? &*data.vocab : nullptr,
                                     data.merges ? &*data.merges : nullptr, fname);
  parts.normalizer = tok::make_normalizer(root.value("normalizer", json()), fname);
  parts.pretokenizer = tok::make_pretokenizer(root.value("pre_tokenizer", json()), fname);
  parts.decoder = std::make_unique<tok::Decoder>(root.value("decoder", json()), fname);
  parts.added = parse_added(root, fname);
  const json post = root.value("post_processor", json());

  const auto cfg = read_optional_json(dir / "tokenizer_config.json");
  const auto gen = read_optional_json(dir / "generation_config.json");
  std::optional<json> model_cfg;
  if (!gen) model_cfg = read_optional_json(dir / "config.json");

  auto tk = std::make_unique<tok::HfTokenizer>(std::move(parts));
  const std::string cfg_name = (dir / "tokenizer_config.json").string();

  // BOS: tokenizer_config add_bos_token decides; without it, a TemplateProcessing post-processor
  // whose single template starts with a special token.
  std::optional<int32_t> bos;
  if (cfg && cfg->contains("add_bos_token") && (*cfg)["add_bos_token"].is_boolean()) {
    if ((*cfg)["add_bos_token"].get<bool>()) {
      auto content = token_content(*cfg, "bos_token");
      SHARDLM_CHECK(content.has_value(), cfg_name << ": add_bos_token is true but bos_token is missing");
      bos = tk->token_to_id(*content);
      SHARDLM_CHECK(bos.has_value(), cfg_name << ": bos_token \"" << *content << "\" is not in the vocabulary");
    }
  } else {
    bos = template_bos(post, *tk);
  }

  std::vector<int32_t> eos;
  if (cfg) {
    if (auto content = token_content(*cfg, "eos_token")) {
      auto id = tk->token_to_id(*content);
      SHARDLM_CHECK(id.has_value(), cfg_name << ": eos_token \"" << *content << "\" is not in the vocabulary");
      eos.push_back(*id);
    }
  }
  if (gen && gen->is_object() && gen->contains("eos_token_id")) add_eos_ids((*gen)["eos_token_id"], eos);
  if (model_cfg && model_cfg->is_object() && model_cfg->contains("eos_token_id"))
    add_eos_ids((*model_cfg)["eos_token_id"], eos);

  tk->set_special_ids(bos, std::move(eos));
  return tk;
}

}  // namespace shardlm
