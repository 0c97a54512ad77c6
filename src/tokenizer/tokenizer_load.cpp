// Tokenizer::load: the one place that picks a Tokenizer implementation for a directory.
#include <filesystem>

#include "core/error.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/tiktoken_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace shardlm {

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& dir_or_file) {
  namespace fs = std::filesystem;
  fs::path dir = dir_or_file, file = dir / "tokenizer.json";
  if (fs::is_regular_file(dir)) {
    file = dir;
    dir = dir.parent_path();
  }
  if (fs::exists(file)) return tok::load_tokenizer_json(dir, file);
  if (fs::exists(dir / "tiktoken.model")) return tok::load_tiktoken(dir);
  SHARDLM_FAIL("tokenizer file " << file.string() << " does not exist (nor " << (dir / "tiktoken.model").string()
                                 << ")");
}

}  // namespace shardlm
