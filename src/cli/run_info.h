// Facts about the run recorded in the output's root attributes and the run header.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace shardlm {

// (library, version) for every library the binary uses.
std::vector<std::pair<std::string, std::string>> library_versions();
// Local time now, ISO 8601 with offset.
std::string iso_time_now();
// argv joined with spaces, each argument quoted when it needs it.
std::string command_line(int argc, char** argv);

}  // namespace shardlm
