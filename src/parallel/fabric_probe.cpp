#include "parallel/fabric_probe.h"

#include <ifaddrs.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#ifdef SHARDLM_HAVE_LIBFABRIC
#include <rdma/fabric.h>
#include <rdma/fi_errno.h>
#endif
#ifdef SHARDLM_HAVE_CUDA
#include "cuda/device_info.h"
#endif
#ifdef SHARDLM_HAVE_NCCL
#include <nccl.h>
#endif

extern char** environ;

namespace shardlm {

namespace fs = std::filesystem;

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t\r\n") - a + 1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(trim(cur));
  return out;
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

const std::string* env_get(const EnvMap& env, const std::string& key) {
  auto it = env.find(key);
  return it == env.end() ? nullptr : &it->second;
}

bool truthy(const std::string& v) {
  const std::string l = lower(trim(v));
  return l == "1" || l == "true" || l == "yes" || l == "on";
}
bool falsy(const std::string& v) {
  const std::string l = lower(trim(v));
  return l == "0" || l == "false" || l == "no" || l == "off";
}

// "1.17" or "5.15.0-1066-aws" -> {1, 17}; {0, 0} when unreadable.
std::pair<int, int> major_minor(const std::string& v) {
  int a = 0, b = 0;
  if (std::sscanf(v.c_str(), "%d.%d", &a, &b) < 2) return {0, 0};
  return {a, b};
}

bool at_least(const std::string& v, int major, int minor) {
  const auto [a, b] = major_minor(v);
  return a > major || (a == major && b >= minor);
}

std::string read_line(const fs::path& p) {
  std::ifstream f(p);
  std::string s;
  std::getline(f, s);
  return trim(s);
}

// p5.48xlarge, p5e, p5en: EFA with GPUDirect RDMA (read and write). Off EC2 (no DMI product name
// of that form), Hopper GPUs on an EFA node are taken for one.
bool is_p5_class(const FabricFacts& f) {
  if (f.machine.rfind("p5", 0) == 0) return true;
  return f.efa_devices > 0 && (f.gpu_name.find("H100") != std::string::npos || f.gpu_name.find("H200") != std::string::npos);
}

// Whether the libfabric provider list of FI_PROVIDER ("efa", "tcp,udp", "^efa") admits efa.
bool fi_provider_admits_efa(const std::string& value) {
  std::string v = trim(value);
  const bool exclude = !v.empty() && v[0] == '^';
  if (exclude) v = v.substr(1);
  bool listed = false;
  for (const std::string& p : split(v, ',')) listed |= lower(p) == "efa" || lower(p).rfind("efa", 0) == 0;
  return exclude ? !listed : listed;
}

void probe_libfabric(FabricFacts* f) {
#ifdef SHARDLM_HAVE_LIBFABRIC
  const uint32_t v = fi_version();
  f->libfabric_version = std::to_string(FI_MAJOR(v)) + "." + std::to_string(FI_MINOR(v));
  // RDM endpoints are what EFA (and our fabric backend) use. The hints admit every mode and
  // memory-registration requirement, so that no provider is left out for asking more of the
  // application than a zeroed hint would grant (efa needs FI_MR_LOCAL and friends).
  fi_info* hints = fi_allocinfo();
  if (!hints) {
    f->fi_note = "fi_allocinfo failed";
    return;
  }
  hints->ep_attr->type = FI_EP_RDM;
  hints->mode = ~0ULL;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_RAW |
                                FI_MR_ENDPOINT | FI_MR_HMEM;
  fi_info* info = nullptr;
  int rc = fi_getinfo(FI_VERSION(1, 9), nullptr, nullptr, 0, hints, &info);
  fi_freeinfo(hints);
  if (rc == -FI_ENODATA) {
    // No RDM provider at all: list whatever there is, so the report says what the node has instead.
    f->fi_note = "no provider offers an RDM endpoint; plain listing";
    rc = fi_getinfo(FI_VERSION(1, 9), nullptr, nullptr, 0, nullptr, &info);
  }
  if (rc != 0) {
    f->fi_note = rc == -FI_ENODATA ? "fi_getinfo lists no provider" : std::string("fi_getinfo: ") + fi_strerror(-rc);
    return;
  }
  std::set<std::string> provs, efa;
  for (const fi_info* p = info; p; p = p->next) {
    if (!p->fabric_attr || !p->fabric_attr->prov_name) continue;
    const std::string name = p->fabric_attr->prov_name;
    provs.insert(name);
    bool is_efa = false;
    for (const std::string& part : split(name, ';')) is_efa |= part == "efa";
    if (is_efa) {
      const std::string fabric = p->fabric_attr->name ? p->fabric_attr->name : "?";
      const std::string domain = p->domain_attr && p->domain_attr->name ? p->domain_attr->name : "?";
      efa.insert(fabric + "/" + domain);
    }
  }
  fi_freeinfo(info);
  f->providers.assign(provs.begin(), provs.end());
  f->efa_domains.assign(efa.begin(), efa.end());
#else
  f->fi_note = "built without libfabric";
#endif
}

// EFA devices are named efa_N on older kernels and rdmapNsM (PCI names) on newer ones; their
// driver is efa either way.
void probe_rdma_devices(FabricFacts* f) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/sys/class/infiniband", ec)) {
    const std::string name = e.path().filename().string();
    std::error_code ec2;
    const fs::path driver = fs::read_symlink(e.path() / "device" / "driver", ec2);
    const bool efa = name.find("efa") != std::string::npos || (!ec2 && driver.filename() == "efa");
    ++(efa ? f->efa_devices : f->ib_devices);
  }
}

