// Switching between the emulated threads' stacks. On x86-64 a switch saves the callee-saved
// registers and the stack pointer and nothing else (glibc's swapcontext also saves the signal mask
// with two system calls, and took 80% of the emulated kernel tests' time; under AddressSanitizer
// its interceptor also clears the shadow of the whole stack at every switch, which made the kernel
// tests about 180 times slower). Under AddressSanitizer the switch tells it which stack runs
// (__sanitizer_start_switch_fiber / __sanitizer_finish_switch_fiber), so it keeps checking each
// thread's own frames, use after return included. Elsewhere it is ucontext.
#pragma once

#include <cstddef>

#include "emu_asan.h"

#if defined(__x86_64__)
#define SHARDLM_EMU_FAST_SWITCH 1
#else
#include <ucontext.h>
#endif

namespace shardlm_emu {

struct Context {
#ifdef SHARDLM_EMU_FAST_SWITCH
  void* sp = nullptr;
#else
  ucontext_t uc{};
#endif
#if defined(SHARDLM_EMU_FAST_SWITCH) && defined(SHARDLM_EMU_ASAN)
  // For AddressSanitizer only (elsewhere a context is its stack pointer, and a block's contexts
  // share fewer cache lines): the function a prepared context starts, its stack (a context that
  // was never prepared, the host thread's own, learns its stack at its first switch away), its
  // fake stack of frames that outlive their return while it does not run, and whether its next
  // switch away is its last.
  void (*fn)() = nullptr;
  const void* stack = nullptr;
  size_t stack_bytes = 0;
  void* fake_stack = nullptr;
  bool exiting = false;
#endif
};

// Makes c start fn on the given stack at its first switch_to. fn must never return: it ends by
// switching away for good, after marking its context exiting.
void prepare_context(Context& c, char* stack, size_t bytes, void (*fn)());
// Saves the running context into from and resumes to.
void switch_context(Context& from, Context& to);
// Before a context's last switch away: it is never resumed (AddressSanitizer drops its fake stack).
inline void mark_exiting([[maybe_unused]] Context& c) {
#if defined(SHARDLM_EMU_FAST_SWITCH) && defined(SHARDLM_EMU_ASAN)
  c.exiting = true;
#endif
}

}  // namespace shardlm_emu
