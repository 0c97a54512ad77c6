// The JSON files beside a tokenizer that both loaders read: tokenizer_config.json (BOS / EOS,
// add_bos_token, added_tokens_decoder), generation_config.json and config.json (eos_token_id).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/added_tokens.h"

namespace shardlm::tok {

// Parses PATH as JSON; throws Error "PATH: malformed JSON: ..." when it is not.
nlohmann::json read_json(const std::filesystem::path& path);
// read_json, or nullopt when PATH does not exist.
std::optional<nlohmann::json> read_optional_json(const std::filesystem::path& path);

// j[key] when it is a boolean, else dflt.
bool bool_field(const nlohmann::json& j, const char* key, bool dflt);

// One added-token object ({"content": ..., "special": ..., "lstrip": ..., ...}) given id `id`;
// `where` names the list it came from in the error for a malformed entry.
AddedToken parse_added_token(const nlohmann::json& a, int64_t id, const std::string& file, const std::string& where);

struct TokenizerConfigFiles {
  std::optional<nlohmann::json> tokenizer_config;  // DIR/tokenizer_config.json
  std::optional<nlohmann::json> generation_config;  // DIR/generation_config.json
  std::optional<nlohmann::json> model_config;       // DIR/config.json, read only without generation_config
  std::string tokenizer_config_name;                // path of tokenizer_config.json, for errors
};

TokenizerConfigFiles read_tokenizer_config_files(const std::filesystem::path& dir);

struct SpecialIds {
  std::optional<int32_t> bos;  // to prepend, or nullopt
  std::vector<int32_t> eos;
};

// BOS: tokenizer_config's add_bos_token decides (bos_token then must resolve); without it,
// default_bos. EOS: tokenizer_config's eos_token, then generation_config / config eos_token_id.
// token_to_id resolves token strings; a name that does not resolve is an error naming the config.
SpecialIds resolve_special_ids(const TokenizerConfigFiles& files,
                               const std::function<std::optional<int32_t>(const std::string&)>& token_to_id,
                               std::optional<int32_t> default_bos);

}  // namespace shardlm::tok
