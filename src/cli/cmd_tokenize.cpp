// shardlm tokenize: check how a prompt tokenises (or what ids decode to).
#include <boost/program_options.hpp>
#include <iostream>
#include <sstream>

#include "cli/commands.h"
#include "cli/subcommand.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace po = boost::program_options;

namespace shardlm {

int cmd_tokenize(int argc, char** argv) {
  std::string model, text, decode;
  bool bos = false, specials = false;
  po::options_description d("shardlm tokenize options");
  d.add_options()("model", po::value(&model),
                  "directory holding tokenizer.json or tiktoken.model (and tokenizer_config.json)")(
      "text", po::value(&text), "text to encode; ids are printed separated by spaces")(
      "bos", po::bool_switch(&bos), "prepend BOS when the tokenizer config asks for one")(
      "decode", po::value(&decode), "space-separated ids to decode instead")(
      "keep-special", po::bool_switch(&specials), "keep special tokens in decoded text");
  po::variables_map vm;
  if (!parse_subcommand(argc, argv, "tokenize", "shardlm tokenize --model DIR (--text TEXT | --decode \"IDS\")", d, &vm)) return 0;
  SHARDLM_CHECK(!model.empty(), "shardlm tokenize: --model is required");
  SHARDLM_CHECK(vm.count("text") || vm.count("decode"), "shardlm tokenize: give --text or --decode");
  std::unique_ptr<Tokenizer> tok = Tokenizer::load(model);
  if (vm.count("decode")) {
    std::vector<int32_t> ids;
    std::istringstream in(decode);
    std::string w;
    while (in >> w) {
      size_t used = 0;
      long long v = 0;
      try {
        v = std::stoll(w, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      SHARDLM_CHECK(used == w.size() && v >= 0 && v < tok->vocab_size(),
                    "shardlm tokenize: '" << w << "' is not a token id in [0, " << tok->vocab_size() << ")");
      ids.push_back(static_cast<int32_t>(v));
    }
    std::cout << tok->decode(ids, !specials) << "\n";
    return 0;
  }
  std::vector<int32_t> ids;
  if (bos) {
    if (auto b = tok->bos_to_prepend()) ids.push_back(*b);
  }
  std::vector<int32_t> body = tok->encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
  std::cout << "\n";
  return 0;
}

}  // namespace shardlm
