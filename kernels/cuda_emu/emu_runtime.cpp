// The runtime API over host memory: allocations are aligned host blocks, copies are memcpy, and
// every call completes before it returns, unless a stream is being captured (then the stream's
// work is recorded into a graph) or the work is an operation in flight (Pending: emulated NCCL).
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_runtime.h"
#include "emu_asan.h"
#include "emu_state.h"

namespace shardlm_emu {
namespace {

struct State {
  std::mutex mu;
  cudaError_t last = cudaSuccess;
  std::string message;
  std::map<const char*, size_t> device, host;  // allocations: start -> bytes
  size_t device_bytes = 0;                     // device allocations, rounded as allocated
};
State& state() {
  static State s;
  return s;
}

cudaError_t take_error(bool clear) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const cudaError_t e = s.last;
  if (clear) s.last = cudaSuccess;
  return e;
}

}  // namespace

void set_error(cudaError_t e, const std::string& message) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.last == cudaSuccess) {
    s.last = e;
    s.message = message;
  }
}

namespace {
// SHARDLM_EMULATED_GPUS devices (default 8, a p5en node's), so that ranks sharing a host can each
// take their own, as on a GPU node; the device of this process is set by cudaSetDevice.
int device_count() {
  static const int n = [] {
    const char* v = std::getenv("SHARDLM_EMULATED_GPUS");
    const int k = v != nullptr ? std::atoi(v) : 8;
    return k >= 0 ? k : 0;
  }();
  return n;
}
int& current_device() {
  static int d = 0;
  return d;
}

// SHARDLM_EMULATED_GPU_MEMORY_MIB of device memory per process (default 141 GiB, an H200's):
// cudaMalloc past it fails as on the device, and cudaMemGetInfo reports what is left, so code that
// sizes itself by free memory (the KV cache's auto budget) is tested with small devices.
size_t device_memory_bytes() {
  static const size_t n = [] {
    const char* v = std::getenv("SHARDLM_EMULATED_GPU_MEMORY_MIB");
    const long long mib = v != nullptr ? std::atoll(v) : 141LL * 1024;
    return static_cast<size_t>(mib > 0 ? mib : 0) << 20;
  }();
  return n;
}

using Allocations = std::map<const char*, size_t> State::*;

size_t rounded_size(size_t bytes) { return bytes > 0 ? (bytes + 255) / 256 * 256 : 256; }

// Device memory is 256-byte aligned, as cudaMalloc's is; every allocation starts as NaN bytes, not
// zeros, so a kernel that reads memory nobody wrote shows it.
cudaError_t allocate(void** p, size_t bytes, Allocations which) {
  if (p == nullptr) return cudaErrorInvalidValue;
  const size_t rounded = rounded_size(bytes);
  const bool device = which == &State::device;
  if (device) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    if (rounded > device_memory_bytes() - std::min(s.device_bytes, device_memory_bytes())) {
      *p = nullptr;
      return cudaErrorMemoryAllocation;
    }
  }
  *p = std::aligned_alloc(256, rounded);
  if (*p == nullptr) return cudaErrorMemoryAllocation;
  std::memset(*p, 0xff, rounded);
#ifdef SHARDLM_EMU_ASAN
  // Past the bytes asked for is out of bounds, as compute-sanitizer's memcheck reports it, though
  // the device (and this rounding) would let the access through.
  __asan_poison_memory_region(static_cast<char*>(*p) + bytes, rounded - bytes);
#endif
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  (s.*which)[static_cast<const char*>(*p)] = bytes;
  if (device) s.device_bytes += rounded;
  return cudaSuccess;
}

// Only what this kind of allocation returned: a stray or second free is an error, not a crash.
cudaError_t release(void* p, Allocations which) {
  if (p == nullptr) return cudaSuccess;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = (s.*which).find(static_cast<const char*>(p));
  if (it == (s.*which).end()) return cudaErrorInvalidValue;
  if (which == &State::device) s.device_bytes -= rounded_size(it->second);
  (s.*which).erase(it);
  std::free(p);
  return cudaSuccess;
}
}  // namespace

cudaError_t cudaMalloc(void** p, size_t bytes) { return allocate(p, bytes, &State::device); }
cudaError_t cudaFree(void* p) { return release(p, &State::device); }
cudaError_t cudaMallocHost(void** p, size_t bytes) { return allocate(p, bytes, &State::host); }
cudaError_t cudaFreeHost(void* p) { return release(p, &State::host); }

