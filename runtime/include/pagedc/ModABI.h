/*===- ModABI.h - The C ABI of compiled mods on the CPU ---------*- C -*-===*\
|*                                                                          *|
|* Compiled mods are plain C functions. The CPU JIT (compiler side) emits   *|
|* them; the CPU attention kernels and block-mask builder (runtime side)    *|
|* call them. Every function evaluates one row segment: a fixed (b, h, q)   *|
|* and `count` consecutive *logical* kv indices starting at kv_begin.       *|
|*                                                                          *|
\*===----------------------------------------------------------------------===*/
#ifndef PAGEDC_MODABI_H
#define PAGEDC_MODABI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/// A bound captured buffer. Up to rank 4; sizes and strides are in elements.
/// The element type is the one declared in the .attn file.
typedef struct PagedcBufferRef {
  const void *data;
  int64_t sizes[4];
  int64_t strides[4];
} PagedcBufferRef;

/// One 32-bit slot per declared param, in declaration order:
/// i32 as int32_t, f32 as float, bool as int32_t 0 or 1.
typedef union PagedcParamSlot {
  int32_t i32;
  float f32;
} PagedcParamSlot;

/// Everything a mod may read besides its index arguments.
typedef struct PagedcModContext {
  const PagedcBufferRef *buffers; /* in declaration order */
  const PagedcParamSlot *params;  /* in declaration order */
} PagedcModContext;

/// out[i] = mask(b, h, q, kv_begin + i) ? 1 : 0, for i in [0, count).
typedef void (*PagedcMaskRowFn)(const PagedcModContext *ctx, int32_t b,
                                int32_t h, int32_t q, int32_t kv_begin,
                                int32_t count, uint8_t *out);

/// scores[i] = score(scores[i], b, h, q, kv_begin + i), for i in [0, count).
/// scores hold the scaled q.k logits on entry.
typedef void (*PagedcScoreRowFn)(const PagedcModContext *ctx, int32_t b,
                                 int32_t h, int32_t q, int32_t kv_begin,
                                 int32_t count, float *scores);

/// Block classification over a rectangle of indices, q in [q_lo, q_hi] and
/// kv in [kv_lo, kv_hi] (inclusive): 0 = every element masked out,
/// 1 = mixed or unknown (mask_mod must run), 2 = every element kept.
/// Returning 1 is always correct; the other answers must be exact.
typedef int32_t (*PagedcBlockClassFn)(const PagedcModContext *ctx, int32_t b,
                                      int32_t h, int32_t q_lo, int32_t q_hi,
                                      int32_t kv_lo, int32_t kv_hi);

#ifdef __cplusplus
}
#endif

#endif /* PAGEDC_MODABI_H */
