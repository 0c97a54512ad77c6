#include "emu_context.h"

#include <cstdint>

#ifdef SHARDLM_EMU_FAST_SWITCH
// shardlm_emu_switch(void** save_sp, void* next_sp): pushes the System V callee-saved registers,
// stores the stack pointer, loads the next one and pops that context's registers; `ret` resumes it.
asm(R"(
  .pushsection .text
  .globl shardlm_emu_switch
  .type shardlm_emu_switch, @function
shardlm_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size shardlm_emu_switch, .-shardlm_emu_switch
  .popsection
)");
extern "C" void shardlm_emu_switch(void** save_sp, void* next_sp);
#endif

namespace shardlm_emu {

#ifdef SHARDLM_EMU_FAST_SWITCH
namespace {

#ifdef SHARDLM_EMU_ASAN
// The contexts of the switch under way on this host thread.
thread_local Context* g_from = nullptr;
thread_local Context* g_to = nullptr;

// Tells AddressSanitizer that the stack `from` left is no longer running.
void before_switch(Context& from, Context& to) {
  g_from = &from;
  g_to = &to;
  __sanitizer_start_switch_fiber(from.exiting ? nullptr : &from.fake_stack, to.stack, to.stack_bytes);
}

// On the stack that now runs: `self` is the context resumed, or null for one starting. The
// context switched away from learns its stack here when it had none (the host thread's).
void after_switch(Context* self) {
  const void* old_stack = nullptr;
  size_t old_bytes = 0;
  __sanitizer_finish_switch_fiber(self != nullptr ? self->fake_stack : nullptr, &old_stack, &old_bytes);
  if (g_from != nullptr && g_from->stack == nullptr) {
    g_from->stack = old_stack;
    g_from->stack_bytes = old_bytes;
  }
}

// Where a prepared context starts under AddressSanitizer: finishes the switch, then runs its
// function.
void start_context() {
  after_switch(nullptr);
  g_to->fn();
}
#else
// Without AddressSanitizer a switch is the register swap alone: these run in the kernel tests'
// innermost loop.
inline void before_switch(Context&, Context&) {}
inline void after_switch(Context*) {}
#endif

}  // namespace

void prepare_context(Context& c, char* stack, size_t bytes, void (*fn)()) {
  // From the 16-byte aligned top: a zero return address for fn (or under AddressSanitizer
  // start_context; neither returns), its address for shardlm_emu_switch's `ret`, and six zeros for
  // the registers it pops. It then starts with the stack pointer 8 below a multiple of 16, as after
  // a call.
#ifdef SHARDLM_EMU_ASAN
  // The stack was another thread's, whose frames never returned (a thread ends by switching away
  // for good): their redzones are still poisoned where this thread's frames will lie.
  __asan_unpoison_memory_region(stack, bytes);
#endif
  auto top = reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t{15};
  auto* slot = reinterpret_cast<void**>(top);
  *--slot = nullptr;
#ifdef SHARDLM_EMU_ASAN
  *--slot = reinterpret_cast<void*>(&start_context);
#else
  *--slot = reinterpret_cast<void*>(fn);
#endif
  for (int i = 0; i < 6; ++i) *--slot = nullptr;
  c.sp = slot;
#ifdef SHARDLM_EMU_ASAN
  c.fn = fn;
  c.stack = stack;
  c.stack_bytes = bytes;
  c.fake_stack = nullptr;
  c.exiting = false;
#endif
}

void switch_context(Context& from, Context& to) {
  before_switch(from, to);
  shardlm_emu_switch(&from.sp, to.sp);
  after_switch(&from);
}
#else
void prepare_context(Context& c, char* stack, size_t bytes, void (*fn)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, fn, 0);
}

// AddressSanitizer intercepts swapcontext: no annotations here.
void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

}  // namespace shardlm_emu
