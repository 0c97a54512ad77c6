// shardlm bench-comm: bandwidth and correctness of the communicator's collectives and ring
// send/recv, size by size, in the format of nccl-tests (time, algorithm and bus bandwidth,
// #wrong), so that the same nodes can be compared with all_reduce_perf & co.
//
//   mpirun -np N shardlm bench-comm [--comm mpi|fabric|nccl] [--buffers auto|host|device] [--op all] [--max-bytes 64M]
//
// Each rank binds the GPU of its local rank first. With --comm nccl the buffers are device memory
// (allocated through the communicator's memory space; the input pattern is copied in and the
// results copied back for the check), so the figures are NCCL's. With mpi or fabric they are host
// memory, or with --buffers device (on a GPU) device memory staged through pinned host buffers.
#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "cli/bench_comm.h"
#include "cli/commands.h"
#include "cli/subcommand.h"
#include "core/error.h"
#include "parallel/communicator.h"
#include "parallel/gpu_binding.h"
#include "parallel/memory_space.h"
#include "parallel/mpi_env.h"
#include "parallel/node_local.h"

namespace po = boost::program_options;

namespace shardlm {

namespace bench_comm {

const char* op_name(Op op) {
  switch (op) {
    case Op::kAllReduce: return "all_reduce";
    case Op::kAllGather: return "all_gather";
    case Op::kReduceScatter: return "reduce_scatter";
    case Op::kAllToAll: return "all_to_all";
    case Op::kSendRecv: return "sendrecv";
  }
  return "?";
}

const char* nccl_tests_binary(Op op) {
  switch (op) {
    case Op::kAllReduce: return "all_reduce_perf";
    case Op::kAllGather: return "all_gather_perf";
    case Op::kReduceScatter: return "reduce_scatter_perf";
    case Op::kAllToAll: return "alltoall_perf";
    case Op::kSendRecv: return "sendrecv_perf";
  }
  return "?";
}

namespace {
const Op kAllOps[] = {Op::kAllReduce, Op::kAllGather, Op::kReduceScatter, Op::kAllToAll, Op::kSendRecv};
}

std::vector<Op> parse_ops(const std::string& text) {
  if (text == "all") return std::vector<Op>(std::begin(kAllOps), std::end(kAllOps));
  std::vector<Op> ops;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const std::string name = text.substr(start, end - start);
    bool found = false;
    for (Op op : kAllOps) {
      if (name == op_name(op)) {
        ops.push_back(op);
        found = true;
      }
    }
    SHARDLM_CHECK(found, "--op: unknown operation '" << name
                                                      << "' (all, all_reduce, all_gather, reduce_scatter, all_to_all, sendrecv)");
    start = end + 1;
  }
  return ops;
}

uint64_t parse_size(const std::string& text, const std::string& option) {
  auto bad = [&]() { SHARDLM_FAIL(option << ": cannot read '" << text << "' as a size in bytes (digits with an optional K, M or G suffix)"); };
  size_t i = 0;
  uint64_t v = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
    const uint64_t d = static_cast<uint64_t>(text[i] - '0');
    if (v > (UINT64_MAX - d) / 10) bad();
    v = v * 10 + d;
    ++i;
  }
  if (i == 0) bad();
  unsigned shift = 0;
  if (i < text.size()) {
    switch (text[i]) {
      case 'K': case 'k': shift = 10; break;
      case 'M': case 'm': shift = 20; break;
      case 'G': case 'g': shift = 30; break;
      default: bad();
    }
    if (++i != text.size()) bad();
  }
  if (shift && v > (UINT64_MAX >> shift)) bad();
  return v << shift;
}

double bus_factor(Op op, int n) {
  SHARDLM_CHECK(n >= 1, "bus_factor: " << n << " ranks");
  switch (op) {
    case Op::kAllReduce: return 2.0 * (n - 1) / n;
    case Op::kAllGather:
    case Op::kReduceScatter:
    case Op::kAllToAll: return static_cast<double>(n - 1) / n;
    case Op::kSendRecv: return 1.0;
  }
  return 0;
}

namespace {
bool blocked(Op op) { return op == Op::kAllGather || op == Op::kReduceScatter || op == Op::kAllToAll; }
}  // namespace

