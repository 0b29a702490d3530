//===- Fiber.cpp - User-space context switching ---------------------------===//

#include "Fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <new>

#if defined(__x86_64__)
// pagedc_emu_switch(void **save, void *load): pushes the callee-saved
// registers and the MXCSR / x87 control words, stores the stack pointer in
// *save, loads `load` and pops the same frame from there.
// pagedc_emu_fiber_start: the first return of a new fiber lands here with
// the entry in r13 and its argument in r12.
asm(R"(
  .text
  .globl pagedc_emu_switch
  .hidden pagedc_emu_switch
  .type pagedc_emu_switch,@function
pagedc_emu_switch:
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
  .size pagedc_emu_switch, .-pagedc_emu_switch

  .globl pagedc_emu_fiber_start
  .hidden pagedc_emu_fiber_start
  .type pagedc_emu_fiber_start,@function
pagedc_emu_fiber_start:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size pagedc_emu_fiber_start, .-pagedc_emu_fiber_start
)");

extern "C" void pagedc_emu_switch(void **save, void *load);
extern "C" void pagedc_emu_fiber_start();
#endif

namespace pagedc::emu {

void makeContext(Context &context, void *stack, size_t bytes, void (*entry)(void *),
                 void *argument) {
#if defined(__x86_64__)
  auto top = (reinterpret_cast<uintptr_t>(stack) + bytes) & ~uintptr_t(15);
  // The frame pagedc_emu_switch pops: control words, r15, r14, r13 (entry),
  // r12 (argument), rbx, rbp, return address. After the return the stack
  // pointer is `top`, 16-byte aligned, as the call in fiber_start expects.
  auto *frame = reinterpret_cast<uint64_t *>(top - 64);
  frame[0] = 0x1f80u | (uint64_t(0x037fu) << 32); // MXCSR default, x87 control default
  frame[1] = 0;                                     // r15
  frame[2] = 0;                                     // r14
  frame[3] = reinterpret_cast<uint64_t>(entry);     // r13
  frame[4] = reinterpret_cast<uint64_t>(argument);  // r12
  frame[5] = 0;                                     // rbx
  frame[6] = 0;                                     // rbp
  frame[7] = reinterpret_cast<uint64_t>(&pagedc_emu_fiber_start);
  context.stackPointer = frame;
#else
  getcontext(&context.context);
  context.context.uc_stack.ss_sp = stack;
  context.context.uc_stack.ss_size = bytes;
  context.context.uc_link = nullptr;
  // makecontext passes int arguments; split the pointer.
  auto value = reinterpret_cast<uintptr_t>(argument);
  static thread_local void (*pendingEntry)(void *);
  pendingEntry = entry;
  makecontext(
      &context.context,
      reinterpret_cast<void (*)()>(+[](unsigned high, unsigned low) {
        pendingEntry(reinterpret_cast<void *>((uintptr_t(high) << 32) | low));
      }),
      2, unsigned(value >> 32), unsigned(value & 0xffffffffu));
#endif
}

void switchContext(Context &from, Context &to) {
#if defined(__x86_64__)
  pagedc_emu_switch(&from.stackPointer, to.stackPointer);
#else
  swapcontext(&from.context, &to.context);
#endif
}

StackArena::StackArena(size_t count, size_t bytes) : count_(count) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  bytes_ = (bytes + page - 1) / page * page;
  stride_ = bytes_ + page;
  mapped_ = stride_ * count;
  void *memory = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (memory == MAP_FAILED)
    throw std::bad_alloc();
  base_ = static_cast<unsigned char *>(memory);
  for (size_t i = 0; i < count; ++i)
    mprotect(base_ + i * stride_, page, PROT_NONE);
}

StackArena::~StackArena() {
  if (base_)
    munmap(base_, mapped_);
}

void *StackArena::stack(size_t index) const {
  return base_ + index * stride_ + (stride_ - bytes_);
}

} // namespace pagedc::emu