void probe_gpus(FabricFacts* f) {
#ifdef SHARDLM_HAVE_CUDA
  f->gpus = cuda::device_count();
  f->cuda_runtime = cuda::runtime_version();
  f->cuda_driver = cuda::driver_version();
  if (f->gpus > 0) f->gpu_name = cuda::device_name(0);
#endif
#ifdef SHARDLM_HAVE_NCCL
  int v = 0;
  if (ncclGetVersion(&v) == ncclSuccess && v > 0) {
    // 2.9 and later: major * 10000 + minor * 100 + patch.
    f->nccl_version = std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
  }
#endif
}

void probe_host(FabricFacts* f) {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) == 0) f->host = host;
  utsname u{};
  if (uname(&u) == 0) f->kernel = u.release;
  f->machine = read_line("/sys/devices/virtual/dmi/id/product_name");
  rlimit rl{};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0)
    f->memlock_kib = rl.rlim_cur == RLIM_INFINITY ? -1 : static_cast<int64_t>(rl.rlim_cur / 1024);
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) == 0) {
    std::set<std::string> names;
    for (const ifaddrs* i = ifs; i; i = i->ifa_next)
      if (i->ifa_name) names.insert(i->ifa_name);
    freeifaddrs(ifs);
    f->interfaces.assign(names.begin(), names.end());
  }
}

std::string kib_text(int64_t kib) {
  if (kib < 0) return "unlimited";
  return kib >= 1024 ? std::to_string(kib / 1024) + " MiB" : std::to_string(kib) + " KiB";
}

}  // namespace

bool FabricFacts::has_provider(const std::string& name) const {
  for (const std::string& p : providers)
    for (const std::string& part : split(p, ';'))
      if (part == name) return true;
  return false;
}

EnvMap fabric_env_from_process() {
  EnvMap env;
  for (char** e = environ; e && *e; ++e) {
    const std::string kv = *e;
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = kv.substr(0, eq);
    if (key.rfind("FI_", 0) == 0 || key.rfind("NCCL_", 0) == 0 || key == "LD_LIBRARY_PATH")
      env[key] = kv.substr(eq + 1);
  }
  return env;
}

const std::vector<std::string>& nccl_plugin_dirs() {
  static const std::vector<std::string> dirs = {"/opt/amazon/ofi-nccl/lib",
                                                "/opt/amazon/ofi-nccl/lib64",
                                                "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu",
                                                "/opt/aws-ofi-nccl/lib",
                                                "/usr/local/lib",
                                                "/usr/lib/x86_64-linux-gnu",
                                                "/usr/lib64",
                                                "/usr/lib"};
  return dirs;
}

std::string find_nccl_net_plugin(const EnvMap& env, const std::vector<std::string>& dirs) {
  std::vector<std::string> names;
  const std::string* plugin = env_get(env, "NCCL_NET_PLUGIN");
  if (plugin && !trim(*plugin).empty()) {
    const std::string v = trim(*plugin);
    if (lower(v) == "none") return "";
    if (v.find('/') != std::string::npos) {
      std::error_code ec;
      return fs::is_regular_file(v, ec) ? v : "";
    }
    // NCCL tries libnccl-net-<name>.so, and the name as given.
    names = {"libnccl-net-" + v + ".so", v};
  } else {
    names = {"libnccl-net.so", "libnccl-net-ofi.so", "libnccl-net-aws-ofi.so"};
  }
  std::vector<std::string> path;
  if (const std::string* ld = env_get(env, "LD_LIBRARY_PATH"))
    for (const std::string& d : split(*ld, ':'))
      if (!d.empty()) path.push_back(d);
  path.insert(path.end(), dirs.begin(), dirs.end());
  // Name by name, each over the whole path: the order in which NCCL's dlopen calls look.
  for (const std::string& n : names) {
    for (const std::string& d : path) {
      std::error_code ec;
      const fs::path p = fs::path(d) / n;
      if (fs::exists(p, ec) && !fs::is_directory(p, ec)) return p.string();
    }
  }
  return "";
}

