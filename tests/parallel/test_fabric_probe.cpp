// The network preflight: every warning rule on synthetic facts and environments (it fires, and it
// stays quiet when the setting is right), our own p5en environment raising nothing, the JSON round
// trip, the NCCL plugin search and network choice, the report's folding, the real probe on this
// (EFA-less) machine, and the preflight as an MPI job (run with 1 and 2 ranks): the report gathered
// on rank 0, and --require-efa failing on every rank with the node and its providers named.
//
// Collective tests use EXPECT_* only, so that a failing rank still takes part in what follows.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <string>
#include <unistd.h>
#include <vector>

#include "core/error.h"
#include "parallel/communicator.h"
#include "parallel/fabric_preflight.h"
#include "parallel/fabric_probe.h"
#include "parallel/mpi_env.h"

namespace fs = std::filesystem;

namespace shardlm {
namespace {

// A healthy p5en.48xlarge node as slurm/env/p5en.sh leaves it.
FabricFacts p5en_node(const std::string& host = "ip-10-0-0-1") {
  FabricFacts f;
  f.host = host;
  f.machine = "p5en.48xlarge";
  f.kernel = "6.8.0-1015-aws";
  f.libfabric_version = "1.22";
  f.providers = {"efa", "shm", "tcp;ofi_rxm"};
  f.efa_domains = {"efa/rdmap79s0-rdm", "efa/rdmap80s0-rdm"};
  f.efa_devices = 16;
  f.gpus = 8;
  f.gpu_name = "NVIDIA H200";
  f.cuda_runtime = 12080;
  f.cuda_driver = 12080;
  f.nccl_version = "2.23.4";
  f.nccl_plugin = "/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so";
  f.nccl_net = "aws-ofi-nccl";
  f.memlock_kib = -1;
  f.interfaces = {"docker0", "enp71s0", "lo"};
  return f;
}

// The FI_* and NCCL_* exports of slurm/env/p5en.sh (values without shell expansion).
EnvMap p5en_env() {
  EnvMap env;
  std::ifstream f(std::string(SHARDLM_SOURCE_DIR) + "/slurm/env/p5en.sh");
  EXPECT_TRUE(f) << "slurm/env/p5en.sh";
  std::string line;
  while (std::getline(f, line)) {
    const size_t at = line.find("export ");
    if (at == std::string::npos) continue;
    std::string kv = line.substr(at + 7);
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = kv.substr(0, eq);
    std::string val = kv.substr(eq + 1);
    if (key.rfind("FI_", 0) != 0 && key.rfind("NCCL_", 0) != 0) continue;
    if (val.find('$') != std::string::npos) continue;  // NCCL_DEBUG's default expansion
    if (val.size() >= 2 && val.front() == '"' && val.back() == '"') val = val.substr(1, val.size() - 2);
    env[key] = val;
  }
  return env;
}

std::vector<std::string> codes(const std::vector<FabricWarning>& w) {
  std::vector<std::string> c;
  for (const auto& x : w) c.push_back(x.code);
  return c;
}

bool fires(const FabricFacts& f, const EnvMap& env, const std::string& code, int nodes = 2) {
  const auto c = codes(fabric_warnings(f, env, nodes));
  return std::find(c.begin(), c.end(), code) != c.end();
}

std::string reason(const FabricFacts& f, const EnvMap& env, const std::string& code, int nodes = 2) {
  for (const auto& w : fabric_warnings(f, env, nodes))
    if (w.code == code) return w.reason;
  return "";
}

TEST(FabricRules, OurP5enEnvironmentRaisesNothing) {
  const EnvMap env = p5en_env();
  ASSERT_EQ(env.at("FI_PROVIDER"), "efa");
  ASSERT_EQ(env.at("NCCL_SOCKET_IFNAME"), "^lo,docker");
  EXPECT_EQ(codes(fabric_warnings(p5en_node(), env, 4)), std::vector<std::string>{});
}

TEST(FabricRules, FiProviderNotEfa) {
  const FabricFacts f = p5en_node();
  EnvMap env = p5en_env();
  env["FI_PROVIDER"] = "tcp";
  EXPECT_TRUE(fires(f, env, "fi-provider-not-efa"));
  EXPECT_NE(reason(f, env, "fi-provider-not-efa").find("FI_PROVIDER=tcp"), std::string::npos);
  env["FI_PROVIDER"] = "^efa";
  EXPECT_TRUE(fires(f, env, "fi-provider-not-efa"));
  for (const char* ok : {"efa", "efa,shm", "^tcp"}) {
    env["FI_PROVIDER"] = ok;
    EXPECT_FALSE(fires(f, env, "fi-provider-not-efa")) << ok;
  }
  env.erase("FI_PROVIDER");
  EXPECT_FALSE(fires(f, env, "fi-provider-not-efa"));
  // Without EFA devices any provider is the user's choice.
  FabricFacts cpu = p5en_node();
  cpu.efa_devices = 0;
  env["FI_PROVIDER"] = "tcp";
  EXPECT_FALSE(fires(cpu, env, "fi-provider-not-efa"));
}

TEST(FabricRules, EfaDevicesWithoutTheEfaProvider) {
  FabricFacts f = p5en_node();
  EnvMap env = p5en_env();
  env.erase("FI_PROVIDER");
  f.providers = {"shm", "tcp;ofi_rxm"};
  EXPECT_TRUE(fires(f, env, "efa-provider-missing"));
  f.providers = {"efa", "shm"};
  EXPECT_FALSE(fires(f, env, "efa-provider-missing"));
}

TEST(FabricRules, DeviceRdmaOffOnP5) {
  FabricFacts f = p5en_node();
  EnvMap env = p5en_env();
  env["FI_EFA_USE_DEVICE_RDMA"] = "0";
  EXPECT_TRUE(fires(f, env, "fi-efa-device-rdma-off"));
  EXPECT_NE(reason(f, env, "fi-efa-device-rdma-off").find("1.18"), std::string::npos);
  // Hopper GPUs on an EFA node count as p5-class off EC2's DMI names too.
  f.machine = "";
  EXPECT_TRUE(fires(f, env, "fi-efa-device-rdma-off"));
  env["FI_EFA_USE_DEVICE_RDMA"] = "1";
  EXPECT_FALSE(fires(f, env, "fi-efa-device-rdma-off"));
  env.erase("FI_EFA_USE_DEVICE_RDMA");
  EXPECT_FALSE(fires(f, env, "fi-efa-device-rdma-off"));
  // A p4d-like node (A100, no p5 name): not this rule's business.
  env["FI_EFA_USE_DEVICE_RDMA"] = "0";
  f.gpu_name = "NVIDIA A100-SXM4-40GB";
  f.machine = "p4d.24xlarge";
  EXPECT_FALSE(fires(f, env, "fi-efa-device-rdma-off"));
}

TEST(FabricRules, ForkSafeIsMildAndVersionBound) {
  FabricFacts f = p5en_node();
  EnvMap env = p5en_env();
  env["FI_EFA_FORK_SAFE"] = "1";
  ASSERT_TRUE(fires(f, env, "fi-efa-fork-safe"));
  for (const auto& w : fabric_warnings(f, env, 2))
    if (w.code == "fi-efa-fork-safe") {
      EXPECT_TRUE(w.mild);
    }
  f.libfabric_version = "1.12";
  EXPECT_FALSE(fires(f, env, "fi-efa-fork-safe"));
  f.libfabric_version = "1.22";
  f.kernel = "5.10.0-28-cloud-amd64";  // before copy-on-fork in the kernel
  EXPECT_FALSE(fires(f, env, "fi-efa-fork-safe"));
  f.kernel = "6.8.0";
  env["FI_EFA_FORK_SAFE"] = "0";
  EXPECT_FALSE(fires(f, env, "fi-efa-fork-safe"));
}

TEST(FabricRules, NcclProtoPinned) {
  const FabricFacts f = p5en_node();
  EnvMap env = p5en_env();
  for (const char* bad : {"Simple", "LL128", "LL,Simple", "^LL"}) {
    env["NCCL_PROTO"] = bad;
    EXPECT_TRUE(fires(f, env, "nccl-proto-forced")) << bad;
  }
  env["NCCL_PROTO"] = "^LL128";  // NCCL's own default on EFA
  EXPECT_FALSE(fires(f, env, "nccl-proto-forced"));
  env.erase("NCCL_PROTO");
  EXPECT_FALSE(fires(f, env, "nccl-proto-forced"));
}

TEST(FabricRules, SocketIfname) {
  const FabricFacts f = p5en_node();
  EnvMap env = p5en_env();
  env["NCCL_SOCKET_IFNAME"] = "eth0";
  EXPECT_TRUE(fires(f, env, "nccl-socket-ifname-no-match", 1));
  EXPECT_NE(reason(f, env, "nccl-socket-ifname-no-match", 1).find("enp71s0"), std::string::npos);
  env["NCCL_SOCKET_IFNAME"] = "=enp71";  // exact: no such interface
  EXPECT_TRUE(fires(f, env, "nccl-socket-ifname-no-match", 1));
  for (const char* ok : {"enp", "=enp71s0", "^lo,docker", "eth,enp71s0"}) {
    env["NCCL_SOCKET_IFNAME"] = ok;
    EXPECT_FALSE(fires(f, env, "nccl-socket-ifname-no-match", 1)) << ok;
  }
  env.erase("NCCL_SOCKET_IFNAME");
  EXPECT_TRUE(fires(f, env, "nccl-socket-ifname-unset", 2));
  EXPECT_NE(reason(f, env, "nccl-socket-ifname-unset", 2).find("docker0,enp71s0,lo"), std::string::npos);
  EXPECT_FALSE(fires(f, env, "nccl-socket-ifname-unset", 1));
}

TEST(FabricRules, SocketIfnameMatching) {
  const std::vector<std::string> ifs = {"docker0", "eth0", "eth1", "lo"};
  EXPECT_EQ(socket_ifname_matches("eth", ifs), (std::vector<std::string>{"eth0", "eth1"}));
  EXPECT_EQ(socket_ifname_matches("=eth1", ifs), (std::vector<std::string>{"eth1"}));
  EXPECT_EQ(socket_ifname_matches("^lo,docker", ifs), (std::vector<std::string>{"eth0", "eth1"}));
  EXPECT_EQ(socket_ifname_matches("^=eth0", ifs), (std::vector<std::string>{"docker0", "eth1", "lo"}));
  EXPECT_TRUE(socket_ifname_matches("ib", ifs).empty());
}

TEST(FabricRules, MemlockLimited) {
  FabricFacts f = p5en_node();
  const EnvMap env = p5en_env();
  f.memlock_kib = 8192;
  EXPECT_TRUE(fires(f, env, "memlock-limited"));
  EXPECT_NE(reason(f, env, "memlock-limited").find("8 MiB"), std::string::npos);
  f.memlock_kib = -1;
  EXPECT_FALSE(fires(f, env, "memlock-limited"));
  // Nothing pins memory on a CPU-only node without EFA.
  f.memlock_kib = 64;
  f.efa_devices = 0;
  f.gpus = 0;
  EXPECT_FALSE(fires(f, env, "memlock-limited"));
}

TEST(FabricRules, EfaWithoutNcclPlugin) {
  FabricFacts f = p5en_node();
  EnvMap env = p5en_env();
  f.nccl_plugin = "";
  f.nccl_net = "Socket";
  EXPECT_TRUE(fires(f, env, "efa-without-nccl-plugin"));
  EXPECT_NE(reason(f, env, "efa-without-nccl-plugin").find("TCP"), std::string::npos);
  f.efa_devices = 0;
  EXPECT_FALSE(fires(f, env, "efa-without-nccl-plugin"));
  f = p5en_node();
  EXPECT_FALSE(fires(f, env, "efa-without-nccl-plugin"));
  // Plugin present, but NCCL_NET=Socket forces TCP anyway.
  f.nccl_net = "Socket";
  EXPECT_TRUE(fires(f, env, "nccl-net-socket-on-efa"));
  EXPECT_FALSE(fires(p5en_node(), env, "nccl-net-socket-on-efa"));
}

TEST(FabricRules, EveryWarningHasAStableCodeAndOneLineReason) {
  FabricFacts f = p5en_node();
  f.memlock_kib = 64;
  f.nccl_plugin = "";
  EnvMap env = {{"FI_PROVIDER", "sockets"}, {"FI_EFA_USE_DEVICE_RDMA", "0"}, {"FI_EFA_FORK_SAFE", "1"},
                {"NCCL_PROTO", "Simple"}};
  const auto w = fabric_warnings(f, env, 8);
  EXPECT_EQ(codes(w), (std::vector<std::string>{"fi-provider-not-efa", "fi-efa-device-rdma-off", "fi-efa-fork-safe",
                                                "nccl-proto-forced", "nccl-socket-ifname-unset", "memlock-limited",
                                                "efa-without-nccl-plugin"}));
  for (const auto& x : w) {
    EXPECT_FALSE(x.reason.empty()) << x.code;
    EXPECT_EQ(x.reason.find('\n'), std::string::npos) << x.code;
  }
}

TEST(FabricProbe, NcclPluginSearchAndNetworkChoice) {
  const fs::path d = fs::temp_directory_path() / ("shardlm-fabric-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d / "a");
  fs::create_directories(d / "b");
  std::ofstream(d / "b" / "libnccl-net-ofi.so") << "not really a library";
  const std::string ld = (d / "a").string() + ":" + (d / "b").string();
  const std::vector<std::string> none;
  EXPECT_EQ(find_nccl_net_plugin({{"LD_LIBRARY_PATH", ld}}, none), (d / "b" / "libnccl-net-ofi.so").string());
  EXPECT_EQ(find_nccl_net_plugin({{"LD_LIBRARY_PATH", ld}, {"NCCL_NET_PLUGIN", "ofi"}}, none),
            (d / "b" / "libnccl-net-ofi.so").string());
  EXPECT_EQ(find_nccl_net_plugin({{"LD_LIBRARY_PATH", ld}, {"NCCL_NET_PLUGIN", "aws-ofi"}}, none), "");
  EXPECT_EQ(find_nccl_net_plugin({{"LD_LIBRARY_PATH", ld}, {"NCCL_NET_PLUGIN", "none"}}, none), "");
  EXPECT_EQ(find_nccl_net_plugin({{"NCCL_NET_PLUGIN", (d / "b" / "libnccl-net-ofi.so").string()}}, none),
            (d / "b" / "libnccl-net-ofi.so").string());
  EXPECT_EQ(find_nccl_net_plugin({}, {(d / "a").string(), (d / "b").string()}),
            (d / "b" / "libnccl-net-ofi.so").string());
  EXPECT_EQ(find_nccl_net_plugin({{"LD_LIBRARY_PATH", (d / "a").string()}}, none), "");
  fs::remove_all(d);

  const std::string plugin = "/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so";
  EXPECT_EQ(nccl_net_choice(plugin, 0, {}), "aws-ofi-nccl");
  EXPECT_EQ(nccl_net_choice(plugin, 0, {{"NCCL_NET", "Socket"}}), "Socket");
  EXPECT_EQ(nccl_net_choice("", 0, {}), "Socket");
  EXPECT_EQ(nccl_net_choice("", 2, {}), "IB");
  EXPECT_EQ(nccl_net_choice("", 2, {{"NCCL_IB_DISABLE", "1"}}), "Socket");
  EXPECT_NE(nccl_net_choice("", 0, {{"NCCL_NET", "AWS Libfabric"}}).find("NCCL will fail"), std::string::npos);
}

TEST(FabricProbe, JsonRoundTrip) {
  FabricFacts f = p5en_node();
  f.memlock_kib = 65536;
  f.fi_note = "a note";
  f.ib_devices = 1;
  f.env = {{"FI_PROVIDER", "efa"}, {"NCCL_SOCKET_IFNAME", "^lo,docker"}};
  const FabricFacts g = fabric_facts_from_json(fabric_facts_to_json(f));
  EXPECT_EQ(fabric_facts_to_json(g), fabric_facts_to_json(f));
  EXPECT_EQ(g.host, f.host);
  EXPECT_EQ(g.providers, f.providers);
  EXPECT_EQ(g.efa_domains, f.efa_domains);
  EXPECT_EQ(g.efa_devices, 16);
  EXPECT_EQ(g.ib_devices, 1);
  EXPECT_EQ(g.memlock_kib, 65536);
  EXPECT_EQ(g.cuda_runtime, 12080);
  EXPECT_EQ(g.nccl_plugin, f.nccl_plugin);
  EXPECT_EQ(g.interfaces, f.interfaces);
  EXPECT_EQ(g.env, f.env);
}

TEST(FabricReportText, FoldsIdenticalNodesAndNamesTheOdd) {
  FabricReport r;
  for (int i = 0; i < 8; ++i) r.nodes.push_back(p5en_node("ip-" + std::to_string(i)));
  r.nodes[5].nccl_plugin = "";
  r.nodes[5].nccl_net = "Socket";
  for (const FabricFacts& f : r.nodes) r.warnings.push_back(fabric_warnings(f, p5en_env(), 8));
  const auto lines = format_fabric_report(r, FabricReportMode::kFull);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].rfind("fabric nodes 0-4,6-7 (ip-0 .. ip-7): libfabric 1.22 [efa shm tcp;ofi_rxm]", 0), 0u)
      << lines[0];
  EXPECT_EQ(lines[1].rfind("fabric node 5 (ip-5): ", 0), 0u) << lines[1];
  EXPECT_EQ(lines[2].rfind("fabric warning [efa-without-nccl-plugin] node 5 (ip-5): ", 0), 0u) << lines[2];
  const auto one = format_fabric_report(r, FabricReportMode::kLine);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_NE(one[0].find("warnings: efa-without-nccl-plugin"), std::string::npos) << one[0];
  EXPECT_TRUE(format_fabric_report(r, FabricReportMode::kOff).empty());
  EXPECT_EQ(node_ranges({0, 1, 2, 3, 5, 7, 8}), "0-3,5,7-8");
  EXPECT_EQ(r.providers(), "efa shm tcp;ofi_rxm");
  EXPECT_EQ(r.efa_devices(), 16);
  EXPECT_EQ(r.gpus_per_node(), 8);
  EXPECT_EQ(r.nccl_net(), "aws-ofi-nccl;Socket");
  EXPECT_EQ(r.cuda_runtime(), "12.8");
  EXPECT_EQ(r.warning_codes(), std::vector<std::string>{"efa-without-nccl-plugin"});
  EXPECT_NE(r.warnings_json().find("\"nodes\":[5]"), std::string::npos) << r.warnings_json();
}

TEST(FabricReportText, RequireEfaVerdict) {
  std::vector<FabricFacts> nodes = {p5en_node("a"), p5en_node("b"), p5en_node("c")};
  EXPECT_EQ(require_efa_verdict(nodes), "");
  nodes[1].providers = {"shm", "tcp;ofi_rxm"};
  nodes[1].env["FI_PROVIDER"] = "tcp";
  const std::string v = require_efa_verdict(nodes);
  EXPECT_NE(v.find("1 of 3 node(s)"), std::string::npos) << v;
  EXPECT_NE(v.find("node 1 (b) has providers [shm tcp;ofi_rxm]"), std::string::npos) << v;
  EXPECT_NE(v.find("FI_PROVIDER=tcp"), std::string::npos) << v;
}

// This machine: libfabric from the distribution (tcp, udp, shm, sockets), no EFA.
TEST(FabricProbe, RealProbeOnThisMachine) {
  const FabricFacts f = probe_fabric(fabric_env_from_process());
  EXPECT_FALSE(f.host.empty());
  EXPECT_FALSE(f.interfaces.empty());
  EXPECT_FALSE(f.nccl_net.empty());
  if (fs::exists("/opt/amazon/efa") || f.efa_devices > 0) GTEST_SKIP() << "an EFA node: the EFA-less checks do not apply";
#ifdef SHARDLM_HAVE_LIBFABRIC
  EXPECT_FALSE(f.libfabric_version.empty());
  EXPECT_TRUE(f.has_provider("tcp") || f.has_provider("shm") || f.has_provider("sockets"))
      << fabric_facts_to_json(f);
#endif
  EXPECT_FALSE(f.has_provider("efa"));
  EXPECT_TRUE(f.efa_domains.empty());
  EXPECT_EQ(f.efa_devices, 0);
}

std::unique_ptr<Communicator> world_comm() {
  if (MpiEnv::size() == 1) return nullptr;
  std::vector<int> all(static_cast<size_t>(MpiEnv::size()));
  std::iota(all.begin(), all.end(), 0);
  return make_communicator("mpi", all, "world", 60);
}

TEST(FabricPreflight, GathersOneReportOnRankZero) {
  auto world = world_comm();
  const FabricReport r = fabric_preflight(world.get(), false, FabricReportMode::kFull);
  if (MpiEnv::rank() == 0) {
    // mpirun on one machine: every rank on one node.
    EXPECT_EQ(r.nodes.size(), 1u);
    EXPECT_EQ(r.warnings.size(), r.nodes.size());
    if (!r.nodes.empty()) {
      EXPECT_EQ(r.nodes[0].host, probe_fabric({}).host);
    }
#ifdef SHARDLM_HAVE_LIBFABRIC
    EXPECT_FALSE(r.providers().empty());
#endif
  } else {
    EXPECT_TRUE(r.nodes.empty());
  }
}

TEST(FabricPreflight, RequireEfaFailsOnEveryRankNamingTheNode) {
  if (fs::exists("/opt/amazon/efa")) GTEST_SKIP() << "an EFA node";
  auto world = world_comm();
  std::string msg;
  try {
    fabric_preflight(world.get(), true, FabricReportMode::kOff);
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("--require-efa: no efa libfabric provider on 1 of 1 node(s)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("node 0 ("), std::string::npos) << msg;
  EXPECT_NE(msg.find("has providers ["), std::string::npos) << msg;
  // Every rank still talks to the others afterwards: nothing was left half done.
  if (world) world->barrier();
}

}  // namespace
}  // namespace shardlm
