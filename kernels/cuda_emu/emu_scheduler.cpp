// Blocks run one after another; a block's threads are fibers (emu_context.h) on the calling host
// thread.
// A fiber runs until it waits at a barrier or returns; when every fiber is waiting or done, the
// barriers whose members have all arrived are released. See cuda_runtime.h for the model.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_runtime.h"
#include "emu_context.h"
#include "emu_state.h"

namespace shardlm_emu {
namespace {

// Kernels keep their per-thread arrays (accumulators, staged keys) on this stack.
constexpr size_t kStackBytes = 256 * 1024;
constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr size_t kDefaultDynamicShared = 48 * 1024;
constexpr size_t kMaxDynamicShared = 227 * 1024;  // an H200's opt-in limit per block

enum class Wait { None, Block, Warp, Done };

struct Fiber {
  Context ctx;
  Wait wait = Wait::None;
  uint3 tid{};
  // At a warp intrinsic: what it is, its member mask, and for a shuffle the source lane.
  WarpOp op = WarpOp::Sync;
  const char* what = nullptr;
  unsigned mask = 0, src = 0;
  uint64_t result = 0;  // the intrinsic's result, set at release
  void (*collective)(void* const*) = nullptr;  // WarpOp::Collective: what the warp computes
  // cp.async copies queued and not yet landed, oldest first (src null: zeros), and for each
  // committed group the count of them through its last.
  struct AsyncCopy {
    void* dst;
    const void* src;
    size_t bytes;
  };
  std::vector<AsyncCopy> copies;
  std::vector<size_t> groups;
};

struct Warp {
  std::array<uint64_t, 32> posted{};
  unsigned arrived = 0;  // lanes waiting at a warp intrinsic
  unsigned exited = 0;   // lanes that have returned (or do not exist: a partial last warp)
  // Asynchronous tensor-core work (wgmma) queued and not yet run, oldest first, and for each
  // committed group the count of it through its last.
  struct AsyncOp {
    std::function<void()> run;
    std::vector<std::pair<uint32_t, uint32_t>> reads;  // shared-window ranges [lo, hi) it reads
  };
  std::vector<AsyncOp> async_ops;
  std::vector<size_t> async_groups;
};

struct BlockRun {
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  // The turn: fiber order[k] runs after order[k - 1]; pos inverts order.
  std::vector<unsigned> order, pos;
  Schedule schedule = Schedule::Forward;
  std::mt19937_64 rng;
  size_t at_block_barrier = 0, done = 0;
  uint3 bid{};
  dim3 bdim, gdim;
  int current = -1;
  Context sched;
  void (*call)(void*) = nullptr;
  void* body = nullptr;
  void* shared = nullptr;
  size_t shared_bytes = 0;                      // of dynamic shared memory, from `shared`
  std::vector<std::pair<void*, size_t>> fresh;  // the static __shared__ variables this block has filled
  std::string error;
};

thread_local BlockRun* g_run = nullptr;

std::vector<std::unique_ptr<char[]>>& stacks() {
  thread_local std::vector<std::unique_ptr<char[]>> pool;
  return pool;
}

std::map<const void*, size_t>& dynamic_limits() {
  static std::map<const void*, size_t> limits;
  return limits;
}

size_t current() { return static_cast<size_t>(g_run->current); }
Fiber& me() { return g_run->fibers[current()]; }

// The next thread that can run, after `from` in turn, or -1. (Entered at every switch: no
// division, which took a quarter of this function's time.)
int next_runnable(const BlockRun& r, size_t from) {
  const size_t n = r.fibers.size();
  size_t p = r.pos[from];
  for (size_t k = 1; k <= n; ++k) {
    if (++p == n) p = 0;
    const unsigned j = r.order[p];
    if (r.fibers[j].wait == Wait::None) return static_cast<int>(j);
  }
  return -1;
}

// A new turn for the threads: at the start of a block, and under Shuffle at every block barrier.
void new_turn(BlockRun& r) {
  const size_t n = r.fibers.size();
  r.order.resize(n);
  r.pos.resize(n);
  std::iota(r.order.begin(), r.order.end(), 0u);
  if (r.schedule == Schedule::Reverse) std::reverse(r.order.begin(), r.order.end());
  if (r.schedule == Schedule::Shuffle) std::shuffle(r.order.begin(), r.order.end(), r.rng);
  for (size_t k = 0; k < n; ++k) r.pos[r.order[k]] = static_cast<unsigned>(k);
}

// Switches straight to the next runnable thread (half the switches of going through the
// scheduler); to the scheduler when none can run or an error stopped the block.
void switch_away(Fiber& from) {
  BlockRun& r = *g_run;
  const int next = r.error.empty() ? next_runnable(r, current()) : -1;
  if (next < 0) {
    switch_context(from.ctx, r.sched);
    return;
  }
  if (&r.fibers[static_cast<size_t>(next)] == &from) return;  // released while arriving: go on
  r.current = next;
  switch_context(from.ctx, r.fibers[static_cast<size_t>(next)].ctx);
}

void yield() { switch_away(me()); }

std::string where(const BlockRun& r, size_t i) {
  const Fiber& f = r.fibers[i];
  std::ostringstream s;
  s << "block (" << r.bid.x << "," << r.bid.y << "," << r.bid.z << ") thread (" << f.tid.x << "," << f.tid.y << ","
    << f.tid.z << ")";
  return s.str();
}

void fail(const std::string& msg) {
  if (g_run->error.empty()) g_run->error = msg;
}

bool same_intrinsic(const Fiber& a, const Fiber& b) {
  return a.op == b.op && a.mask == b.mask && a.collective == b.collective &&
         (a.what == b.what || std::strcmp(a.what, b.what) == 0);
}

// Called by the last member of a warp group to arrive: checks that the members met at the same
// intrinsic, computes each member's result and lets them go on.
__attribute__((noinline)) void release_warp(BlockRun& r, size_t w, unsigned mask, size_t caller) {
  Warp& warp = r.warps[w];
  const Fiber& f = r.fibers[caller];
  for (unsigned l = 0; l < 32; ++l) {
    if (!((mask >> l) & 1u)) continue;
    const Fiber& g = r.fibers[w * 32 + l];
    if (!same_intrinsic(f, g)) {
      fail(where(r, caller) + " and " + where(r, w * 32 + l) + " met at different warp intrinsics: " + f.what +
           " (mask " + std::to_string(f.mask) + ") and " + g.what + " (mask " + std::to_string(g.mask) + ")");
      return;
    }
  }
  if (f.op == WarpOp::Collective) {
    // Every member waits here, so its operands (on its own stack) stay put while this runs.
    void* lanes[32] = {};
    for (unsigned l = 0; l < 32; ++l)
      if ((mask >> l) & 1u) lanes[l] = from_bits<void*>(warp.posted[l]);
    f.collective(lanes);
  }
  for (unsigned l = 0; l < 32; ++l) {
    if (!((mask >> l) & 1u)) continue;
    Fiber& g = r.fibers[w * 32 + l];
    switch (g.op) {
      case WarpOp::Collective:
      case WarpOp::Sync:
        g.result = 0;
        break;
      case WarpOp::Shuffle:
        if (!((mask >> g.src) & 1u)) {
          fail(where(r, w * 32 + l) + ": " + g.what + " reads lane " + std::to_string(g.src) +
               ", which is not in its mask " + std::to_string(mask));
          return;
        }
        g.result = warp.posted[g.src];
        break;
      case WarpOp::MatchAny: {
        unsigned same = 0;
        for (unsigned m = 0; m < 32; ++m)
          if (((mask >> m) & 1u) && warp.posted[m] == warp.posted[l]) same |= 1u << m;
        g.result = same;
        break;
      }
    }
    g.wait = Wait::None;
  }
  warp.arrived &= ~mask;
}

void release_block(BlockRun& r) {
  for (Fiber& f : r.fibers)
    if (f.wait == Wait::Block) f.wait = Wait::None;
  r.at_block_barrier = 0;
  if (r.schedule == Schedule::Shuffle) new_turn(r);
}

// The first n queued copies of f land.
void land_copies(Fiber& f, size_t n) {
  for (size_t k = 0; k < n; ++k) {
    const Fiber::AsyncCopy& c = f.copies[k];
    if (c.src != nullptr)
      std::memcpy(c.dst, c.src, c.bytes);
    else
      std::memset(c.dst, 0, c.bytes);
  }
  f.copies.erase(f.copies.begin(), f.copies.begin() + static_cast<std::ptrdiff_t>(n));
}

// A lane has returned: a warp group waiting for it can never complete. (A block barrier completes
// without the threads that returned, as on the device since Volta.)
void on_exit(BlockRun& r, size_t i) {
  Fiber& f = r.fibers[i];
  land_copies(f, f.copies.size());
  f.groups.clear();
  f.wait = Wait::Done;
  ++r.done;
  Warp& warp = r.warps[i / 32];
  const unsigned bit = 1u << (i % 32);
  warp.exited |= bit;
  for (unsigned l = 0; l < 32; ++l) {
    const size_t j = (i / 32) * 32 + l;
    if (((warp.arrived >> l) & 1u) && (r.fibers[j].mask & bit)) {
      fail(where(r, j) + ": " + r.fibers[j].what + " names lane " + std::to_string(i % 32) +
           " of its warp, which has exited");
      return;
    }
  }
  if (r.at_block_barrier > 0 && r.at_block_barrier + r.done == r.fibers.size()) release_block(r);
}

void entry() {
  BlockRun& r = *g_run;
  try {
    r.call(r.body);
  } catch (const std::exception& e) {
    fail(where(r, current()) + ": " + e.what());
  }
  on_exit(r, current());
  mark_exiting(r.fibers[current()].ctx);
  switch_away(r.fibers[current()]);  // never resumed
  __builtin_unreachable();
}

// Which barriers the threads wait at: "16 threads wait at __syncthreads (first: block (0,0,0)
// thread (0,0,0)), 16 threads wait at __syncwarp (...)".
std::string deadlock_report(const BlockRun& r) {
  std::vector<std::pair<std::string, std::pair<size_t, size_t>>> kinds;  // barrier, (count, first)
  for (size_t i = 0; i < r.fibers.size(); ++i) {
    const Fiber& f = r.fibers[i];
    if (f.wait == Wait::Done) continue;
    const std::string at = f.wait == Wait::Block ? "__syncthreads" : f.what;
    auto it = std::find_if(kinds.begin(), kinds.end(), [&](const auto& k) { return k.first == at; });
    if (it == kinds.end())
      kinds.push_back({at, {1, i}});
    else
      ++it->second.first;
  }
  std::ostringstream s;
  s << "deadlock: no thread can go on; ";
  for (size_t k = 0; k < kinds.size(); ++k)
    s << (k ? ", " : "") << kinds[k].second.first << " threads wait at " << kinds[k].first
      << " (first: " << where(r, kinds[k].second.second) << ")";
  s << "; " << r.done << " of " << r.fibers.size() << " threads have returned";
  return s.str();
}

void run_block(BlockRun& r) {
  const size_t n = r.fibers.size();
  auto& pool = stacks();
  while (pool.size() < n) pool.emplace_back(new char[kStackBytes]);
  for (size_t i = 0; i < n; ++i) {
    r.fibers[i].wait = Wait::None;
    r.fibers[i].copies.clear();  // a failed block's (a finished one's have landed)
    r.fibers[i].groups.clear();
    // Stack tops kStackBytes apart would share cache sets (every resumption would miss); each
    // starts a different number of cache lines below its end.
    prepare_context(r.fibers[i].ctx, pool[i].get(), kStackBytes - (i % 64) * 192, entry);
  }
  for (size_t w = 0; w < r.warps.size(); ++w) {
    r.warps[w].arrived = 0;
    r.warps[w].async_ops.clear();  // never waited for: its results never land
    r.warps[w].async_groups.clear();
    // Lanes past the block's last thread never arrive anywhere.
    const size_t lanes = n - w * 32 < 32 ? n - w * 32 : 32;
    r.warps[w].exited = lanes == 32 ? 0u : ~((1u << lanes) - 1u);
  }
  r.at_block_barrier = 0;
  r.done = 0;
  if (r.schedule != Schedule::Forward || r.order.size() != n) new_turn(r);
  // The threads switch among themselves (switch_away) and come back here when none can run.
  r.current = static_cast<int>(r.order[0]);
  switch_context(r.sched, r.fibers[r.order[0]].ctx);
  if (r.done < n && r.error.empty()) fail(deadlock_report(r));
  r.current = -1;
}

cudaError_t check_config(const LaunchConfig& c, std::string& why) {
  const uint64_t threads = uint64_t{c.block.x} * c.block.y * c.block.z;
  if (threads == 0 || threads > kMaxThreadsPerBlock || c.block.z > 64) {
    why = "block of " + std::to_string(threads) + " threads (at most 1024, z at most 64)";
    return cudaErrorInvalidConfiguration;
  }
  if (c.grid.x == 0 || c.grid.y == 0 || c.grid.z == 0 || c.grid.y > 65535 || c.grid.z > 65535 ||
      c.grid.x > 0x7fffffffu) {
    why = "grid (" + std::to_string(c.grid.x) + "," + std::to_string(c.grid.y) + "," + std::to_string(c.grid.z) + ")";
    return cudaErrorInvalidConfiguration;
  }
  auto it = dynamic_limits().find(c.fn);
  const size_t limit = it == dynamic_limits().end() ? kDefaultDynamicShared : it->second;
  if (c.shared_bytes > limit) {
    why = std::to_string(c.shared_bytes) + " bytes of dynamic shared memory, above the kernel's limit of " +
          std::to_string(limit) + (limit == kDefaultDynamicShared ? " (no cudaFuncSetAttribute opt-in)" : "");
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

struct ScheduleState {
  std::atomic<Schedule> kind{Schedule::Forward};
  std::atomic<uint64_t> seed{0};
  std::atomic<uint64_t> launches{0};
  ScheduleState() {
    const char* v = std::getenv("SHARDLM_EMU_SCHEDULE");
    if (v == nullptr || *v == 0 || std::strcmp(v, "forward") == 0) return;
    if (std::strcmp(v, "reverse") == 0) {
      kind = Schedule::Reverse;
      return;
    }
    if (std::strncmp(v, "shuffle", 7) == 0 && (v[7] == 0 || v[7] == ':')) {
      char* end = nullptr;
      const uint64_t n = v[7] == 0 ? 1 : std::strtoull(v + 8, &end, 10);
      if (v[7] == 0 || (end != v + 8 && *end == 0)) {
        kind = Schedule::Shuffle;
        seed = n;
        return;
      }
    }
    std::fprintf(stderr,
                 "cuda emulation: SHARDLM_EMU_SCHEDULE=%s: expected forward, reverse, shuffle or shuffle:SEED\n", v);
    std::exit(2);
  }
};

ScheduleState& schedule_state() {
  static ScheduleState s;
  return s;
}

// The n-th block to run of a grid of `blocks`, as a linear index: upwards, downwards, or by the
// stride permutation i -> (a i + c) mod blocks with a coprime to blocks (no table for 2^31 blocks).
struct GridOrder {
  Schedule kind;
  uint64_t blocks, a = 1, c = 0;
  GridOrder(Schedule k, uint64_t n, std::mt19937_64& rng) : kind(k), blocks(n) {
    if (kind != Schedule::Shuffle || n < 2) return;
    c = rng() % n;
    a = rng() % n;
    while (std::gcd(a, n) != 1) a = (a + 1) % n;
  }
  uint64_t operator()(uint64_t i) const {
    if (kind == Schedule::Reverse) return blocks - 1 - i;
    if (kind == Schedule::Shuffle && blocks > 1)
      return static_cast<uint64_t>((static_cast<unsigned __int128>(a) * i + c) % blocks);
    return i;
  }
};

}  // namespace

void set_schedule(Schedule s, uint64_t seed) {
  schedule_state().kind = s;
  schedule_state().seed = seed;
  schedule_state().launches = 0;  // the same launches after the same seed take the same turns
}
Schedule schedule() { return schedule_state().kind; }

const uint3& thread_idx() { return me().tid; }
const uint3& block_idx() { return g_run->bid; }
const dim3& block_dim() { return g_run->bdim; }
const dim3& grid_dim() { return g_run->gdim; }
void* dynamic_shared() { return g_run->shared; }

void fresh_shared(void* p, size_t bytes) {
  std::vector<std::pair<void*, size_t>>& seen = g_run->fresh;
  for (const auto& v : seen)
    if (v.first == p) return;
  std::memset(p, 0xff, bytes);
  seen.emplace_back(p, bytes);
}

bool in_shared(const void* p, size_t bytes) {
  const auto within = [&](const void* base, size_t n) {
    const auto* b = static_cast<const unsigned char*>(base);
    const auto* q = static_cast<const unsigned char*>(p);
    return q >= b && q + bytes <= b + n;
  };
  if (within(g_run->shared, g_run->shared_bytes)) return true;
  for (const auto& v : g_run->fresh)
    if (within(v.first, v.second)) return true;
  return false;
}

uint32_t shared_address(const void* p) {
  const auto* q = static_cast<const unsigned char*>(p);
  const auto* b = static_cast<const unsigned char*>(g_run->shared);
  if (q < b || q >= b + g_run->shared_bytes)
    throw std::runtime_error("a shared-window address of memory outside the block's dynamic shared memory");
  return static_cast<uint32_t>(q - b);
}

const unsigned char* shared_at(uint32_t addr, size_t bytes) {
  if (static_cast<size_t>(addr) + bytes > g_run->shared_bytes)
    throw std::runtime_error("shared-window address " + std::to_string(addr) + " (" + std::to_string(bytes) +
                             " bytes) past the block's " + std::to_string(g_run->shared_bytes) +
                             " bytes of dynamic shared memory");
  return static_cast<const unsigned char*>(g_run->shared) + addr;
}

namespace {
Warp& collective_warp() { return g_run->warps[current() / 32]; }
}  // namespace

void warp_async_push(std::function<void()> op, std::vector<std::pair<uint32_t, uint32_t>> reads) {
  collective_warp().async_ops.push_back({std::move(op), std::move(reads)});
}

void warp_async_commit() {
  Warp& w = collective_warp();
  w.async_groups.push_back(w.async_ops.size());
}

void warp_async_wait(unsigned n) {
  Warp& w = collective_warp();
  if (w.async_groups.size() <= n) return;
  const size_t done = w.async_groups.size() - n, ops = w.async_groups[done - 1];
  // Moved out first: an op may throw, and the queue must not run it twice.
  std::vector<Warp::AsyncOp> run(std::make_move_iterator(w.async_ops.begin()),
                                 std::make_move_iterator(w.async_ops.begin() + static_cast<std::ptrdiff_t>(ops)));
  w.async_ops.erase(w.async_ops.begin(), w.async_ops.begin() + static_cast<std::ptrdiff_t>(ops));
  w.async_groups.erase(w.async_groups.begin(), w.async_groups.begin() + static_cast<std::ptrdiff_t>(done));
  for (size_t& g : w.async_groups) g -= ops;
  for (auto& op : run) op.run();
}

unsigned lane_id() { return static_cast<unsigned>(g_run->current) & 31u; }

void async_copy(void* dst, const void* src, size_t bytes) {
  if (!in_shared(dst, bytes)) throw std::runtime_error("cp.async to an address outside the block's shared memory");
  if (src != nullptr && in_shared(src, bytes)) throw std::runtime_error("cp.async from shared memory");
  // Into memory a tensor-core product in flight reads: on the device the copy may land first.
  const auto* d = static_cast<const unsigned char*>(dst);
  const auto* base = static_cast<const unsigned char*>(g_run->shared);
  if (d >= base && d < base + g_run->shared_bytes) {
    const auto lo = static_cast<uint32_t>(d - base), hi = lo + static_cast<uint32_t>(bytes);
    for (size_t w = 0; w < g_run->warps.size(); ++w)
      for (const Warp::AsyncOp& op : g_run->warps[w].async_ops)
        for (const auto& r : op.reads)
          if (lo < r.second && r.first < hi)
            throw std::runtime_error("cp.async into shared memory (bytes " + std::to_string(lo) + ".." +
                                     std::to_string(hi) + ") that a wgmma of warp " + std::to_string(w) +
                                     " not yet waited for reads");
  }
  me().copies.push_back({dst, src, bytes});
}

void async_commit() {
  Fiber& f = me();
  f.groups.push_back(f.copies.size());
}

void async_wait_group(unsigned n) {
  Fiber& f = me();
  if (f.groups.size() <= n) return;
  const size_t landed = f.groups.size() - n, copies = f.groups[landed - 1];
  land_copies(f, copies);
  f.groups.erase(f.groups.begin(), f.groups.begin() + static_cast<std::ptrdiff_t>(landed));
  for (size_t& g : f.groups) g -= copies;
}

void syncthreads() {
  BlockRun& r = *g_run;
  me().wait = Wait::Block;
  if (++r.at_block_barrier + r.done == r.fibers.size()) {
    release_block(r);  // the last to arrive: go on
    return;
  }
  yield();
}

namespace {
// Out of line, so that warp_meet's frame stays small: it is entered at every warp intrinsic.
__attribute__((noinline, cold)) void bad_mask(BlockRun& r, size_t i, unsigned mask, const char* what) {
  const size_t w = i / 32;
  const unsigned lane = static_cast<unsigned>(i % 32);
  if (!((mask >> lane) & 1u)) {
    fail(where(r, i) + ": " + what + " with a mask that leaves out the lane itself");
    return;
  }
  const unsigned l = static_cast<unsigned>(__builtin_ctz(mask & r.warps[w].exited));
  fail(where(r, i) + ": " + what + " names lane " + std::to_string(l) + " of its warp, which " +
       (w * 32 + l >= r.fibers.size() ? "does not exist" : "has exited"));
}
}  // namespace

uint64_t warp_meet(WarpOp op, unsigned mask, uint64_t value, unsigned src, const char* what) {
  BlockRun& r = *g_run;
  const size_t i = current(), w = i / 32;
  const unsigned lane = static_cast<unsigned>(i % 32);
  Fiber& f = r.fibers[i];
  Warp& warp = r.warps[w];
  f.wait = Wait::Warp;
  if (__builtin_expect(!((mask >> lane) & 1u) || (mask & warp.exited) != 0, 0)) {
    bad_mask(r, i, mask, what);
    yield();  // the scheduler stops at the error and never resumes this thread
  }
  warp.posted[lane] = value;
  f.op = op;
  f.what = what;
  f.mask = mask;
  f.src = src;
  warp.arrived |= 1u << lane;
  if ((warp.arrived & mask) == mask) release_warp(r, w, mask, i);  // the last member to arrive
  if (f.wait != Wait::None) yield();
  return f.result;
}

void warp_collective(void (*fn)(void* const* lanes), void* mine, unsigned mask, const char* what) {
  g_run->fibers[current()].collective = fn;
  warp_meet(WarpOp::Collective, mask, to_bits(mine), 0, what);
  g_run->fibers[current()].collective = nullptr;
}

void launch_erased(const LaunchConfig& cfg, void (*call)(void*), void* body) {
  if (g_run != nullptr) {
    set_error(cudaErrorLaunchFailure, std::string(cfg.name) + ": launched from inside a kernel");
    return;
  }
  std::string why;
  const cudaError_t bad = check_config(cfg, why);
  if (bad != cudaSuccess) {
    set_error(bad, std::string("launch of ") + cfg.name + ": " + why);
    return;
  }
  // Shared memory starts as NaN bytes, so a read of a word never written shows up in the results.
  std::vector<unsigned char> shared(cfg.shared_bytes + 16, 0xff);
  BlockRun r;
  ScheduleState& sched = schedule_state();
  r.schedule = sched.kind;
  r.rng.seed(sched.seed ^ (0x9e3779b97f4a7c15ull * ++sched.launches));
  r.bdim = cfg.block;
  r.gdim = cfg.grid;
  r.call = call;
  r.body = body;
  r.shared = shared.data();
  r.shared_bytes = cfg.shared_bytes;
  const unsigned threads = cfg.block.x * cfg.block.y * cfg.block.z;
  r.fibers.resize(threads);
  r.warps.resize((threads + 31) / 32);
  for (unsigned i = 0; i < threads; ++i)
    r.fibers[i].tid = uint3{i % cfg.block.x, (i / cfg.block.x) % cfg.block.y, i / (cfg.block.x * cfg.block.y)};
  g_run = &r;
  const uint64_t gx = cfg.grid.x, gxy = gx * cfg.grid.y, blocks = gxy * cfg.grid.z;
  const GridOrder grid_order(r.schedule, blocks, r.rng);
  for (uint64_t i = 0; i < blocks && r.error.empty(); ++i) {
    const uint64_t b = grid_order(i);
    r.bid = uint3{static_cast<unsigned>(b % gx), static_cast<unsigned>(b % gxy / gx), static_cast<unsigned>(b / gxy)};
    // A block reads no shared memory another left: on the device that is whatever was there.
    if (i > 0) std::memset(shared.data(), 0xff, shared.size());
    r.fresh.clear();
    run_block(r);
  }
  g_run = nullptr;
  if (!r.error.empty()) {
    const std::string msg = std::string("kernel ") + cfg.name + ": " + r.error;
    std::fprintf(stderr, "cuda emulation: %s\n", msg.c_str());
    set_error(cudaErrorLaunchFailure, msg);
  }
}

cudaError_t func_set_attribute(const void* fn, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaErrorInvalidValue;
  if (value < 0 || static_cast<size_t>(value) > kMaxDynamicShared) return cudaErrorInvalidValue;
  dynamic_limits()[fn] = static_cast<size_t>(value);
  return cudaSuccess;
}

size_t max_dynamic_shared() { return kMaxDynamicShared; }

}  // namespace shardlm_emu
