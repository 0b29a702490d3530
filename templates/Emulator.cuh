//===- Emulator.cuh - CUDA built-ins for the host compiler -----*- C++ -*-===//
//
// The first part of a kernel unit built for the SIMT emulator (emulator/):
// the unit is then the same text NVRTC compiles (Prelude.cuh onward), and
// this file makes it host C++. CUDA keywords become plain C++, the
// built-in index variables, barriers, warp collectives, atomics and the
// inline-PTX wrappers of the templates (their PAGEDC_EMULATOR branches) call
// the emulator through the function table of KernelAbi.h (embedded before
// this file), and the compiler's ThreadSanitizer instrumentation (the unit
// is compiled with -fsanitize=thread, without its run-time library) reports
// every load and store to the emulator's memory checkers through the
// __tsan_* hooks at the end of this file.
//
// Forwarders are not instrumented and never inlined into kernel code, so
// the table is read without reporting and each call has the caller's site.
//
//===----------------------------------------------------------------------===//

// The C library's <math.h>, not libstdc++'s wrapper of it: the wrapper
// brings in all of <cmath> (about 0.1 s of every unit's compile, half of it
// at -O0), and units call only C's float functions (expf, fmaxf, ...) and
// its INFINITY and NAN. Other standard libraries ignore the macro.
#define _GLIBCXX_INCLUDE_NEXT_C_HEADERS
#include <math.h>
#undef _GLIBCXX_INCLUDE_NEXT_C_HEADERS
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define __device__
#define __global__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __grid_constant__
#define __align__(n) alignas(n)
#define __restrict__ __restrict

#define PAGEDC_EMU_FORWARD static __attribute__((no_sanitize("thread"), noinline, unused))
#define PAGEDC_EMU_SITE const char *file = __builtin_FILE(), int line = __builtin_LINE()