uint64_t block_count(Op op, int n, uint64_t bytes, size_t es) {
  return blocked(op) ? bytes / (es * static_cast<uint64_t>(n)) : bytes / es;
}

uint64_t size_bytes(Op op, int n, uint64_t block, size_t es) {
  return (blocked(op) ? block * static_cast<uint64_t>(n) : block) * es;
}

uint64_t send_elems(Op op, int n, uint64_t block) {
  return op == Op::kReduceScatter || op == Op::kAllToAll ? block * static_cast<uint64_t>(n) : block;
}

uint64_t recv_elems(Op op, int n, uint64_t block) {
  return op == Op::kAllGather || op == Op::kAllToAll ? block * static_cast<uint64_t>(n) : block;
}

int input_value(int rank, uint64_t index) {
  const uint64_t h = index * 2654435761ull + static_cast<uint64_t>(rank) * 40503ull + (index >> 5) + 11;
  return static_cast<int>(h % 17) - 8;
}

int64_t expected_value(Op op, int n, int rank, uint64_t block, uint64_t index) {
  int64_t s = 0;
  switch (op) {
    case Op::kAllReduce:
      for (int q = 0; q < n; ++q) s += input_value(q, index);
      return s;
    case Op::kAllGather:  // block b of the output is rank b's input
      return input_value(static_cast<int>(index / block), index % block);
    case Op::kReduceScatter:  // this rank's block of every rank's input, summed
      for (int q = 0; q < n; ++q) s += input_value(q, static_cast<uint64_t>(rank) * block + index);
      return s;
    case Op::kAllToAll:  // block b of the output is block `rank` of rank b's input
      return input_value(static_cast<int>(index / block), static_cast<uint64_t>(rank) * block + index % block);
    case Op::kSendRecv:
      return input_value((rank + n - 1) % n, index);
  }
  return 0;
}

}  // namespace bench_comm

namespace {

using namespace bench_comm;
using Clock = std::chrono::steady_clock;

struct Options {
  std::vector<Op> ops;
  uint64_t min_bytes = 8, max_bytes = 64ull << 20;
  int step = 2, iters = 20, warmup = 5;
  bool check = true, inject_wrong = false;
  MemorySpace* device = nullptr;  // device buffers (--buffers device): the communicator's memory
  std::string min_text, max_text;
};

struct Row {
  double busbw = 0;
  int64_t wrong = 0;
};

template <typename T>
CommDType dtype_of() {
  return std::is_same_v<T, float> ? CommDType::kF32 : CommDType::kI32;
}

// The input and output of one size: host vectors, and for device runs their device copies (in the
// communicator's device memory), which are what the communicator sees.
template <typename T>
class Buffers {
 public:
  Buffers(size_t send_n, size_t recv_n, MemorySpace* device) : send(send_n), recv(recv_n), device_(device) {
    if (device_) {
      dsend_ = static_cast<T*>(device_->alloc_device(send_n * sizeof(T)));
      drecv_ = static_cast<T*>(device_->alloc_device(recv_n * sizeof(T)));
    }
  }
  ~Buffers() {
    if (device_) {
      device_->free_device(dsend_);
      device_->free_device(drecv_);
    }
  }
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;

  const T* send_ptr() const { return device_ ? dsend_ : send.data(); }
  T* recv_ptr() { return device_ ? drecv_ : recv.data(); }
  // Host vectors to the device buffers (no-op for host runs).
  void upload() {
    if (!device_) return;
    device_->to_device(dsend_, send.data(), send.size() * sizeof(T));
    device_->to_device(drecv_, recv.data(), recv.size() * sizeof(T));
  }
  // The device output back to the host vector (no-op for host runs).
  void download() {
    if (device_) device_->to_host(recv.data(), drecv_, recv.size() * sizeof(T));
  }

  std::vector<T> send, recv;

