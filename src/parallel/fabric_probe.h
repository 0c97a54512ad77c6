// What one node's network fabric looks like to this job (libfabric providers, EFA devices, GPUs,
// NCCL and its network plugin, locked-memory limit, interfaces), and the known-bad settings it
// reveals. Gathered once per node by fabric_preflight(); the warning rules are a pure function of
// the facts and an environment map, so tests never touch the real environment.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace shardlm {

using EnvMap = std::map<std::string, std::string>;

struct FabricFacts {
  std::string host;
  std::string machine;                     // DMI product name: the instance type on EC2 ("p5en.48xlarge")
  std::string kernel;                      // uname release ("6.8.0-1015-aws")
  std::string libfabric_version;           // runtime "major.minor"; "" when built without libfabric
  std::vector<std::string> providers;      // distinct prov_name of fi_getinfo's list, sorted ("tcp;ofi_rxm")
  std::vector<std::string> efa_domains;    // "fabric/domain" of each efa entry
  std::string fi_note;                     // why the list is empty or only the plain listing was used
  int efa_devices = 0;                     // /sys/class/infiniband/*efa*
  int ib_devices = 0;                      // other /sys/class/infiniband devices (for NCCL's IB transport)
  int gpus = 0;
  std::string gpu_name;                    // of device 0
  int cuda_runtime = 0;                    // 1000 * major + 10 * minor; 0 = none
  int cuda_driver = 0;                     // likewise; 0 = no driver
  std::string nccl_version;                // "2.23.4"; "" when built without NCCL
  std::string nccl_plugin;                 // path of the aws-ofi-nccl plugin found; "" = none
  std::string nccl_net;                    // the network NCCL will use: "aws-ofi-nccl", "IB" or "Socket"
  int64_t memlock_kib = -1;                // RLIMIT_MEMLOCK soft limit in KiB; -1 = unlimited
  std::vector<std::string> interfaces;     // network interface names (getifaddrs), sorted
  EnvMap env;                              // the FI_* / NCCL_* / LD_LIBRARY_PATH values seen on the node

  // True when some listed provider is `name` or a layered one built on it ("tcp" in "tcp;ofi_rxm").
  bool has_provider(const std::string& name) const;
};

struct FabricWarning {
  std::string code;    // stable short code, e.g. "fi-provider-not-efa"
  std::string reason;  // one line: what is wrong and what to do
  bool mild = false;   // a cost rather than a failure
};

// The environment variables the probe and the rules read (FI_*, NCCL_*, LD_LIBRARY_PATH), from
// this process.
EnvMap fabric_env_from_process();

// Probes this node (fast: one fi_getinfo, a few stats). `env` supplies NCCL_NET_PLUGIN,
// NCCL_NET, NCCL_IB_DISABLE and LD_LIBRARY_PATH and is recorded in the facts.
FabricFacts probe_fabric(const EnvMap& env);

// The warnings for one node of a job of `nodes` nodes, in a fixed order.
std::vector<FabricWarning> fabric_warnings(const FabricFacts& f, const EnvMap& env, int nodes);

// Where NCCL would find its network plugin: NCCL_NET_PLUGIN if set ("none" disables it), else the
// aws-ofi-nccl library names, on LD_LIBRARY_PATH and then `dirs`. Returns the path found, or "".
std::string find_nccl_net_plugin(const EnvMap& env, const std::vector<std::string>& dirs);
// The directories searched after LD_LIBRARY_PATH (the EFA installer's and the system's).
const std::vector<std::string>& nccl_plugin_dirs();
// The network NCCL will use given the plugin found, the non-EFA InfiniBand devices and NCCL_NET /
// NCCL_IB_DISABLE.
std::string nccl_net_choice(const std::string& plugin, int ib_devices, const EnvMap& env);
// The interfaces an NCCL_SOCKET_IFNAME value selects ("eth", "^lo,docker", "=eth0").
std::vector<std::string> socket_ifname_matches(const std::string& spec, const std::vector<std::string>& interfaces);

// Lossless JSON of the facts (sent from node leaders to rank 0, and kept in the output file).
std::string fabric_facts_to_json(const FabricFacts& f);
FabricFacts fabric_facts_from_json(const std::string& json);

}  // namespace shardlm