namespace pagedc_emu {

/// The emulator's table, stored by pagedc_emu_image_bind.
inline const PagedcEmuRuntime *runtime = nullptr;

struct IndexView {
  unsigned x, y, z;
};
PAGEDC_EMU_FORWARD const PagedcEmuThreadIndex *index() { return runtime->thread_index(); }

PAGEDC_EMU_FORWARD unsigned char *dynamic_shared() { return runtime->dynamic_shared(); }
PAGEDC_EMU_FORWARD unsigned char *static_shared(unsigned *slot, unsigned bytes,
                                                unsigned align) {
  return runtime->static_shared(slot, bytes, align);
}
PAGEDC_EMU_FORWARD uint32_t shared_address(const void *pointer, PAGEDC_EMU_SITE) {
  return runtime->shared_address(pointer, file, line);
}
PAGEDC_EMU_FORWARD void syncthreads(PAGEDC_EMU_SITE) { runtime->syncthreads(file, line); }
PAGEDC_EMU_FORWARD unsigned shfl_xor(unsigned mask, unsigned value, int lane_mask,
                                     const char *file, int line) {
  return runtime->shfl_xor(mask, value, lane_mask, file, line);
}
PAGEDC_EMU_FORWARD unsigned ballot(unsigned mask, int predicate, const char *file, int line) {
  return runtime->ballot(mask, predicate, file, line);
}
PAGEDC_EMU_FORWARD void ldmatrix_x4(uint32_t (&fragment)[4], uint32_t address, bool transpose,
                                    PAGEDC_EMU_SITE) {
  unsigned out[4];
  runtime->ldmatrix_x4(out, address, transpose ? 1 : 0, file, line);
  for (int i = 0; i < 4; ++i)
    fragment[i] = out[i];
}
PAGEDC_EMU_FORWARD void mma_16816(float (&acc)[4], const uint32_t (&a)[4], uint32_t b0,
                                  uint32_t b1, bool bf16, PAGEDC_EMU_SITE) {
  float inout[4] = {acc[0], acc[1], acc[2], acc[3]};
  const unsigned operands[4] = {a[0], a[1], a[2], a[3]};
  runtime->mma_16816(inout, operands, b0, b1, bf16 ? 1 : 0, file, line);
  for (int i = 0; i < 4; ++i)
    acc[i] = inout[i];
}
PAGEDC_EMU_FORWARD void cp_async_16(uint32_t shared, const void *global, int valid_bytes,
                                    PAGEDC_EMU_SITE) {
  runtime->cp_async_16(shared, global, valid_bytes, file, line);
}
PAGEDC_EMU_FORWARD void cp_async_commit(PAGEDC_EMU_SITE) { runtime->cp_async_commit(file, line); }
PAGEDC_EMU_FORWARD void cp_async_wait(int pending, PAGEDC_EMU_SITE) {
  runtime->cp_async_wait(pending, file, line);
}
PAGEDC_EMU_FORWARD int atomic_add(int *address, int value, const char *file, int line) {
  return runtime->atomic_add_i32(address, value, file, line);
}
PAGEDC_EMU_FORWARD float approx(int function, float x) { return runtime->approx(function, x); }
PAGEDC_EMU_FORWARD void tally(int what) { runtime->tally(what); }

// sm_90 (Hopper): mbarriers, bulk copies, proxy fences, named barriers,
// wgmma and setmaxnreg (Hopper.cuh's emulator branches).
PAGEDC_EMU_FORWARD void mbarrier_init(uint32_t address, unsigned count, PAGEDC_EMU_SITE) {
  runtime->mbarrier_init(address, count, file, line);
}
PAGEDC_EMU_FORWARD void mbarrier_arrive(uint32_t address, bool expect_tx, unsigned tx_bytes,
                                        PAGEDC_EMU_SITE) {
  runtime->mbarrier_arrive(address, expect_tx ? 1 : 0, tx_bytes, file, line);
}
PAGEDC_EMU_FORWARD void mbarrier_expect_tx(uint32_t address, unsigned tx_bytes, PAGEDC_EMU_SITE) {
  runtime->mbarrier_expect_tx(address, tx_bytes, file, line);
}
PAGEDC_EMU_FORWARD void mbarrier_wait(uint32_t address, unsigned parity, PAGEDC_EMU_SITE) {
  runtime->mbarrier_wait(address, parity, file, line);
}
PAGEDC_EMU_FORWARD void bulk_copy(uint32_t shared, const void *global, unsigned bytes,
                                  uint32_t mbarrier, PAGEDC_EMU_SITE) {
  runtime->bulk_copy(shared, global, bytes, mbarrier, file, line);
}
PAGEDC_EMU_FORWARD void fence(int kind, PAGEDC_EMU_SITE) { runtime->fence(kind, file, line); }
PAGEDC_EMU_FORWARD void named_barrier(unsigned id, unsigned threads, bool sync, PAGEDC_EMU_SITE) {
  runtime->named_barrier(id, threads, sync ? 1 : 0, file, line);
}
PAGEDC_EMU_FORWARD void wgmma_fence(PAGEDC_EMU_SITE) { runtime->wgmma_fence(file, line); }
PAGEDC_EMU_FORWARD void wgmma_commit(PAGEDC_EMU_SITE) { runtime->wgmma_commit(file, line); }
PAGEDC_EMU_FORWARD void wgmma_wait(int pending, PAGEDC_EMU_SITE) {
  runtime->wgmma_wait(pending, file, line);
}
PAGEDC_EMU_FORWARD void wgmma(const PagedcEmuWgmma &op, float *d, PAGEDC_EMU_SITE) {
  runtime->wgmma(&op, d, file, line);
}
PAGEDC_EMU_FORWARD void setmaxnreg(unsigned count, bool increase, PAGEDC_EMU_SITE) {
  runtime->setmaxnreg(count, increase ? 1 : 0, file, line);
}
PAGEDC_EMU_FORWARD void bulk_tensor_copy(uint32_t shared, const void *map, const int *coordinates,
                                         int rank, uint32_t mbarrier, PAGEDC_EMU_SITE) {
  runtime->bulk_tensor_copy(shared, map, coordinates, rank, mbarrier, file, line);
}
PAGEDC_EMU_FORWARD void cp_async_mbarrier_arrive(uint32_t mbarrier, PAGEDC_EMU_SITE) {
  runtime->cp_async_mbarrier_arrive(mbarrier, file, line);
}

//===--- Conversions, bit-exact with the PTX instructions ------------------===//

inline uint32_t float_bits(float value) {
  uint32_t bits;
  memcpy(&bits, &value, 4);
  return bits;
}
inline float bits_float(uint32_t bits) {
  float value;
  memcpy(&value, &bits, 4);
  return value;
}

/// cvt.rn.bf16.f32: round to nearest even; NaN stays a (quiet) NaN.
inline uint16_t float_to_bf16(float value) {
  uint32_t bits = float_bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

/// cvt.rn.f16.f32: round to nearest even, overflow to infinity, subnormals
/// kept; NaN stays a (quiet) NaN.
inline uint16_t float_to_half(float value) {
  const uint32_t bits = float_bits(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u)
    return static_cast<uint16_t>(sign | 0x7e00u);
  if (magnitude >= 0x477ff000u) // rounds to >= 65520: infinity
    return static_cast<uint16_t>(sign | 0x7c00u);
  if (magnitude < 0x38800000u) { // below the smallest normal half (2^-14)
    // value / 2^-24 rounded to nearest even gives the subnormal mantissa.
    const float scaled = bits_float(magnitude) * 16777216.0f;
    float rounded = nearbyintf(scaled);
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(rounded));
  }
  uint32_t half = ((magnitude - 0x38000000u) >> 13); // rebias exponent 127 -> 15
  const uint32_t rest = magnitude & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u)))
    ++half;
  return static_cast<uint16_t>(sign | half);
}

