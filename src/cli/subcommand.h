// Option parsing shared by the subcommands: one Boost.ProgramOptions table each, --help, and bad
// values reported as an Error naming the command.
#pragma once

#include <boost/program_options.hpp>

namespace shardlm {

// Adds --help to `d`, parses argv (argv[0] is the subcommand). Returns false after printing
// "usage: <usage>" and the table when --help is given.
bool parse_subcommand(int argc, char** argv, const char* command, const char* usage,
                      boost::program_options::options_description& d, boost::program_options::variables_map* vm);

}  // namespace shardlm
