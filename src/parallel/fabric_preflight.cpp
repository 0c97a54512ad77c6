#include "parallel/fabric_preflight.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "parallel/communicator.h"
#include "parallel/mpi_env.h"
#include "parallel/node_local.h"

namespace shardlm {

namespace {

// Point-to-point tag of the facts sent to rank 0 (the world communicator has its own MPI
// communicator, so only this exchange uses it at this time).
constexpr int kFactsTag = 0x4650;

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

std::string cuda_version_text(int v) {
  if (v <= 0) return "";
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

std::string kib_text(int64_t kib) {
  if (kib < 0) return "unlimited";
  return kib >= 1024 ? std::to_string(kib / 1024) + " MiB" : std::to_string(kib) + " KiB";
}

// What a node looks like, without its name: nodes with the same description fold into one line.
std::string describe(const FabricFacts& f) {
  std::string s = f.libfabric_version.empty() ? std::string("no libfabric")
                                              : "libfabric " + f.libfabric_version + " [" +
                                                    (f.providers.empty() ? std::string("no providers")
                                                                         : join(f.providers, " ")) +
                                                    "]";
  if (!f.fi_note.empty() && !f.libfabric_version.empty()) s += " (" + f.fi_note + ")";
  s += ", " + std::to_string(f.efa_devices) + " EFA";
  if (!f.efa_domains.empty()) s += " (" + std::to_string(f.efa_domains.size()) + " efa domains)";
  s += ", " + std::to_string(f.gpus) + " GPU" + (f.gpus == 1 ? "" : "s");
  if (!f.gpu_name.empty()) s += " " + f.gpu_name;
  if (f.cuda_runtime > 0)
    s += ", CUDA " + cuda_version_text(f.cuda_runtime) + " (driver " +
         (f.cuda_driver > 0 ? cuda_version_text(f.cuda_driver) : std::string("none")) + ")";
  if (f.nccl_version.empty()) {
    s += ", no NCCL in this build";
  } else {
    s += ", NCCL " + f.nccl_version + " over " + f.nccl_net;
    if (!f.nccl_plugin.empty()) s += " (" + f.nccl_plugin + ")";
  }
  s += ", memlock " + kib_text(f.memlock_kib);
  return s;
}

// Nodes grouped by a key, in order of first appearance.
template <typename Key>
std::vector<std::pair<Key, std::vector<int>>> group_nodes(size_t n, const std::function<Key(int)>& key) {
  std::vector<std::pair<Key, std::vector<int>>> groups;
  for (int i = 0; i < static_cast<int>(n); ++i) {
    const Key k = key(i);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == k; });
    if (it == groups.end()) groups.push_back({k, {i}});
    else it->second.push_back(i);
  }
  return groups;
}

// "node 3 (host)" or "nodes 0-7 (first .. last)".
std::string nodes_label(const std::vector<FabricFacts>& facts, const std::vector<int>& idx) {
  if (idx.size() == 1) return "node " + std::to_string(idx[0]) + " (" + facts[idx[0]].host + ")";
  return "nodes " + node_ranges(idx) + " (" + facts[idx.front()].host + " .. " + facts[idx.back()].host + ")";
}

template <typename T, typename F>
std::string distinct_joined(const std::vector<T>& v, F get) {
  std::vector<std::string> out;
  for (const T& x : v) {
    const std::string s = get(x);
    if (!s.empty() && std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  }
  return join(out, ";");
}

struct FoldedWarning {
  FabricWarning w;
  std::vector<int> nodes;
};

// The same warning (code and reason) on several nodes becomes one entry.
std::vector<FoldedWarning> fold_warnings(const FabricReport& r) {
  std::vector<FoldedWarning> out;
  for (size_t n = 0; n < r.warnings.size(); ++n) {
    for (const FabricWarning& w : r.warnings[n]) {
      auto it = std::find_if(out.begin(), out.end(),
                             [&](const FoldedWarning& f) { return f.w.code == w.code && f.w.reason == w.reason; });
      if (it == out.end()) out.push_back({w, {static_cast<int>(n)}});
      else it->nodes.push_back(static_cast<int>(n));
    }
  }
  return out;
}

void broadcast_string(Communicator* world, std::string* s) {
  int64_t n = static_cast<int64_t>(s->size());
  world->broadcast(&n, 1, CommDType::kI64, 0);
  s->resize(static_cast<size_t>(n));
  if (n > 0) world->broadcast(s->data(), s->size(), CommDType::kU8, 0);
}

}  // namespace

FabricReportMode fabric_report_mode(const std::string& name, int world_size) {
  if (name == "auto") return world_size > 1 ? FabricReportMode::kFull : FabricReportMode::kLine;
  if (name == "on") return FabricReportMode::kFull;
  if (name == "line") return FabricReportMode::kLine;
  if (name == "off") return FabricReportMode::kOff;
  SHARDLM_FAIL("--fabric-report must be auto, on, line or off, not '" << name << "'");
}

std::string node_ranges(const std::vector<int>& nodes) {
  std::string s;
  for (size_t i = 0; i < nodes.size();) {
    size_t j = i;
    while (j + 1 < nodes.size() && nodes[j + 1] == nodes[j] + 1) ++j;
    if (!s.empty()) s += ',';
    s += std::to_string(nodes[i]);
    if (j > i) {
      s += '-';
      s += std::to_string(nodes[j]);
    }
    i = j + 1;
  }
  return s;
}

std::string FabricReport::providers() const {
  std::set<std::string> all;
  for (const FabricFacts& f : nodes) all.insert(f.providers.begin(), f.providers.end());
  return join(std::vector<std::string>(all.begin(), all.end()), " ");
}

int64_t FabricReport::efa_devices() const {
  int64_t m = nodes.empty() ? 0 : INT64_MAX;
  for (const FabricFacts& f : nodes) m = std::min<int64_t>(m, f.efa_devices);
  return m;
}

int64_t FabricReport::gpus_per_node() const {
  int64_t m = nodes.empty() ? 0 : INT64_MAX;
  for (const FabricFacts& f : nodes) m = std::min<int64_t>(m, f.gpus);
  return m;
}

std::string FabricReport::nccl_net() const {
  return distinct_joined(nodes, [](const FabricFacts& f) { return f.nccl_net; });
}
std::string FabricReport::nccl_version() const {
  return distinct_joined(nodes, [](const FabricFacts& f) { return f.nccl_version; });
}
std::string FabricReport::cuda_runtime() const {
  return distinct_joined(nodes, [](const FabricFacts& f) { return cuda_version_text(f.cuda_runtime); });
}
std::string FabricReport::cuda_driver() const {
  return distinct_joined(nodes, [](const FabricFacts& f) { return cuda_version_text(f.cuda_driver); });
}

std::string FabricReport::warnings_json() const {
  nlohmann::json j = nlohmann::json::array();
  for (const FoldedWarning& f : fold_warnings(*this))
    j.push_back({{"code", f.w.code}, {"reason", f.w.reason}, {"mild", f.w.mild}, {"nodes", f.nodes}});
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string FabricReport::facts_json() const {
  std::string s = "[";
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (i) s += ',';
    s += fabric_facts_to_json(nodes[i]);
  }
  return s + "]";
}

std::vector<std::string> FabricReport::warning_codes() const {
  std::vector<std::string> codes;
  for (const auto& ws : warnings)
    for (const FabricWarning& w : ws)
      if (std::find(codes.begin(), codes.end(), w.code) == codes.end()) codes.push_back(w.code);
  return codes;
}

std::vector<std::string> format_fabric_report(const FabricReport& r, FabricReportMode mode) {
  std::vector<std::string> lines;
  if (mode == FabricReportMode::kOff || r.nodes.empty()) return lines;
  const auto groups =
      group_nodes<std::string>(r.nodes.size(), [&](int i) { return describe(r.nodes[static_cast<size_t>(i)]); });
  if (mode == FabricReportMode::kLine) {
    std::string s = "fabric: ";
    for (size_t g = 0; g < groups.size(); ++g) {
      if (g) s += " | ";
      if (r.nodes.size() > 1) s += nodes_label(r.nodes, groups[g].second) + ": ";
      s += groups[g].first;
    }
    const std::vector<std::string> codes = r.warning_codes();
    s += codes.empty() ? std::string("; no warnings")
                       : "; warnings: " + join(codes, ", ") + " (--fabric-report on for reasons)";
    lines.push_back(s);
    return lines;
  }
  for (const auto& [desc, idx] : groups) lines.push_back("fabric " + nodes_label(r.nodes, idx) + ": " + desc);
  for (const FoldedWarning& f : fold_warnings(r)) {
    lines.push_back(std::string(f.w.mild ? "fabric note" : "fabric warning") + " [" + f.w.code + "] " +
                    (r.nodes.size() > 1 ? nodes_label(r.nodes, f.nodes) + ": " : std::string()) + f.w.reason);
  }
  return lines;
}

std::string require_efa_verdict(const std::vector<FabricFacts>& nodes) {
  std::vector<FabricFacts> lacking;
  std::vector<int> idx;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].has_provider("efa")) continue;
    lacking.push_back(nodes[i]);
    idx.push_back(static_cast<int>(i));
  }
  if (idx.empty()) return "";
  // What each kind of node has instead.
  const auto groups = group_nodes<std::string>(lacking.size(), [&](int i) {
    const FabricFacts& f = lacking[static_cast<size_t>(i)];
    std::string s = "providers [" + (f.providers.empty() ? std::string("none") : join(f.providers, " ")) + "], " +
                    std::to_string(f.efa_devices) + " EFA devices";
    if (f.libfabric_version.empty()) s += ", built without libfabric";
    if (auto it = f.env.find("FI_PROVIDER"); it != f.env.end()) s += ", FI_PROVIDER=" + it->second;
    return s;
  });
  std::string msg = "--require-efa: no efa libfabric provider on " + std::to_string(idx.size()) + " of " +
                    std::to_string(nodes.size()) + " node(s): ";
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<int> real;
    for (int i : groups[g].second) real.push_back(idx[static_cast<size_t>(i)]);
    if (g) msg += "; ";
    msg += nodes_label(nodes, real) + " has " + groups[g].first;
  }
  return msg;
}

