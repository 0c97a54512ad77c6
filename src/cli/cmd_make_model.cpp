// shardlm make-model: a random-weight Hugging Face model directory from a config of
// inputs/models/ (tiny-llama: the demo job's default model; the tests' and benchmarks' others).
#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>

#include "cli/commands.h"
#include "cli/subcommand.h"
#include "core/error.h"
#include "model/make_model.h"

namespace po = boost::program_options;

namespace shardlm {

int cmd_make_model(int argc, char** argv) {
  MakeModelOptions o;
  std::string dtype = "bf16";
  po::options_description d("shardlm make-model options");
  // clang-format off
  d.add_options()
    ("config", po::value(&o.config_path), "Hugging Face style config.json (see inputs/models/)")
    ("out", po::value(&o.out_dir), "output directory")
    ("dtype", po::value(&dtype)->default_value(dtype), "weight dtype: bf16|fp32|fp8 (fp8: projections in F8_E4M3 with 128x128 block scales, the rest bf16)")
    ("seed", po::value(&o.seed)->default_value(o.seed), "random seed (same seed, same bytes)")
    ;
  // clang-format on
  po::variables_map vm;
  if (!parse_subcommand(argc, argv, "make-model", "shardlm make-model --config inputs/models/X.json --out DIR [--dtype bf16|fp32|fp8] [--seed S]", d, &vm)) return 0;
  SHARDLM_CHECK(!o.config_path.empty() && !o.out_dir.empty(), "shardlm make-model: --config and --out are required");
  o.dtype = parse_make_model_dtype(dtype);
  make_model(o);
  std::fprintf(stderr, "[shardlm] wrote %s\n", o.out_dir.c_str());
  return 0;
}

}  // namespace shardlm