 private:
  MemorySpace* device_;  // null: host buffers
  T* dsend_ = nullptr;
  T* drecv_ = nullptr;
};

template <typename T>
void run_op(Communicator& comm, Op op, Buffers<T>& b, uint64_t block) {
  const CommDType t = dtype_of<T>();
  const int n = comm.size(), r = comm.rank();
  switch (op) {
    case Op::kAllReduce: comm.all_reduce(b.recv_ptr(), block, t, ReduceOp::kSum); break;
    case Op::kAllGather: comm.all_gather(b.send_ptr(), b.recv_ptr(), block, t); break;
    case Op::kReduceScatter: comm.reduce_scatter(b.send_ptr(), b.recv_ptr(), block, t, ReduceOp::kSum); break;
    case Op::kAllToAll: comm.all_to_all(b.send_ptr(), b.recv_ptr(), block, t); break;
    case Op::kSendRecv: comm.send_recv(b.send_ptr(), block, (r + 1) % n, b.recv_ptr(), block, (r + n - 1) % n, t, 7); break;
  }
}

template <typename T>
Row bench_size(Communicator& comm, Op op, uint64_t bytes, const Options& o, const char* type_name) {
  const int n = comm.size(), r = comm.rank();
  const size_t es = sizeof(T);
  const uint64_t block = block_count(op, n, bytes, es);
  Buffers<T> b(send_elems(op, n, block), recv_elems(op, n, block), o.device);
  std::vector<T>& recv = b.recv;
  auto fill = [&]() {
    for (uint64_t i = 0; i < b.send.size(); ++i) b.send[i] = static_cast<T>(input_value(r, i));
    if (op == Op::kAllReduce) b.recv = b.send;  // in place
    b.upload();
  };
  fill();
  for (int i = 0; i < o.warmup; ++i) run_op(comm, op, b, block);
  comm.barrier();
  const auto t0 = Clock::now();
  for (int i = 0; i < o.iters; ++i) run_op(comm, op, b, block);
  int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count() / o.iters;
  comm.all_reduce(&ns, 1, CommDType::kI64, ReduceOp::kMax);

  int64_t wrong = -1;  // -1: not checked
  if (o.check) {
    fill();
    run_op(comm, op, b, block);
    b.download();
    if (o.inject_wrong && r == n - 1 && !recv.empty()) recv[recv.size() / 2] += static_cast<T>(1);
    wrong = 0;
    for (uint64_t i = 0; i < recv.size(); ++i)
      if (recv[i] != static_cast<T>(expected_value(op, n, r, block, i))) ++wrong;
    comm.all_reduce(&wrong, 1, CommDType::kI64, ReduceOp::kSum);
  }
  const uint64_t size = size_bytes(op, n, block, es);
  const double us = static_cast<double>(ns) / 1e3;
  const double algbw = ns > 0 ? static_cast<double>(size) / static_cast<double>(ns) : 0.0;  // bytes/ns = GB/s
  const double busbw = algbw * bus_factor(op, n);
  if (r == 0) {
    char wrong_text[32];
    if (wrong < 0) std::snprintf(wrong_text, sizeof wrong_text, "N/A");
    else std::snprintf(wrong_text, sizeof wrong_text, "%" PRId64, wrong);
    std::printf("%13" PRIu64 " %12" PRIu64 " %6s %10.2f %12.3f %12.3f %8s\n", size, size / es, type_name, us, algbw, busbw,
                wrong_text);
    std::fflush(stdout);
  }
  return Row{busbw, wrong < 0 ? 0 : wrong};
}

// "host (ranks 0-3)" per host, in rank order.
std::string host_summary(Communicator& comm) {
  constexpr size_t kLen = 64;
  std::vector<uint8_t> mine(kLen, 0), all(kLen * static_cast<size_t>(comm.size()), 0);
  const std::string h = MpiEnv::host();
  std::memcpy(mine.data(), h.data(), std::min(h.size(), kLen - 1));
  comm.all_gather(mine.data(), all.data(), kLen, CommDType::kU8);
  std::vector<std::pair<std::string, std::vector<int>>> hosts;
  for (int q = 0; q < comm.size(); ++q) {
    std::string name(reinterpret_cast<const char*>(&all[static_cast<size_t>(q) * kLen]));
    auto it = std::find_if(hosts.begin(), hosts.end(), [&](const auto& e) { return e.first == name; });
    if (it == hosts.end()) hosts.push_back({name, {q}});
    else it->second.push_back(q);
  }
  std::string s = std::to_string(hosts.size()) + (hosts.size() == 1 ? " host: " : " hosts: ");
  for (size_t i = 0; i < hosts.size(); ++i) {
    const auto& ranks = hosts[i].second;
    s += (i ? ", " : "") + hosts[i].first + " (" + std::to_string(ranks.size()) + (ranks.size() == 1 ? " rank)" : " ranks)");
  }
  return s;
}

template <typename T>
int bench_all(Communicator& comm, const Options& o, const char* type_name, const std::string& header) {
  const int n = comm.size(), r = comm.rank();
  if (r == 0) std::printf("%s", header.c_str());
  double bus_sum = 0;
  int rows = 0;
  int64_t wrong = 0;
  for (Op op : o.ops) {
    if (op == Op::kSendRecv && n < 2) {
      if (r == 0) std::printf("#\n# sendrecv skipped: it needs at least 2 ranks\n");
      continue;
    }
    if (r == 0) {
      std::printf("#\n# %s%s  (bus bandwidth = algbw x %.4g)\n", op_name(op),
                  op == Op::kAllReduce ? " in place, sum" : op == Op::kReduceScatter ? " sum" : op == Op::kSendRecv ? " ring r -> r+1" : "",
                  bus_factor(op, n));
      std::printf("#%12s %12s %6s %10s %12s %12s %8s\n", "size(B)", "count", "type", "time(us)", "algbw(GB/s)", "busbw(GB/s)",
                  "#wrong");
    }
    for (uint64_t bytes = o.min_bytes; bytes <= o.max_bytes;) {
      Row row = bench_size<T>(comm, op, bytes, o, type_name);
      bus_sum += row.busbw;
      wrong += row.wrong;
      ++rows;
      if (bytes == 0 || bytes > o.max_bytes / static_cast<uint64_t>(o.step)) {
        if (bytes == 0) bytes = 1; else break;
      } else {
        bytes *= static_cast<uint64_t>(o.step);
      }
    }
  }
  if (r == 0) {
    std::printf("#\n# Out of bounds values : %" PRId64 " %s\n", wrong, wrong == 0 ? "OK" : "FAILED");
    std::printf("# Avg bus bandwidth    : %.4f\n#\n", rows ? bus_sum / rows : 0.0);
    for (Op op : o.ops)
      std::printf("# compare with nccl-tests: %s -b %s -e %s -f %d -g 1  (mpirun -np %d, same nodes)\n", nccl_tests_binary(op),
                  o.min_text.c_str(), o.max_text.c_str(), o.step, n);
    std::fflush(stdout);
    if (wrong != 0) std::fprintf(stderr, "shardlm bench-comm: %" PRId64 " wrong elements\n", wrong);
  }
  return wrong == 0 ? 0 : 1;
}

}  // namespace