std::string nccl_net_choice(const std::string& plugin, int ib_devices, const EnvMap& env) {
  const std::string* net = env_get(env, "NCCL_NET");
  const std::string forced = net ? lower(trim(*net)) : "";
  const std::string* ib_off = env_get(env, "NCCL_IB_DISABLE");
  const bool ib = ib_devices > 0 && !(ib_off && truthy(*ib_off));
  if (forced == "socket") return "Socket";
  if (forced == "ib") return ib ? "IB" : "IB (forced, no usable device: NCCL will fail)";
  if (!plugin.empty()) {
    const std::string base = fs::path(plugin).filename().string();
    return base.find("ofi") != std::string::npos || base == "libnccl-net.so" ? "aws-ofi-nccl" : "plugin " + base;
  }
  if (!forced.empty()) return trim(*net) + " (forced, no plugin found: NCCL will fail)";
  return ib ? "IB" : "Socket";
}

std::vector<std::string> socket_ifname_matches(const std::string& spec, const std::vector<std::string>& interfaces) {
  std::string s = trim(spec);
  const bool exclude = !s.empty() && s[0] == '^';
  if (exclude) s = s.substr(1);
  const bool exact = !s.empty() && s[0] == '=';
  if (exact) s = s.substr(1);
  const std::vector<std::string> items = split(s, ',');
  std::vector<std::string> out;
  for (const std::string& i : interfaces) {
    bool hit = false;
    for (const std::string& p : items)
      if (!p.empty()) hit |= exact ? i == p : i.rfind(p, 0) == 0;
    if (hit != exclude) out.push_back(i);
  }
  return out;
}

FabricFacts probe_fabric(const EnvMap& env) {
  FabricFacts f;
  f.env = env;
  probe_host(&f);
  probe_libfabric(&f);
  probe_rdma_devices(&f);
  probe_gpus(&f);
  f.nccl_plugin = find_nccl_net_plugin(env, nccl_plugin_dirs());
  f.nccl_net = nccl_net_choice(f.nccl_plugin, f.ib_devices, env);
  return f;
}

