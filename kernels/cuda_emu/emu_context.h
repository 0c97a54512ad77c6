// Switching between the emulated threads' stacks. On x86-64 a switch saves the callee-saved
// registers and the stack pointer and nothing else (glibc's swapcontext also saves the signal mask
// with two system calls, and took 80% of the emulated kernel tests' time); elsewhere, and under
// AddressSanitizer, which knows swapcontext, it is ucontext.
#pragma once

#include <cstddef>

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
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
};

// Makes c start fn on the given stack at its first switch_to. fn must never return: it ends by
// switching away for good.
void prepare_context(Context& c, char* stack, size_t bytes, void (*fn)());
// Saves the running context into from and resumes to.
void switch_context(Context& from, Context& to);

}  // namespace shardlm_emu
