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
void prepare_context(Context& c, char* stack, size_t bytes, void (*fn)()) {
  // From the 16-byte aligned top: a zero return address for fn (which never returns), fn's
  // address for shardlm_emu_switch's `ret`, and six zeros for the registers it pops. fn then starts
  // with the stack pointer 8 below a multiple of 16, as after a call.
  auto top = reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t{15};
  auto* slot = reinterpret_cast<void**>(top);
  *--slot = nullptr;
  *--slot = reinterpret_cast<void*>(fn);
  for (int i = 0; i < 6; ++i) *--slot = nullptr;
  c.sp = slot;
}

void switch_context(Context& from, Context& to) { shardlm_emu_switch(&from.sp, to.sp); }
#else
void prepare_context(Context& c, char* stack, size_t bytes, void (*fn)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, fn, 0);
}

void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

}  // namespace shardlm_emu