int cmd_bench_comm(int argc, char** argv) {
  std::string backend = "mpi", backend_alias, group = "world", op_text = "all", dtype = "float", buffers_text = "auto";
  Options o;
  o.min_text = "8";
  o.max_text = "64M";
  double timeout = 60;
  int check = 1;
  po::options_description d("shardlm bench-comm options");
  d.add_options()("comm", po::value(&backend)->default_value(backend),
                  "communicator backend: mpi or fabric (host buffers), nccl (device buffers)")(
      "backend", po::value(&backend_alias), "same as --comm")("group", po::value(&group)->default_value(group),
                                                              "ranks taking part: world")(
      "op", po::value(&op_text)->default_value(op_text),
      "all, or a comma list of all_reduce, all_gather, reduce_scatter, all_to_all, sendrecv")(
      "min-bytes,b", po::value(&o.min_text)->default_value(o.min_text), "smallest size (K/M/G suffixes)")(
      "max-bytes,e", po::value(&o.max_text)->default_value(o.max_text), "largest size (K/M/G suffixes)")(
      "step-factor,f", po::value(&o.step)->default_value(o.step), "size multiplier between rows")(
      "iters,n", po::value(&o.iters)->default_value(o.iters), "timed iterations per size")(
      "warmup,w", po::value(&o.warmup)->default_value(o.warmup), "untimed iterations per size")(
      "timeout", po::value(&timeout)->default_value(timeout), "seconds any rank waits for its peers before failing")(
      "check,c", po::value(&check)->default_value(check), "1: verify every element of one extra run of each size")(
      "dtype", po::value(&dtype)->default_value(dtype), "float or int32")(
      "buffers", po::value(&buffers_text)->default_value(buffers_text),
      "host, device, or auto (device for nccl, host for the others)")(
      "inject-wrong", po::bool_switch(&o.inject_wrong), "testing: corrupt one received element on the last rank");
  po::variables_map vm;
  if (!parse_subcommand(argc, argv, "bench-comm",
                        "mpirun -np N shardlm bench-comm [--comm mpi|fabric|nccl] [--op all] [--min-bytes 8] [--max-bytes 64M] [--iters 20]", d, &vm))
    return 0;
  if (vm.count("backend")) {
    SHARDLM_CHECK(vm["comm"].defaulted() || backend == backend_alias,
                  "shardlm bench-comm: --comm " << backend << " and --backend " << backend_alias << " disagree");
    backend = backend_alias;
  }
  o.min_bytes = parse_size(o.min_text, "--min-bytes");
  o.max_bytes = parse_size(o.max_text, "--max-bytes");
  o.ops = parse_ops(op_text);
  o.check = check != 0;
  SHARDLM_CHECK(o.min_bytes <= o.max_bytes, "shardlm bench-comm: --min-bytes " << o.min_text << " is above --max-bytes " << o.max_text);
  SHARDLM_CHECK(o.step >= 2, "shardlm bench-comm: --step-factor must be at least 2");
  SHARDLM_CHECK(o.iters >= 1 && o.warmup >= 0, "shardlm bench-comm: --iters must be >= 1 and --warmup >= 0");
  SHARDLM_CHECK(dtype == "float" || dtype == "int32", "shardlm bench-comm: --dtype must be float or int32, not '" << dtype << "'");
  SHARDLM_CHECK(group == "world", "shardlm bench-comm: --group '" << group << "' unknown (world)");
  SHARDLM_CHECK(buffers_text == "auto" || buffers_text == "host" || buffers_text == "device",
                "shardlm bench-comm: --buffers must be auto, host or device, not '" << buffers_text << "'");
  const bool device_buffers = buffers_text == "device" || (buffers_text == "auto" && backend == "nccl");

  std::vector<int> members(static_cast<size_t>(MpiEnv::size()));
  for (size_t i = 0; i < members.size(); ++i) members[i] = static_cast<int>(i);
  const int gpu = bind_local_gpu(node_local(timeout));  // collective: every rank calls it
  std::unique_ptr<Communicator> comm = make_communicator(backend, members, group, timeout);
  const std::shared_ptr<MemorySpace> device_memory = device_buffers ? comm->device_memory() : nullptr;
  // Every rank checks the same thing (the same build, a GPU on each or on none), so all fail alike.
  SHARDLM_CHECK(!device_buffers || device_memory, "shardlm bench-comm: --comm "
                                                      << backend << " on rank " << MpiEnv::rank()
                                                      << " has no device memory (no GPU, or a build without CUDA)");
  o.device = device_memory.get();
  const std::string hosts = host_summary(*comm);
  std::string buffers = "host memory";
  if (o.device) {
    const std::string name = o.device->device_name(gpu);
    buffers = "device memory (rank 0: GPU " + std::to_string(gpu) + (name.empty() ? "" : ", " + name) + ")";
  }
  if (!comm->transport().empty()) buffers += ", " + comm->transport();
  char head[1024];
  std::snprintf(head, sizeof head,
                "# shardlm bench-comm: backend %s, group %s, %d ranks on %s\n# MPI library: %s\n"
                "# buffers: %s\n# dtype %s, iters %d, warmup %d, check %s, timeout %g s\n",
                backend.c_str(), group.c_str(), comm->size(), hosts.c_str(), MpiEnv::library_version().c_str(),
                buffers.c_str(), dtype.c_str(), o.iters, o.warmup, o.check ? "on" : "off", timeout);
  if (dtype == "float") return bench_all<float>(*comm, o, "float", head);
  return bench_all<int32_t>(*comm, o, "int32", head);
}

}  // namespace shardlm