namespace {
bool inside(const std::map<const char*, size_t>& m, const char* p) {
  auto it = m.upper_bound(p);
  if (it == m.begin()) return false;
  --it;
  return p < it->first + (it->second > 0 ? it->second : 1);
}
}  // namespace

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  if (a == nullptr) return cudaErrorInvalidValue;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const auto* c = static_cast<const char*>(p);
  *a = cudaPointerAttributes{};
  a->device = current_device();
  if (inside(s.device, c)) {
    a->type = cudaMemoryTypeDevice;
    a->devicePointer = const_cast<void*>(p);
  } else if (inside(s.host, c)) {
    a->type = cudaMemoryTypeHost;
    a->hostPointer = const_cast<void*>(p);
  } else {
    a->type = cudaMemoryTypeUnregistered;
    a->hostPointer = const_cast<void*>(p);
  }
  return cudaSuccess;
}

// ---- Capture: thread-local, of one stream at a time ----
}  // namespace shardlm_emu

struct CUstream_st {
  unsigned flags = 0;
};
struct CUevent_st {
  unsigned flags = 0;
  cudaStream_t stream = nullptr;  // where it was last recorded
  bool recorded = false;
  std::chrono::steady_clock::time_point at;  // host time of the last record
};
struct CUgraph_st {
  std::vector<std::shared_ptr<shardlm_emu::Work>> work;
};
struct CUgraphExec_st {
  std::vector<std::shared_ptr<shardlm_emu::Work>> work;
};