/// cvt.f32.f16 (exact).
inline float half_to_float(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1fu;
  const uint32_t mantissa = half & 0x3ffu;
  if (exponent == 0x1f)
    return bits_float(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    const float value = static_cast<float>(mantissa) * (1.0f / 16777216.0f);
    return sign ? -value : value;
  }
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

/// cvt.rn.{bf16x2,f16x2}.f32 d, hi, lo.
inline uint32_t pack_pair(float lo, float hi, bool bf16) {
  const uint32_t low = bf16 ? float_to_bf16(lo) : float_to_half(lo);
  const uint32_t high = bf16 ? float_to_bf16(hi) : float_to_half(hi);
  return low | (high << 16);
}

// (No standard C++ headers: they would double a unit's compile time.)
template <size_t... I> struct Indices {};
template <size_t N, size_t... I> struct MakeIndices : MakeIndices<N - 1, N - 1, I...> {};
template <size_t... I> struct MakeIndices<0, I...> {
  using type = Indices<I...>;
};

/// Calls a kernel with the arguments of cuLaunchKernel's parameter array
/// (kernel parameters are never references; top-level const is not part of
/// the function type).
template <typename... Args, size_t... I>
void invoke(void (*kernel)(Args...), void **params, Indices<I...>) {
  kernel(*static_cast<Args *>(params[I])...);
}
template <typename... Args> void invoke(void (*kernel)(Args...), void **params) {
  invoke(kernel, params, typename MakeIndices<sizeof...(Args)>::type{});
}
template <typename... Args>
const unsigned long *parameter_sizes(void (*)(Args...), unsigned *count) {
  static const unsigned long sizes[] = {sizeof(Args)..., 0};
  *count = sizeof...(Args);
  return sizes;
}

} // namespace pagedc_emu

//===--- CUDA built-ins ---------------------------------------------------===//

#define threadIdx (*reinterpret_cast<const pagedc_emu::IndexView *>(pagedc_emu::index()->thread_idx))
#define blockIdx (*reinterpret_cast<const pagedc_emu::IndexView *>(pagedc_emu::index()->block_idx))
#define blockDim (*reinterpret_cast<const pagedc_emu::IndexView *>(pagedc_emu::index()->block_dim))
#define gridDim (*reinterpret_cast<const pagedc_emu::IndexView *>(pagedc_emu::index()->grid_dim))

#define PAGEDC_EXTERN_SHARED(type, name)                                                  \
  type *const name = reinterpret_cast<type *>(pagedc_emu::dynamic_shared())
