#include "cli/unused_tensors.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <set>

#include "cli/kv_budget.h"  // memory_text
#include "model/checkpoint.h"
#include "parallel/communicator.h"

namespace shardlm {
namespace {

std::string pattern_of(const std::string& name) {
  std::string p;
  for (size_t i = 0; i < name.size();) {
    if (std::isdigit(static_cast<unsigned char>(name[i]))) {
      p += '*';
      while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) ++i;
    } else {
      p += name[i++];
    }
  }
  return p;
}

// N of a "model.layers.N." name; -1 for any other.
int64_t layer_of(const std::string& name) {
  static const std::string kLayers = "model.layers.";
  if (name.compare(0, kLayers.size(), kLayers) != 0) return -1;
  size_t end = kLayers.size();
  int64_t layer = 0;
  while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end])) && layer < (int64_t{1} << 40))
    layer = layer * 10 + (name[end++] - '0');
  return end > kLayers.size() && end < name.size() && name[end] == '.' ? layer : -1;
}

bool is_inv_freq(const std::string& name) {
  return name.size() >= 8 && name.compare(name.size() - 8, 8, "inv_freq") == 0;
}

}  // namespace

std::string name_patterns(const std::vector<std::string>& names, size_t max_groups) {
  struct Group {
    int64_t count = 0;
    std::string first;
    int64_t lo = INT64_MAX, hi = -1;  // the range of the names' first number
  };
  std::map<std::string, Group> groups;
  for (const std::string& n : names) {
    // The first three components ("model.layers.*"): a layer's or an expert's tensors in one group.
    size_t cut = 0;
    for (int dots = 0; dots < 3 && cut != std::string::npos; ++dots) cut = n.find('.', cut == 0 ? 0 : cut + 1);
    Group& g = groups[pattern_of(n.substr(0, cut))];
    if (g.count++ == 0) g.first = n;
    const size_t d = n.find_first_of("0123456789");
    const size_t e = d == std::string::npos ? d : std::min(n.size(), n.find_first_not_of("0123456789", d));
    if (d != std::string::npos && e - d < 19) {
      const int64_t v = std::stoll(n.substr(d, e - d));
      g.lo = std::min(g.lo, v);
      g.hi = std::max(g.hi, v);
    }
  }
  std::vector<std::pair<std::string, Group>> order(groups.begin(), groups.end());
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.second.count > b.second.count; });
  std::string s;
  for (size_t i = 0; i < order.size() && i < max_groups; ++i) {
    const auto& [pattern, g] = order[i];
    std::string what = g.first;
    if (g.count > 1) {
      what = pattern + " (" + std::to_string(g.count) + " tensors";
      if (g.hi >= 0)
        what +=
            ", numbered " + (g.lo == g.hi ? std::to_string(g.lo) : std::to_string(g.lo) + "-" + std::to_string(g.hi));
      what += ", e.g. " + g.first + ")";
    }
    s += (s.empty() ? "" : ", ") + what;
  }
  if (order.size() > max_groups) s += ", and " + std::to_string(order.size() - max_groups) + " more groups";
  return s;
}

UnusedTensors find_unused_tensors(const Checkpoint& ckpt, Communicator* world) {
  // Every rank maps the same files, so the names line up; a rank marks those its shard read and
  // the job keeps the largest mark of each.
  const std::vector<std::string> names = ckpt.all_names();
  std::vector<int32_t> read(names.size());
  for (size_t i = 0; i < names.size(); ++i) read[i] = ckpt.was_read(names[i]) ? 1 : 0;
  if (world) world->all_reduce(read.data(), static_cast<int64_t>(read.size()), CommDType::kI32, ReduceOp::kMax);
  // DeepSeek-V3's multi-token-prediction layers are those with its eh_proj (with enorm, hnorm and a
  // shared head beside a decoder layer's tensors): found by their tensors, not by their number, so a
  // config cut to fewer layers still names its own unread layers.
  std::set<int64_t> mtp_layers;
  for (const std::string& n : names)
    if (n.find(".eh_proj.") != std::string::npos && layer_of(n) >= 0) mtp_layers.insert(layer_of(n));
  UnusedTensors u;
  std::vector<std::string> unexpected;
  for (size_t i = 0; i < names.size(); ++i) {
    if (read[i] || is_inv_freq(names[i]) || mtp_layers.count(layer_of(names[i]))) continue;
    unexpected.push_back(names[i]);
    u.unexpected_bytes += static_cast<int64_t>(ckpt.nbytes_of(names[i]));
  }
  u.unexpected = static_cast<int64_t>(unexpected.size());
  u.summary = name_patterns(unexpected);
  return u;
}

void say_unused_tensors(const UnusedTensors& u, const std::string& model_dir) {
  if (u.unexpected == 0) return;
  std::fprintf(stderr,
               "[shardlm] warning: %lld tensors of %s (%s) are not part of the model its config.json describes, and "
               "no rank read them: %s. A config with fewer layers, experts or heads than the checkpoint runs a "
               "smaller model than the one on disk\n",
               static_cast<long long>(u.unexpected), model_dir.c_str(),
               memory_text(static_cast<double>(u.unexpected_bytes)).c_str(), u.summary.c_str());
}

}  // namespace shardlm