namespace shardlm_emu {
namespace {
struct Capture {
  cudaStream_t stream = nullptr;
  bool active = false;
  cudaError_t invalidated = cudaSuccess;
  std::unique_ptr<CUgraph_st> graph;
};
Capture& capture() {
  thread_local Capture c;
  return c;
}
// Work that the legacy stream would have to order against the capture ends it, as on the device.
bool refuse_during_capture(const char* what, cudaError_t why) {
  Capture& c = capture();
  if (!c.active) return false;
  if (c.invalidated == cudaSuccess) c.invalidated = why;
  set_error(why, std::string(what) + " while a stream is being captured");
  return true;
}
}  // namespace

// ---- Work in flight (Pending) ----
namespace {
struct InFlight {
  cudaStream_t stream;
  std::shared_ptr<Pending> work;
  const void* owner;
};
std::vector<InFlight>& in_flight() {
  static std::vector<InFlight> v;
  return v;
}
thread_local bool g_replaying = false;

// Whether work issued to `waiter` is ordered after work on `on`: its own stream's; the legacy
// stream and the blocking streams are ordered after each other.
bool ordered_after(cudaStream_t waiter, cudaStream_t on) {
  if (waiter == on) return true;
  if (waiter == nullptr) return !(on->flags & cudaStreamNonBlocking);
  if (on == nullptr) return !(waiter->flags & cudaStreamNonBlocking);
  return false;
}

// Waits for the work in flight that `waiter` is ordered after (all of it: all_streams).
void settle(cudaStream_t waiter, bool all_streams = false) {
  auto& v = in_flight();
  for (size_t i = 0; i < v.size();) {
    if (all_streams || ordered_after(waiter, v[i].stream)) {
      const std::shared_ptr<Pending> w = v[i].work;
      v.erase(v.begin() + static_cast<std::ptrdiff_t>(i));
      w->finish();  // may issue or drop other work: start over
      i = 0;
    } else {
      ++i;
    }
  }
}

bool busy(cudaStream_t s) {
  auto& v = in_flight();
  bool any = false;
  for (size_t i = 0; i < v.size();) {
    if (ordered_after(s, v[i].stream) && v[i].work->done()) {
      v.erase(v.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      any = any || ordered_after(s, v[i].stream);
      ++i;
    }
  }
  return any;
}
}  // namespace

void add_pending(cudaStream_t stream, std::shared_ptr<Pending> p, const void* owner) {
  if (g_replaying) {
    p->finish();
    return;
  }
  in_flight().push_back({stream, std::move(p), owner});
}

void drop_pending(const void* owner) {
  auto& v = in_flight();
  for (size_t i = 0; i < v.size();) {
    if (v[i].owner == owner)
      v.erase(v.begin() + static_cast<std::ptrdiff_t>(i));
    else
      ++i;
  }
}

void enqueue_work(cudaStream_t stream, Work* work, const char* what) {
  std::unique_ptr<Work> w(work);
  Capture& c = capture();
  if (c.active && stream == c.stream) {
    c.graph->work.emplace_back(std::move(w));
    return;
  }
  if (c.active && stream == nullptr) {
    refuse_during_capture(what, cudaErrorStreamCaptureImplicit);
    return;
  }
  settle(stream);
  w->run();
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
  Capture& c = capture();
  if (s == nullptr) return cudaErrorStreamCaptureUnsupported;  // the legacy stream cannot be captured
  if (c.active) return cudaErrorIllegalState;
  c.active = true;
  c.stream = s;
  c.invalidated = cudaSuccess;
  c.graph = std::make_unique<CUgraph_st>();
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  Capture& c = capture();
  if (!c.active || s != c.stream) return cudaErrorIllegalState;
  c.active = false;
  if (c.invalidated != cudaSuccess) {
    c.graph.reset();
    if (graph) *graph = nullptr;
    return cudaErrorStreamCaptureInvalidated;
  }
  if (graph) *graph = c.graph.release();
  c.graph.reset();
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (exec == nullptr || graph == nullptr) return cudaErrorInvalidValue;
  *exec = new CUgraphExec_st{graph->work};
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  if (exec == nullptr) return cudaErrorInvalidValue;
  if (capture().active) return cudaErrorStreamCaptureUnsupported;
  settle(s);
  struct Replaying {  // reset also when a node throws
    Replaying() { g_replaying = true; }
    ~Replaying() { g_replaying = false; }
  } replaying;
  for (auto& w : exec->work) w->run();
  return cudaSuccess;
}
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, void* nodes, size_t* count) {
  if (graph == nullptr || count == nullptr || nodes != nullptr) return cudaErrorInvalidValue;
  *count = graph->work.size();
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
  if (e == nullptr) return cudaErrorInvalidValue;
  *e = new CUevent_st;
  (*e)->flags = flags;
  return cudaSuccess;
}
// Work is complete when it returns, except work in flight: an event is reached when the work in
// flight that its stream had when it was recorded is done (here: all of that stream's).
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (e == nullptr) return cudaErrorInvalidValue;
  e->stream = s;
  e->recorded = true;
  e->at = std::chrono::steady_clock::now();
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (e == nullptr) return cudaErrorInvalidValue;
  settle(e->stream);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr || start == nullptr || end == nullptr) return cudaErrorInvalidValue;
  if ((start->flags | end->flags) & cudaEventDisableTiming) return cudaErrorInvalidValue;
  if (!start->recorded || !end->recorded) return cudaErrorInvalidResourceHandle;
  // Host time between the records: kernels, copies and GEMMs run when they are issued, so it is
  // the time of the work issued between them (not of NCCL operations still in flight).
  *ms = std::chrono::duration<float, std::milli>(end->at - start->at).count();
  return cudaSuccess;
}
// The host waits here for what the stream would wait for.
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t e, unsigned) {
  if (e == nullptr) return cudaErrorInvalidValue;
  settle(e->stream);
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s) { return busy(s) ? cudaErrorNotReady : cudaSuccess; }

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) return cudaErrorInvalidValue;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  *total_bytes = device_memory_bytes();
  *free_bytes = *total_bytes - std::min(s.device_bytes, *total_bytes);
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (value == nullptr) return cudaErrorInvalidValue;
  if (device < 0 || device >= device_count()) return cudaErrorInvalidDevice;
  // An H200's: 132 SMs, compute capability 9.0 (as cudaGetDeviceProperties says).
  switch (attr) {
    case cudaDevAttrMultiProcessorCount:
      *value = 132;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
      *value = 9;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = 0;
      return cudaSuccess;
  }
  return cudaErrorInvalidValue;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (bytes > 0 && (dst == nullptr || src == nullptr)) return cudaErrorInvalidValue;
  if (refuse_during_capture("cudaMemcpy", cudaErrorStreamCaptureImplicit)) return cudaErrorStreamCaptureImplicit;
  settle(nullptr);
  if (bytes > 0) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t s) {
  if (bytes > 0 && (dst == nullptr || src == nullptr)) return cudaErrorInvalidValue;
  if (bytes == 0) return cudaSuccess;
  // Captured, the copy is a graph node: it reads src when the graph is replayed, as on the device.
  enqueue(
      s, [dst, src, bytes] { std::memmove(dst, src, bytes); }, "cudaMemcpyAsync");
  return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  if (bytes > 0 && p == nullptr) return cudaErrorInvalidValue;
  if (refuse_during_capture("cudaMemset", cudaErrorStreamCaptureImplicit)) return cudaErrorStreamCaptureImplicit;
  settle(nullptr);
  if (bytes > 0) std::memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s) {
  if (bytes > 0 && p == nullptr) return cudaErrorInvalidValue;
  if (bytes > 0)
    enqueue(
        s, [p, value, bytes] { std::memset(p, value, bytes); }, "cudaMemsetAsync");
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  if (s == nullptr) return cudaErrorInvalidValue;
  *s = new CUstream_st{flags};  // a distinct handle: a capture is of one stream
  return cudaSuccess;
}
// Work still in flight on it completes first (on the device it would complete after).
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (s == nullptr) return cudaSuccess;
  auto& v = in_flight();
  for (size_t i = 0; i < v.size();) {
    if (v[i].stream == s) {
      const std::shared_ptr<Pending> w = v[i].work;
      v.erase(v.begin() + static_cast<std::ptrdiff_t>(i));
      w->finish();
      i = 0;
    } else {
      ++i;
    }
  }
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (refuse_during_capture("cudaStreamSynchronize", cudaErrorStreamCaptureUnsupported))
    return cudaErrorStreamCaptureUnsupported;
  settle(s);
  return take_error(false);
}
cudaError_t cudaDeviceSynchronize() {
  if (refuse_during_capture("cudaDeviceSynchronize", cudaErrorStreamCaptureUnsupported))
    return cudaErrorStreamCaptureUnsupported;
  settle(nullptr, true);
  return take_error(false);
}
cudaError_t cudaGetLastError() { return take_error(true); }
cudaError_t cudaPeekAtLastError() { return take_error(false); }

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDeviceFunction:
      return "cudaErrorInvalidDeviceFunction";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorIllegalState:
      return "cudaErrorIllegalState";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorLaunchOutOfResources:
      return "cudaErrorLaunchOutOfResources";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorStreamCaptureUnsupported:
      return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated:
      return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureImplicit:
      return "cudaErrorStreamCaptureImplicit";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t e) {
  if (e == cudaSuccess) return "no error";
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  // The message of the error last recorded, when it is this one: it names the kernel and thread.
  thread_local std::string text;
  if ((e == s.last || s.last == cudaSuccess) && !s.message.empty()) {
    text = s.message;
  } else if (e == cudaErrorMemoryAllocation) {
    text = "out of memory";  // the runtime's own words
  } else {
    text = "error " + std::to_string(e);
  }
  return text.c_str();
}

