// load_tokenizer_json: reads DIR/tokenizer.json (+ tokenizer_config.json, generation_config.json,
// config.json when present) and builds an HfTokenizer.
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_util.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/tokenizer_config.h"
#include "tokenizer/tokenizer_json_sax.h"

namespace shardlm::tok {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::vector<AddedToken> parse_added(const json& root, const std::string& file) {
  std::vector<AddedToken> out;
  if (!root.contains("added_tokens") || root["added_tokens"].is_null()) return out;
  SHARDLM_CHECK(root["added_tokens"].is_array(), file << ": \"added_tokens\" must be an array");
  for (const auto& a : root["added_tokens"]) {
    SHARDLM_CHECK(a.is_object() && a.contains("id") && a["id"].is_number_integer(),
                  file << ": malformed entry in \"added_tokens\"");
    out.push_back(parse_added_token(a, a["id"].get<int64_t>(), file, "\"added_tokens\""));
  }
  return out;
}

// First SpecialToken of a TemplateProcessing "single" template (searching a Sequence processor).
std::optional<int32_t> template_bos(const json& pp, const HfTokenizer& tk) {
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

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer_json(const fs::path& dir, const fs::path& file) {
  const std::string fname = file.string();
  std::string text = read_file(fname);
  auto data = parse_tokenizer_json(text, fname);
  text.clear();
  const json& root = data.root;
  SHARDLM_CHECK(root.is_object(), fname << ": top level must be a JSON object");
  SHARDLM_CHECK(root.contains("model"), fname << ": no \"model\"");

  HfTokenizerParts parts;
  parts.model = BpeModel::build(root["model"], data.vocab ? &*data.vocab : nullptr,
                                data.merges ? &*data.merges : nullptr, fname);
  parts.normalizer = make_normalizer(root.value("normalizer", json()), fname);
  parts.pretokenizer = make_pretokenizer(root.value("pre_tokenizer", json()), fname);
  parts.decoder = std::make_unique<Decoder>(root.value("decoder", json()), fname);
  parts.added = parse_added(root, fname);
  const json post = root.value("post_processor", json());

  const auto files = read_tokenizer_config_files(dir);
  auto tk = std::make_unique<HfTokenizer>(std::move(parts));
  // BOS without add_bos_token: a TemplateProcessing post-processor whose single template starts
  // with a special token.
  auto ids = resolve_special_ids(
      files, [&](const std::string& t) { return tk->token_to_id(t); }, template_bos(post, *tk));
  tk->set_special_ids(ids.bos, std::move(ids.eos));
  return tk;
}

}  // namespace shardlm::tok
