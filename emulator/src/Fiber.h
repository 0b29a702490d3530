//===- Fiber.h - User-space context switching ------------------*- C++ -*-===//
//
// A CUDA thread of the emulator is a fiber: its own stack and a saved stack
// pointer. On x86-64 a switch saves the callee-saved registers and the
// SSE/x87 control words and swaps stack pointers (no system call); other
// architectures use ucontext.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_EMU_FIBER_H
#define PAGEDC_EMU_FIBER_H

#include <cstddef>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace pagedc::emu {

/// A saved execution context.
struct Context {
#if defined(__x86_64__)
  void *stackPointer = nullptr;
#else
  ucontext_t context;
#endif
};

/// Prepares `context` to run `entry(argument)` on [stack, stack + bytes)
/// when first switched to. `entry` must never return.
void makeContext(Context &context, void *stack, size_t bytes, void (*entry)(void *),
                 void *argument);

/// Saves the running context into `from` and resumes `to`.
void switchContext(Context &from, Context &to);

/// Fiber stacks: `count` stacks of `bytes` each, every one with an
/// inaccessible guard page below it, so an overflow faults instead of
/// writing into a neighbour.
class StackArena {
public:
  StackArena(size_t count, size_t bytes);
  ~StackArena();
  StackArena(const StackArena &) = delete;
  StackArena &operator=(const StackArena &) = delete;
  void *stack(size_t index) const;
  size_t stackBytes() const { return bytes_; }
  size_t count() const { return count_; }

private:
  unsigned char *base_ = nullptr;
  size_t count_ = 0, bytes_ = 0, stride_ = 0, mapped_ = 0;
};

} // namespace pagedc::emu

#endif // PAGEDC_EMU_FIBER_H