cudaError_t cudaGetDeviceCount(int* n) {
  if (n == nullptr) return cudaErrorInvalidValue;
  *n = device_count();
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  if (d == nullptr) return cudaErrorInvalidValue;
  *d = current_device();
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
  if (d < 0 || d >= device_count()) return cudaErrorInvalidDevice;
  current_device() = d;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
  if (p == nullptr) return cudaErrorInvalidValue;
  if (d < 0 || d >= device_count()) return cudaErrorInvalidDevice;
  *p = cudaDeviceProp{};
  std::strncpy(p->name, "host emulation of an sm_90 device", sizeof(p->name) - 1);
  p->totalGlobalMem = size_t{141} << 30;
  p->sharedMemPerBlock = 48 * 1024;
  p->sharedMemPerBlockOptin = max_dynamic_shared();
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->multiProcessorCount = 132;
  p->major = 9;
  p->minor = 0;
  return cudaSuccess;
}

// 0: no CUDA runtime or driver; the emulation is neither.
cudaError_t cudaRuntimeGetVersion(int* v) {
  if (v == nullptr) return cudaErrorInvalidValue;
  *v = 0;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
  if (v == nullptr) return cudaErrorInvalidValue;
  *v = 0;
  return cudaSuccess;
}

}  // namespace shardlm_emu
