#include "cli/run_info.h"

#include <hdf5.h>
#include <pcre2.h>
#include <utf8proc.h>
#ifdef SHARDLM_HAVE_LIBFABRIC
#include <rdma/fabric.h>
#endif

#include <boost/version.hpp>
#include <ctime>
#include <nlohmann/json.hpp>

#include "parallel/mpi_env.h"

namespace shardlm {

std::vector<std::pair<std::string, std::string>> library_versions() {
  std::vector<std::pair<std::string, std::string>> v;
  v.emplace_back("mpi", MpiEnv::initialized() ? MpiEnv::library_version() : std::string("not initialised"));
  unsigned maj = 0, min = 0, rel = 0;
  H5get_libversion(&maj, &min, &rel);
  v.emplace_back("hdf5", std::to_string(maj) + "." + std::to_string(min) + "." + std::to_string(rel));
  v.emplace_back("boost", std::to_string(BOOST_VERSION / 100000) + "." + std::to_string(BOOST_VERSION / 100 % 1000) +
                              "." + std::to_string(BOOST_VERSION % 100));
  // The library loaded at run time, not the headers built against (a node's may differ).
  char pcre2[64] = "";
  pcre2_config(PCRE2_CONFIG_VERSION, pcre2);
  v.emplace_back("pcre2", std::string(pcre2));
  v.emplace_back("utf8proc", utf8proc_version());
  v.emplace_back("nlohmann_json", std::to_string(NLOHMANN_JSON_VERSION_MAJOR) + "." +
                                      std::to_string(NLOHMANN_JSON_VERSION_MINOR) + "." +
                                      std::to_string(NLOHMANN_JSON_VERSION_PATCH));
#ifdef SHARDLM_HAVE_LIBFABRIC
  const uint32_t fv = fi_version();
  v.emplace_back("libfabric", std::to_string(FI_MAJOR(fv)) + "." + std::to_string(FI_MINOR(fv)));
#endif
  return v;
}

std::string iso_time_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S%z", &tm);
  return buf;
}

std::string command_line(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (i) s += ' ';
    if (a.find_first_of(" \t\"'$\\") != std::string::npos) {
      std::string q = "'";
      for (char c : a) q += (c == '\'') ? std::string("'\\''") : std::string(1, c);
      a = q + "'";
    }
    s += a;
  }
  return s;
}

}  // namespace shardlm
