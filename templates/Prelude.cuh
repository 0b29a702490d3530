//===- Prelude.cuh - Types and helpers every kernel TU starts with -*- CUDA -*-===//
//
// The first part of every generated translation unit. It includes no CUDA
// header (NVRTC's front end time is most of a cold compile), so it declares
// the fixed-width integers itself, the 16-bit element types the kernels and
// mods use, and the helpers generated mod code may call:
//
//   pagedc::tanh_approx(x)      tanh.approx.f32 (max rel. error ~2^-11)
//   pagedc::to_float(v)         f16 / bf16 / float / int32 / bool -> float
//   pagedc::infinity()          +infinity
//
// Numerics: the TU is compiled without --use_fast_math, so mod arithmetic is
// IEEE f32 (with FMA contraction, as nvcc does by default). The softmax uses
// ex2.approx explicitly; that is the only approximate function the kernels
// add besides tanh_approx where a mod asks for it.
//
//===----------------------------------------------------------------------===//

#if defined(__CUDACC_RTC__)
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#else
#include <stdint.h>
#endif

#define PAGEDC_DEVICE __device__ __forceinline__

// The portability layer: built for the SIMT emulator (PAGEDC_EMULATOR, see
// Emulator.cuh, which the emulator build puts before this file), shared
// arrays and the inline-PTX wrappers below take their emulator branch, and
// each wrapper learns its caller's source line for the emulator's reports.
// Under NVRTC the macros expand to plain CUDA and to nothing.
#ifdef PAGEDC_EMULATOR
#define PAGEDC_SITE_PARAMS                                                     \
  , const char *pagedc_site_file = __builtin_FILE(),                           \
              int pagedc_site_line = __builtin_LINE()
#define PAGEDC_SITE_ARGS , pagedc_site_file, pagedc_site_line
#define PAGEDC_SITE_PARAMS_ONLY                                                \
  const char *pagedc_site_file = __builtin_FILE(),                             \
             int pagedc_site_line = __builtin_LINE()
#define PAGEDC_SITE_ARGS_ONLY pagedc_site_file, pagedc_site_line
#else
#define PAGEDC_SITE_PARAMS
#define PAGEDC_SITE_ARGS
#define PAGEDC_SITE_PARAMS_ONLY
#define PAGEDC_SITE_ARGS_ONLY
/// The block's dynamic shared memory, 128-byte aligned.
#define PAGEDC_EXTERN_SHARED(type, name) extern __shared__ __align__(128) type name[]
/// A static shared array of the block.
#define PAGEDC_SHARED(type, name, count) __shared__ type name[count]
// Configuration constexprs a kernel does not read are expected.
#pragma nv_diag_suppress 177
#endif

/// IEEE binary16 storage (bits only; arithmetic happens in f32).
struct pagedc_f16 {
  uint16_t bits;
};
/// bfloat16 storage (bits only; arithmetic happens in f32).
struct pagedc_bf16 {
  uint16_t bits;
};

namespace pagedc {

/// cvta.to.shared: the 32-bit shared-window address of a pointer.
PAGEDC_DEVICE uint32_t shared_address(const void *pointer PAGEDC_SITE_PARAMS) {
#ifdef PAGEDC_EMULATOR
  return pagedc_emu::shared_address(pointer PAGEDC_SITE_ARGS);
#else
  uint32_t address;
  asm("{ .reg .u64 wide; cvta.to.shared.u64 wide, %1; cvt.u32.u64 %0, wide; }"
      : "=r"(address)
      : "l"(pointer));
  return address;
#endif
}

/// Copies 16 bytes global -> shared asynchronously; bytes past `valid_bytes`
/// (0 or 16) are zero-filled, so a masked row never holds stale data.
PAGEDC_DEVICE void cp_async_16(uint32_t shared, const void *global,
                               int valid_bytes PAGEDC_SITE_PARAMS) {
#ifdef PAGEDC_EMULATOR
  return pagedc_emu::cp_async_16(shared, global, valid_bytes PAGEDC_SITE_ARGS);
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(shared),
               "l"(global), "r"(valid_bytes));
#endif
}
PAGEDC_DEVICE void cp_async_commit(PAGEDC_SITE_PARAMS_ONLY) {
#ifdef PAGEDC_EMULATOR
  return pagedc_emu::cp_async_commit(PAGEDC_SITE_ARGS_ONLY);
#else
  asm volatile("cp.async.commit_group;" ::);
#endif
}
template <int kPending> PAGEDC_DEVICE void cp_async_wait(PAGEDC_SITE_PARAMS_ONLY) {
#ifdef PAGEDC_EMULATOR
  return pagedc_emu::cp_async_wait(kPending PAGEDC_SITE_ARGS);
#else
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending));
#endif
}

