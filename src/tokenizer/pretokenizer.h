// Pre-tokenisers of tokenizer.json: ByteLevel, Split (regex or string), Metaspace, Sequence.
// A pre-tokeniser cuts one text segment into words that BPE encodes independently.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace shardlm::tok {

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits every piece of `pieces` in turn (in place). at_text_start: the segment begins the
  // whole input (Metaspace prepend_scheme "first").
  virtual void split(std::vector<std::string>& pieces, bool at_text_start) const = 0;
};

// nullptr for JSON null. Throws Error naming `file` for an unsupported type.
std::unique_ptr<PreTokenizer> make_pretokenizer(const nlohmann::json& j, const std::string& file);

// The GPT-2 word-splitting regex used by ByteLevel(use_regex=true).
extern const char* const kGpt2Pattern;

}  // namespace shardlm::tok
