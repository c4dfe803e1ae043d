//! \file cuda_emu_switch.cpp
//! The emulator's fiber context switch on x86-64 (cuda_emu.cpp's GM_EMU_FAST_SWITCH): saves the
//! callee-saved registers, MXCSR and the x87 control word on the current stack, stores its
//! pointer in *save_sp, and resumes the fiber whose stack pointer is new_sp. No signal mask,
//! which is what makes swapcontext cost a system call per switch. Elsewhere (or with
//! GM_EMU_UCONTEXT) the emulator uses ucontext and this file is empty.
#if defined(__x86_64__) && !defined(GM_EMU_UCONTEXT)
extern "C" void gm_emu_switch(void** save_sp, void* new_sp);
asm(R"(
  .text
  .globl gm_emu_switch
  .type gm_emu_switch, @function
gm_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size gm_emu_switch, .-gm_emu_switch
  .section .note.GNU-stack,"",@progbits
  .text
)");
#endif