FabricReport fabric_preflight(Communicator* world, bool require_efa, FabricReportMode mode) {
  const NodeLocal nl = node_local(0);  // the world communicator's creation has just met every rank
  const int rank = world ? world->rank() : 0;
  if (world) {
    // Node leaders are named by world rank: the communicator must be the world in rank order.
    SHARDLM_CHECK(world->size() == MpiEnv::size() && world->world_rank_of(world->rank()) == MpiEnv::rank(),
                  "fabric preflight: the communicator is not the MPI world in rank order");
  } else {
    SHARDLM_CHECK(nl.nodes == 1, "fabric preflight: " << nl.nodes << " nodes but no world communicator");
  }
  std::string mine;
  if (nl.local_rank == 0) mine = fabric_facts_to_json(probe_fabric(fabric_env_from_process()));

  FabricReport report;
  if (rank == 0) {
    report.nodes.push_back(fabric_facts_from_json(mine));
    for (size_t n = 1; n < nl.node_leaders.size(); ++n) {
      const int leader = nl.node_leaders[n];
      int64_t size = 0;
      world->recv(&size, 1, CommDType::kI64, leader, kFactsTag);
      std::string buf(static_cast<size_t>(size), '\0');
      world->recv(buf.data(), buf.size(), CommDType::kU8, leader, kFactsTag);
      report.nodes.push_back(fabric_facts_from_json(buf));
    }
    for (const FabricFacts& f : report.nodes) report.warnings.push_back(fabric_warnings(f, f.env, nl.nodes));
    for (const std::string& line : format_fabric_report(report, mode)) std::fprintf(stderr, "[shardlm] %s\n", line.c_str());
    std::fflush(stderr);
  } else if (nl.local_rank == 0) {
    int64_t size = static_cast<int64_t>(mine.size());
    world->send(&size, 1, CommDType::kI64, 0, kFactsTag);
    world->send(mine.data(), mine.size(), CommDType::kU8, 0, kFactsTag);
  }

  std::string verdict;
  if (require_efa) {
    if (rank == 0) verdict = require_efa_verdict(report.nodes);
    if (world) broadcast_string(world, &verdict);
  }
  if (!verdict.empty()) SHARDLM_FAIL(verdict);
  return report;
}

}  // namespace shardlm