std::vector<FabricWarning> fabric_warnings(const FabricFacts& f, const EnvMap& env, int nodes) {
  std::vector<FabricWarning> w;
  auto add = [&](const char* code, const std::string& reason, bool mild = false) {
    w.push_back({code, reason, mild});
  };
  const std::string* fi_provider = env_get(env, "FI_PROVIDER");
  const bool provider_excludes_efa = fi_provider && !trim(*fi_provider).empty() && !fi_provider_admits_efa(*fi_provider);
  if (f.efa_devices > 0 && provider_excludes_efa) {
    add("fi-provider-not-efa", "FI_PROVIDER=" + *fi_provider + " on a node with " + std::to_string(f.efa_devices) +
                                   " EFA device(s): libfabric will not use EFA; set FI_PROVIDER=efa or unset it");
  } else if (f.efa_devices > 0 && !f.has_provider("efa")) {
    add("efa-provider-missing", std::to_string(f.efa_devices) + " EFA device(s) but libfabric " +
                                    (f.libfabric_version.empty() ? std::string("(absent)") : f.libfabric_version) +
                                    " lists no efa provider: load the EFA installer's libfabric (/opt/amazon/efa/lib)");
  }
  if (const std::string* rdma = env_get(env, "FI_EFA_USE_DEVICE_RDMA"); rdma && falsy(*rdma) && is_p5_class(f)) {
    add("fi-efa-device-rdma-off",
        "FI_EFA_USE_DEVICE_RDMA=" + *rdma + " on a p5-class node turns off RDMA read, which GPUDirect needs; "
        "unset it (libfabric >= 1.18 enables it on this hardware) or set 1");
  }
  if (const std::string* fork = env_get(env, "FI_EFA_FORK_SAFE");
      fork && truthy(*fork) && at_least(f.libfabric_version, 1, 13) && (f.kernel.empty() || at_least(f.kernel, 5, 13))) {
    add("fi-efa-fork-safe",
        "FI_EFA_FORK_SAFE=1 is unnecessary with libfabric " + f.libfabric_version +
            " (>= 1.13) and a kernel/rdma-core with copy-on-fork support, and slows memory registration; unset it",
        true);
  }
  if (const std::string* proto = env_get(env, "NCCL_PROTO"); proto && !trim(*proto).empty()) {
    // Excluding LL128 is what NCCL does on EFA anyway; anything else pins or removes a protocol.
    if (lower(trim(*proto)) != "^ll128") {
      add("nccl-proto-forced",
          "NCCL_PROTO=" + *proto + " pins NCCL's protocol choice, which usually costs bandwidth or small-message "
          "latency; unset it unless a measurement says otherwise",
          true);
    }
  }
  const std::string* ifname = env_get(env, "NCCL_SOCKET_IFNAME");
  if (ifname && !trim(*ifname).empty()) {
    if (socket_ifname_matches(*ifname, f.interfaces).empty()) {
      add("nccl-socket-ifname-no-match", "NCCL_SOCKET_IFNAME=" + *ifname +
                                             " selects no interface on this node (interfaces: " + join(f.interfaces, ",") +
                                             "): NCCL's bootstrap will fail");
    }
  } else if (nodes > 1) {
    add("nccl-socket-ifname-unset", "NCCL_SOCKET_IFNAME is unset in a " + std::to_string(nodes) +
                                        "-node job: NCCL may bootstrap over a wrong interface (interfaces: " +
                                        join(f.interfaces, ",") + "); e.g. NCCL_SOCKET_IFNAME=^lo,docker");
  }
  // Pinned memory matters only where EFA or GPUs register it.
  if (f.memlock_kib >= 0 && (f.efa_devices > 0 || f.gpus > 0)) {
    add("memlock-limited", "locked-memory limit is " + kib_text(f.memlock_kib) +
                               ", not unlimited: EFA and GPUDirect register (pin) memory; ulimit -l unlimited "
                               "(and PropagateResourceLimits in Slurm)");
  }
  if (f.efa_devices > 0 && f.nccl_plugin.empty()) {
    add("efa-without-nccl-plugin", std::to_string(f.efa_devices) +
                                       " EFA device(s) but no aws-ofi-nccl plugin found (NCCL_NET_PLUGIN, "
                                       "LD_LIBRARY_PATH, /opt/amazon/ofi-nccl/lib): NCCL falls back to TCP sockets");
  } else if (f.efa_devices > 0 && f.nccl_net == "Socket") {
    add("nccl-net-socket-on-efa",
        "NCCL_NET forces Socket on a node with EFA and the aws-ofi-nccl plugin: NCCL runs over TCP");
  }
  return w;
}

std::string fabric_facts_to_json(const FabricFacts& f) {
  nlohmann::json j = {{"host", f.host},
                      {"machine", f.machine},
                      {"kernel", f.kernel},
                      {"libfabric_version", f.libfabric_version},
                      {"providers", f.providers},
                      {"efa_domains", f.efa_domains},
                      {"fi_note", f.fi_note},
                      {"efa_devices", f.efa_devices},
                      {"ib_devices", f.ib_devices},
                      {"gpus", f.gpus},
                      {"gpu_name", f.gpu_name},
                      {"cuda_runtime", f.cuda_runtime},
                      {"cuda_driver", f.cuda_driver},
                      {"nccl_version", f.nccl_version},
                      {"nccl_plugin", f.nccl_plugin},
                      {"nccl_net", f.nccl_net},
                      {"memlock_kib", f.memlock_kib},
                      {"interfaces", f.interfaces},
                      {"env", f.env}};
  // Invalid UTF-8 in an environment value must not make the probe throw: replace it.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

FabricFacts fabric_facts_from_json(const std::string& json) {
  const nlohmann::json j = nlohmann::json::parse(json);
  FabricFacts f;
  f.host = j.value("host", "");
  f.machine = j.value("machine", "");
  f.kernel = j.value("kernel", "");
  f.libfabric_version = j.value("libfabric_version", "");
  f.providers = j.value("providers", std::vector<std::string>{});
  f.efa_domains = j.value("efa_domains", std::vector<std::string>{});
  f.fi_note = j.value("fi_note", "");
  f.efa_devices = j.value("efa_devices", 0);
  f.ib_devices = j.value("ib_devices", 0);
  f.gpus = j.value("gpus", 0);
  f.gpu_name = j.value("gpu_name", "");
  f.cuda_runtime = j.value("cuda_runtime", 0);
  f.cuda_driver = j.value("cuda_driver", 0);
  f.nccl_version = j.value("nccl_version", "");
  f.nccl_plugin = j.value("nccl_plugin", "");
  f.nccl_net = j.value("nccl_net", "");
  f.memlock_kib = j.value("memlock_kib", int64_t{-1});
  f.interfaces = j.value("interfaces", std::vector<std::string>{});
  f.env = j.value("env", EnvMap{});
  return f;
}

}  // namespace shardlm
