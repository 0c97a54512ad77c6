#include "parallel/rank_report.h"

#include <sys/resource.h>

#include <cstring>

#include "parallel/communicator.h"

namespace shardlm {

namespace {

// Fixed-size image of a RankRecord for the all-gather.
struct Packed {
  int32_t rank, replica, pp, tp, dp, device;
  char host[64];
  int64_t load_bytes;
  double load_s;
  int64_t peak_rss_bytes, tp_bytes_sent, pp_bytes_sent, replica_bytes_sent, ep_bytes_sent, graph_steps;
  int64_t device_weight_bytes, graph_reruns, device_used_bytes;
};

}  // namespace

int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;  // Linux reports KiB
}

void assign_local_ranks(std::vector<RankRecord>* ranks) {
  for (size_t i = 0; i < ranks->size(); ++i) {
    int32_t before = 0;
    for (size_t j = 0; j < i; ++j) before += (*ranks)[j].host == (*ranks)[i].host;
    (*ranks)[i].local_rank = before;
  }
}

std::vector<RankRecord> gather_rank_records(Communicator* world, const RankRecord& mine) {
  if (!world) {
    std::vector<RankRecord> one{mine};
    assign_local_ranks(&one);
    return one;
  }
  Packed p{};
  p.rank = mine.rank;
  p.replica = mine.replica;
  p.pp = mine.pp;
  p.tp = mine.tp;
  p.dp = mine.dp;
  p.device = mine.device;
  std::strncpy(p.host, mine.host.c_str(), sizeof p.host - 1);
  p.load_bytes = mine.load_bytes;
  p.load_s = mine.load_s;
  p.peak_rss_bytes = mine.peak_rss_bytes;
  p.tp_bytes_sent = mine.tp_bytes_sent;
  p.pp_bytes_sent = mine.pp_bytes_sent;
  p.replica_bytes_sent = mine.replica_bytes_sent;
  p.ep_bytes_sent = mine.ep_bytes_sent;
  p.graph_steps = mine.graph_steps;
  p.graph_reruns = mine.graph_reruns;
  p.device_weight_bytes = mine.device_weight_bytes;
  p.device_used_bytes = mine.device_used_bytes;
  std::vector<Packed> all(static_cast<size_t>(world->size()));
  world->all_gather(&p, all.data(), sizeof p, CommDType::kU8);
  std::vector<RankRecord> out;
  for (const Packed& q : all) {
    RankRecord r;
    r.rank = q.rank;
    r.replica = q.replica;
    r.pp = q.pp;
    r.tp = q.tp;
    r.dp = q.dp;
    r.device = q.device;
    r.host = std::string(q.host, strnlen(q.host, sizeof q.host));
    r.load_bytes = q.load_bytes;
    r.load_s = q.load_s;
    r.peak_rss_bytes = q.peak_rss_bytes;
    r.tp_bytes_sent = q.tp_bytes_sent;
    r.pp_bytes_sent = q.pp_bytes_sent;
    r.replica_bytes_sent = q.replica_bytes_sent;
    r.ep_bytes_sent = q.ep_bytes_sent;
    r.graph_steps = q.graph_steps;
    r.graph_reruns = q.graph_reruns;
    r.device_weight_bytes = q.device_weight_bytes;
    r.device_used_bytes = q.device_used_bytes;
    out.push_back(r);
  }
  assign_local_ranks(&out);
  return out;
}

}  // namespace shardlm