#define PAGEDC_SHARED(type, name, count)                                                  \
  static unsigned name##_pagedc_slot;                                                     \
  type(&name)[count] = *reinterpret_cast<type(*)[count]>(                                \
      pagedc_emu::static_shared(&name##_pagedc_slot, sizeof(type[count]), alignof(type)))

inline void __syncthreads(PAGEDC_EMU_SITE) { pagedc_emu::syncthreads(file, line); }
inline float __shfl_xor_sync(unsigned mask, float value, int lane_mask, PAGEDC_EMU_SITE) {
  return pagedc_emu::bits_float(
      pagedc_emu::shfl_xor(mask, pagedc_emu::float_bits(value), lane_mask, file, line));
}
inline int __shfl_xor_sync(unsigned mask, int value, int lane_mask, PAGEDC_EMU_SITE) {
  return static_cast<int>(
      pagedc_emu::shfl_xor(mask, static_cast<unsigned>(value), lane_mask, file, line));
}
inline unsigned __shfl_xor_sync(unsigned mask, unsigned value, int lane_mask, PAGEDC_EMU_SITE) {
  return pagedc_emu::shfl_xor(mask, value, lane_mask, file, line);
}
// __shfl_sync reads lane `source` of the warp: the emulator's shuffle
// collective takes each lane's partner as lane ^ lane_mask, so the mask is
// lane ^ source (the lane from the block's linear thread index, as warps
// are formed).
inline unsigned __shfl_sync(unsigned mask, unsigned value, int source, PAGEDC_EMU_SITE) {
  const PagedcEmuThreadIndex *index = pagedc_emu::index();
  const unsigned lane =
      (index->thread_idx[0] +
       index->block_dim[0] * (index->thread_idx[1] + index->block_dim[1] * index->thread_idx[2])) &
      31u;
  return pagedc_emu::shfl_xor(mask, value, static_cast<int>((lane ^ source) & 31u), file, line);
}
inline int __shfl_sync(unsigned mask, int value, int source, PAGEDC_EMU_SITE) {
  return static_cast<int>(__shfl_sync(mask, static_cast<unsigned>(value), source, file, line));
}
inline unsigned __ballot_sync(unsigned mask, int predicate, PAGEDC_EMU_SITE) {
  return pagedc_emu::ballot(mask, predicate, file, line);
}
// __syncwarp: the lanes of `mask` meet, as at a ballot (the emulator's
// warp rendezvous).
inline void __syncwarp(unsigned mask = 0xffffffffu, PAGEDC_EMU_SITE) {
  (void)pagedc_emu::ballot(mask, 1, file, line);
}
inline int atomicAdd(int *address, int value, PAGEDC_EMU_SITE) {
  return pagedc_emu::atomic_add(address, value, file, line);
}
inline int __popc(unsigned value) { return __builtin_popcount(value); }
inline int __popcll(unsigned long long value) { return __builtin_popcountll(value); }
inline int __clz(int value) { return value == 0 ? 32 : __builtin_clz(static_cast<unsigned>(value)); }
inline int __clzll(long long value) {
  return value == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(value));
}
inline int __ffs(int value) { return __builtin_ffs(value); }
inline int __ffsll(long long value) { return __builtin_ffsll(value); }
inline float __int_as_float(int value) {
  return pagedc_emu::bits_float(static_cast<uint32_t>(value));
}
inline float __uint_as_float(unsigned value) { return pagedc_emu::bits_float(value); }
inline int __float_as_int(float value) { return static_cast<int>(pagedc_emu::float_bits(value)); }
inline unsigned __float_as_uint(float value) { return pagedc_emu::float_bits(value); }

//===--- The image's exports and the instrumentation hooks -----------------===//

#define PAGEDC_EMU_EXPORT extern "C" __attribute__((visibility("default")))
#define PAGEDC_EMU_HOOK extern "C" __attribute__((no_sanitize("thread"), visibility("hidden")))

PAGEDC_EMU_EXPORT __attribute__((no_sanitize("thread"))) int
pagedc_emu_image_bind(const PagedcEmuRuntime *runtime) {
  if (!runtime || runtime->abi_version != PAGEDC_EMU_ABI_VERSION)
    return PAGEDC_EMU_ABI_VERSION;
  pagedc_emu::runtime = runtime;
  return 0;
}

/// One exported entry per kernel (the emulator build appends these).
#define PAGEDC_EMU_ENTRY(kernel)                                                          \
  PAGEDC_EMU_EXPORT void pagedc_emu_entry_##kernel(void **params) {                       \
    pagedc_emu::invoke(kernel, params);                                                   \
  }                                                                                       \
  PAGEDC_EMU_EXPORT __attribute__((no_sanitize("thread"))) const unsigned long            \
      *pagedc_emu_params_##kernel(unsigned *count) {                                      \
    return pagedc_emu::parameter_sizes(kernel, count);                                    \
  }