/// `value`, hidden from the optimizer: computed where it stands, every
/// time (volatile asm), so that nothing derived from it is hoisted out of
/// the loop around it to live in a register (or a spill slot) across the
/// loop's other work.
PAGEDC_DEVICE int recompute_here(int value) {
#ifdef PAGEDC_EMULATOR
  return value;
#else
  int out;
  asm volatile("mov.b32 %0, %1;" : "=r"(out) : "r"(value));
  return out;
#endif
}

/// +infinity (NVRTC has no constexpr way to spell it).
PAGEDC_DEVICE float infinity() { return __int_as_float(0x7f800000); }

PAGEDC_DEVICE float to_float(float v) { return v; }
PAGEDC_DEVICE float to_float(int32_t v) { return static_cast<float>(v); }
PAGEDC_DEVICE float to_float(bool v) { return v ? 1.0f : 0.0f; }
PAGEDC_DEVICE float to_float(pagedc_f16 v) {
#ifdef PAGEDC_EMULATOR
  return pagedc_emu::half_to_float(v.bits);
#else
  float out;
  asm("cvt.f32.f16 %0, %1;" : "=f"(out) : "h"(v.bits));
  return out;
#endif
}
PAGEDC_DEVICE float to_float(pagedc_bf16 v) {
  return __uint_as_float(static_cast<uint32_t>(v.bits) << 16);
}

/// tanh through the hardware approximation (sm_75+).
PAGEDC_DEVICE float tanh_approx(float x) {
#ifdef PAGEDC_EMULATOR
  return pagedc_emu::approx(PAGEDC_EMU_TANH_APPROX, x);
#else
  float out;
  asm("tanh.approx.f32 %0, %1;" : "=f"(out) : "f"(x));
  return out;
#endif
}

/// 2^x through the hardware approximation; -inf gives 0.
PAGEDC_DEVICE float exp2_approx(float x) {
#ifdef PAGEDC_EMULATOR
  return pagedc_emu::approx(PAGEDC_EMU_EX2_APPROX_FTZ, x);
#else
  float out;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(out) : "f"(x));
  return out;
#endif
}

PAGEDC_DEVICE int32_t imin(int32_t a, int32_t b) { return a < b ? a : b; }
PAGEDC_DEVICE int32_t imax(int32_t a, int32_t b) { return a > b ? a : b; }
PAGEDC_DEVICE int64_t imin64(int64_t a, int64_t b) { return a < b ? a : b; }

/// Type equality for compile-time checks (no <type_traits> in NVRTC).
template <typename A, typename B> struct is_same {
  static constexpr bool value = false;
};
template <typename A> struct is_same<A, A> {
  static constexpr bool value = true;
};

} // namespace pagedc

/// The column hooks of a hook set written by hand (templates/Hooks.cuh):
/// no key-only part, mask_at calls mask. Used inside namespace pagedc_mods,
/// after mask.
#define PAGEDC_MASK_COL_UNSPLIT()                                                  \
  struct MaskCol {};                                                               \
  __device__ __forceinline__ MaskCol mask_col(const Params &, int) { return {}; }  \
  __device__ __forceinline__ bool mask_at(const Params &p, const MaskRow &row,     \
                                          const MaskCol &, int b, int h, int q,    \
                                          int kv) {                                \
    return mask(p, row, b, h, q, kv);                                              \
  }
