#include "cli/subcommand.h"

#include <iostream>

#include "core/error.h"

namespace po = boost::program_options;

namespace shardlm {

bool parse_subcommand(int argc, char** argv, const char* command, const char* usage, po::options_description& d,
                      po::variables_map* vm) {
  d.add_options()("help,h", "show this help");
  try {
    po::store(po::command_line_parser(argc, argv).options(d).run(), *vm);
    if (vm->count("help")) {
      std::cout << "usage: " << usage << "\n\n" << d << "\n";
      return false;
    }
    po::notify(*vm);
  } catch (const po::error& e) {
    SHARDLM_FAIL("shardlm " << command << ": " << e.what() << " (see shardlm " << command << " --help)");
  }
  return true;
}

}  // namespace shardlm