#define PAGEDC_EMU_ACCESS_HOOKS(size)                                                     \
  PAGEDC_EMU_HOOK void __tsan_read##size(void *address) {                                 \
    pagedc_emu::runtime->access(address, size, PAGEDC_EMU_READ, __builtin_return_address(0)); \
  }                                                                                       \
  PAGEDC_EMU_HOOK void __tsan_write##size(void *address) {                                \
    pagedc_emu::runtime->access(address, size, PAGEDC_EMU_WRITE,                          \
                                __builtin_return_address(0));                             \
  }                                                                                       \
  PAGEDC_EMU_HOOK void __tsan_unaligned_read##size(void *address) {                       \
    pagedc_emu::runtime->access(address, size, PAGEDC_EMU_READ | PAGEDC_EMU_UNALIGNED,    \
                                __builtin_return_address(0));                             \
  }                                                                                       \
  PAGEDC_EMU_HOOK void __tsan_unaligned_write##size(void *address) {                      \
    pagedc_emu::runtime->access(address, size, PAGEDC_EMU_WRITE | PAGEDC_EMU_UNALIGNED,   \
                                __builtin_return_address(0));                             \
  }                                                                                       \
  PAGEDC_EMU_HOOK void __tsan_volatile_read##size(void *address) {                        \
    pagedc_emu::runtime->access(address, size, PAGEDC_EMU_READ, __builtin_return_address(0)); \
  }                                                                                       \
  PAGEDC_EMU_HOOK void __tsan_volatile_write##size(void *address) {                       \
    pagedc_emu::runtime->access(address, size, PAGEDC_EMU_WRITE,                          \
                                __builtin_return_address(0));                             \
  }
PAGEDC_EMU_ACCESS_HOOKS(1)
PAGEDC_EMU_ACCESS_HOOKS(2)
PAGEDC_EMU_ACCESS_HOOKS(4)
PAGEDC_EMU_ACCESS_HOOKS(8)
PAGEDC_EMU_ACCESS_HOOKS(16)
PAGEDC_EMU_HOOK void __tsan_read_range(void *address, unsigned long size) {
  pagedc_emu::runtime->access_range(address, size, PAGEDC_EMU_READ, __builtin_return_address(0));
}
PAGEDC_EMU_HOOK void __tsan_write_range(void *address, unsigned long size) {
  pagedc_emu::runtime->access_range(address, size, PAGEDC_EMU_WRITE, __builtin_return_address(0));
}
PAGEDC_EMU_HOOK void *__tsan_memcpy(void *target, const void *source, unsigned long size) {
  pagedc_emu::runtime->access_range(source, size, PAGEDC_EMU_READ, __builtin_return_address(0));
  pagedc_emu::runtime->access_range(target, size, PAGEDC_EMU_WRITE, __builtin_return_address(0));
  return memcpy(target, source, size);
}
PAGEDC_EMU_HOOK void *__tsan_memmove(void *target, const void *source, unsigned long size) {
  pagedc_emu::runtime->access_range(source, size, PAGEDC_EMU_READ, __builtin_return_address(0));
  pagedc_emu::runtime->access_range(target, size, PAGEDC_EMU_WRITE, __builtin_return_address(0));
  return memmove(target, source, size);
}
PAGEDC_EMU_HOOK void *__tsan_memset(void *target, int value, unsigned long size) {
  pagedc_emu::runtime->access_range(target, size, PAGEDC_EMU_WRITE, __builtin_return_address(0));
  return memset(target, value, size);
}
PAGEDC_EMU_HOOK void __tsan_init() {}
PAGEDC_EMU_HOOK void __tsan_func_entry(void *) {}
PAGEDC_EMU_HOOK void __tsan_func_exit() {}
PAGEDC_EMU_HOOK void __tsan_vptr_update(void **, void *) {}
PAGEDC_EMU_HOOK void __tsan_vptr_read(void **) {}
PAGEDC_EMU_HOOK void __tsan_ignore_thread_begin() {}
PAGEDC_EMU_HOOK void __tsan_ignore_thread_end() {}
