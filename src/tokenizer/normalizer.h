// Normalisers of tokenizer.json: NFC/NFD/NFKC/NFKD (utf8proc), Lowercase, Prepend, Replace,
// Sequence. Input and output are valid UTF-8.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace shardlm::tok {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string normalize(std::string s) const = 0;
};

// Builds the normaliser described by j; nullptr for JSON null. Throws Error naming `file` for an
// unsupported type.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const std::string& file);

}  // namespace shardlm::tok
