// The network preflight of a job: one rank per node probes its fabric (fabric_probe.h), rank 0
// gathers the facts, prints a compact report (one line per kind of node, then the warnings) and,
// with require_efa, decides whether the job may go on; every rank gets that decision, so a refused
// job ends on all ranks at once instead of leaving some waiting in a collective.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/fabric_probe.h"

namespace shardlm {

class Communicator;

enum class FabricReportMode {
  kOff,   // print nothing (facts still gathered and recorded)
  kLine,  // one line (the default for a single-rank run)
  kFull,  // one line per kind of node, then one per warning (the default for several ranks)
};
// "auto" (kFull with several ranks, else kLine) | "on" | "line" | "off"; throws Error on anything else.
FabricReportMode fabric_report_mode(const std::string& name, int world_size);

struct FabricReport {
  std::vector<FabricFacts> nodes;                    // by node index; filled on rank 0 only
  std::vector<std::vector<FabricWarning>> warnings;  // the warnings of each node, same order

  // Values for the output file's root attributes (rank 0).
  std::string providers() const;      // providers of every node, distinct, space-separated (a name
                                      // may hold ';': "tcp;ofi_rxm" is tcp under the rxm utility)
  int64_t efa_devices() const;        // fewest EFA devices on any node
  std::string nccl_net() const;       // NCCL's network of every node, distinct, ';'-separated
  std::string nccl_version() const;   // distinct, ';'-separated ("" without NCCL)
  std::string cuda_runtime() const;   // "13.0"; "" without CUDA
  std::string cuda_driver() const;    // "13.0"; "" without a driver
  int64_t gpus_per_node() const;      // fewest GPUs on any node
  std::string warnings_json() const;  // [{"code", "reason", "mild", "nodes": [...]}], folded over nodes
  std::string facts_json() const;     // the facts of every node, a JSON array by node index
  std::vector<std::string> warning_codes() const;  // distinct, in first-seen order
};

// The report's lines (without the "[shardlm] " prefix). kFull: a line per group of identical nodes
// ("nodes 0-7 (a .. h): ...") then a line per warning, folded over the nodes it fires on. kLine:
// one line. kOff: none.
std::vector<std::string> format_fabric_report(const FabricReport& r, FabricReportMode mode);
// "" when every node lists the efa provider; else why not, naming the nodes and what they have.
std::string require_efa_verdict(const std::vector<FabricFacts>& nodes);
// Node indices as ranges: {0,1,2,3,5} -> "0-3,5".
std::string node_ranges(const std::vector<int>& nodes);

// Collective over `world` (null: this process alone), whose ranks must be the world ranks. Node
// leaders probe, rank 0 gathers, computes the warnings, prints the report to stderr and returns
// it; other ranks return an empty report. With require_efa and a node lacking the efa provider,
// every rank throws Error with rank 0's verdict.
FabricReport fabric_preflight(Communicator* world, bool require_efa, FabricReportMode mode);

}  // namespace shardlm
