// A MemorySpace for tests on machines without a GPU: "device" memory is a heap arena; copies are
// memcpy that check their direction (device to host must read the arena and write outside it);
// staging allocations are counted so that tests can see they are reused and returned.
#pragma once

#include <chrono>
#include <thread>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/memory_space.h"

namespace shardlm::testing_support {

class FakeDeviceMemory final : public MemorySpace {
 public:
  explicit FakeDeviceMemory(size_t arena_bytes) : arena_(arena_bytes) {}
  ~FakeDeviceMemory() override {
    for (void* p : live_) std::free(p);
  }

  // Bump allocation inside the arena, 64-byte aligned; nothing is freed until reset().
  void* alloc_device(size_t bytes) override {
    const size_t off = (used_ + 63) / 64 * 64;
    SHARDLM_CHECK(off + bytes <= arena_.size(), "fake device arena full");
    used_ = off + bytes;
    return arena_.data() + off;
  }
  template <typename T>
  T* alloc_device_array(size_t n) {
    return static_cast<T*>(alloc_device(n * sizeof(T)));
  }
  void reset() { used_ = 0; }
  void free_device(void*) override {}
  std::string device_name(int) const override { return "fake device"; }

  std::string name() const override { return "fake device arena"; }
  bool is_device(const void* p) const override {
    const auto* c = static_cast<const uint8_t*>(p);
    return p != nullptr && c >= arena_.data() && c < arena_.data() + arena_.size();
  }
  void to_host(void* dst, const void* src, size_t bytes) override {
    SHARDLM_CHECK(is_device(src) && !is_device(dst), "fake to_host: wrong direction");
    delay();
    std::memcpy(dst, src, bytes);
    ++to_host_calls;
    bytes_to_host += bytes;
  }
  void to_device(void* dst, const void* src, size_t bytes) override {
    SHARDLM_CHECK(is_device(dst) && !is_device(src), "fake to_device: wrong direction");
    delay();
    std::memcpy(dst, src, bytes);
    ++to_device_calls;
    bytes_to_device += bytes;
  }
  void* alloc_host_staging(size_t bytes) override {
    void* p = std::malloc(bytes > 0 ? bytes : 1);
    live_.insert(p);
    ++staging_allocs;
    return p;
  }
  void free_host_staging(void* p) override {
    SHARDLM_CHECK(live_.erase(p) == 1, "fake free_host_staging: unknown pointer");
    std::free(p);
  }
  size_t staging_live() const { return live_.size(); }

  uint64_t to_host_calls = 0, to_device_calls = 0, bytes_to_host = 0, bytes_to_device = 0, staging_allocs = 0;
  // Seconds each copy takes, as a device copy waits for the kernels queued before it.
  double copy_delay_s = 0;

 private:
  void delay() const {
    if (copy_delay_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(copy_delay_s));
  }
  std::vector<uint8_t> arena_;
  size_t used_ = 0;
  std::set<void*> live_;
};

}  // namespace shardlm::testing_support
