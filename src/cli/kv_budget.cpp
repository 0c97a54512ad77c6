#include "cli/kv_budget.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <iomanip>
#include <sstream>
#include <vector>

#include "core/error.h"

namespace shardlm {

double parse_kv_cache_gib(const std::string& text) {
  if (text == "auto") return 0;
  size_t used = 0;
  double gib = 0;
  try {
    gib = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  SHARDLM_CHECK(used == text.size() && used > 0 && gib > 0 && std::isfinite(gib),
                "--kv-cache-gb must be auto or a positive number of GiB, not '" << text << "'");
  return gib;
}

std::string memory_text(double bytes) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(1);
  if (bytes >= double(1ull << 30)) {
    s << bytes / double(1ull << 30) << " GiB";
  } else {
    s << bytes / double(1ull << 20) << " MiB";
  }
  return s.str();
}

int ranks_sharing_gpu(Communicator* world, const NodeLocal& node, int gpu) {
  if (world == nullptr) return 1;
  const int32_t mine[2] = {node.node, gpu};
  std::vector<int32_t> all(2 * static_cast<size_t>(world->size()));
  world->all_gather(mine, all.data(), 2, CommDType::kI32);
  int n = 0;
  for (size_t r = 0; r < all.size(); r += 2) n += all[r] == mine[0] && all[r + 1] == mine[1];
  return std::max(n, 1);
}

bool kv_budget_profiles(const std::string& kv_cache_gb, const ComputeBackend& backend) {
  size_t free_b = 0, total_b = 0;
  return parse_kv_cache_gib(kv_cache_gb) == 0 && backend.device_memory(&free_b, &total_b);
}

KvBudget kv_cache_budget(const std::string& kv_cache_gb, double free_fraction, const ComputeBackend& backend,
                         int sharing, const ProfileResult& profile) {
  if (const double gib = parse_kv_cache_gib(kv_cache_gb); gib > 0) {
    return {static_cast<int64_t>(gib * double(1ull << 30)), "--kv-cache-gb", {}};
  }
  size_t free_b = 0, total_b = 0;
  if (!backend.device_memory(&free_b, &total_b)) return {int64_t{4} << 30, "auto: 4 GiB on the CPU", {}};
  const auto bytes = static_cast<int64_t>(free_fraction * static_cast<double>(free_b) / std::max(sharing, 1));
  std::ostringstream how;
  how << "auto: " << free_fraction << " of the " << memory_text(static_cast<double>(free_b)) << " of "
      << memory_text(static_cast<double>(total_b)) << " free after loading";
  if (profile.tokens > 0) {
    how << " and the profile steps (" << profile.tokens << " tokens";
    if (profile.grew_bytes >= 0) how << ", " << memory_text(static_cast<double>(profile.grew_bytes)) << " kept";
    how << ")";
  }
  if (sharing > 1) how << ", shared by " << sharing << " ranks";
  SHARDLM_CHECK(bytes > 0, "--kv-cache-gb auto: no device memory is free after loading the weights"
                               << (profile.tokens > 0 ? " and running the profile steps" : "") << " (" << free_b
                               << " of " << total_b << " bytes free); use a layout with more ranks"
                               << (profile.tokens > 0 ? " or a smaller --max-batch-tokens" : ""));
  return {bytes, how.str(), profile};
}

}  // namespace shardlm
