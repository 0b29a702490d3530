/*===- KernelAbi.h - Between an emulator kernel image and the emulator -*- C -*-===*\
|*                                                                            *|
|* A kernel built for the emulator is the kernel's CUDA translation unit      *|
|* compiled by the host C++ compiler into a shared object. This header,       *|
|* embedded verbatim into that unit (as KernelArgs.h is for NVRTC) and        *|
|* included by the emulator, is everything the two sides share:               *|
|*                                                                            *|
|*  - the image exports pagedc_emu_image_bind(runtime, kernel_names) which    *|
|*    stores the emulator's function table and checks the ABI version,        *|
|*    and one entry pagedc_emu_entry_<kernel>(void **params) per kernel that  *|
|*    unpacks cuLaunchKernel's parameter array and calls the kernel body;     *|
|*  - every device intrinsic (barriers, warp collectives, cp.async, tensor    *|
|*    core MMA, atomics) and every instrumented memory access of the kernel   *|
|*    calls through the table, on the fiber of the CUDA thread doing it.      *|
|*                                                                            *|
|* Source locations are (file, line) as the unit's #line directives give     *|
|* them, so reports name template lines, not lines of the assembled unit.    *|
|*                                                                            *|
\*===------------------------------------------------------------------------===*/
#ifndef PAGEDC_EMU_KERNELABI_H
#define PAGEDC_EMU_KERNELABI_H

#ifdef __cplusplus
extern "C" {
#endif

#define PAGEDC_EMU_ABI_VERSION 3

/** The CUDA built-in index variables of the running thread. */
typedef struct PagedcEmuThreadIndex {
  unsigned thread_idx[3];
  unsigned block_idx[3];
  unsigned block_dim[3];
  unsigned grid_dim[3];
} PagedcEmuThreadIndex;

/** Flags of PagedcEmuRuntime::access. */
enum {
  PAGEDC_EMU_READ = 0,
  PAGEDC_EMU_WRITE = 1,
  /** The access is not naturally aligned by the compiler's own account. */
  PAGEDC_EMU_UNALIGNED = 2,
};

/** Transcendental functions with hardware approximations on the GPU. */
enum {
  PAGEDC_EMU_EX2_APPROX_FTZ = 0,
  PAGEDC_EMU_TANH_APPROX = 1,
};

/** What PagedcEmuRuntime::tally counts: a warp's KV-tile visits of a
 * prefill kernel by path (every element kept, or masked per element) and
 * its 16-row groups whose output the tile rescaled. The performance model's
 * issue term weighs static per-path instruction counts with them. */
enum {
  PAGEDC_EMU_TALLY_KEPT_TILE = 0,
  PAGEDC_EMU_TALLY_MASKED_TILE = 1,
  PAGEDC_EMU_TALLY_RESCALED_ROWS = 2,
};

/** Fences of PagedcEmuRuntime::fence. */
enum {
  /** fence.proxy.async.shared::cta: this thread's earlier generic-proxy
   * shared stores become visible to the async proxy (wgmma operands,
   * bulk copies). */
  PAGEDC_EMU_FENCE_PROXY_ASYNC = 0,
  /** fence.mbarrier_init.release.cluster */
  PAGEDC_EMU_FENCE_MBARRIER_INIT = 1,
};

/** One wgmma.mma_async.sync.aligned.m64nNk16.f32.{bf16,f16} as a thread
 * issues it (ABI 2). */
typedef struct PagedcEmuWgmma {
  /** N: 8..256, a multiple of 8. */
  unsigned n;
  /** 1: bf16 operands, 0: f16. */
  int bf16;
  /** 1: A is in a[] (the thread's fragment), else in shared memory at
   * desc_a. */
  int a_in_registers;
  unsigned a[4];
  unsigned long long desc_a, desc_b;
  /** imm-trans-a / imm-trans-b: 1 = M- or N-major in shared memory. */
  int trans_a, trans_b;
  /** scale-d: 0 gives D = A B, 1 gives D = A B + D. */
  int scale_d;
} PagedcEmuWgmma;

/** The emulator's side of the interface: one table per process. */
typedef struct PagedcEmuRuntime {
  unsigned abi_version;
  const PagedcEmuThreadIndex *(*thread_index)(void);
  /** The block's dynamic shared memory (extern __shared__). */
  unsigned char *(*dynamic_shared)(void);
  /** A static __shared__ array: `*slot` holds its offset in the block's
   * static region once assigned (0 = not yet; offsets start at 16). */
  unsigned char *(*static_shared)(unsigned *slot, unsigned bytes, unsigned align);
  /** cvta.to.shared: the 32-bit shared-window address of a pointer. */
  unsigned (*shared_address)(const void *pointer, const char *file, int line);
  void (*syncthreads)(const char *file, int line);
  unsigned (*shfl_xor)(unsigned mask, unsigned value, int lane_mask, const char *file, int line);
  unsigned (*ballot)(unsigned mask, int predicate, const char *file, int line);
  /** ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 */
  void (*ldmatrix_x4)(unsigned fragment[4], unsigned address, int transpose, const char *file,
                      int line);
  /** mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32, in place. */
  void (*mma_16816)(float acc[4], const unsigned a[4], unsigned b0, unsigned b1, int bf16,
                    const char *file, int line);
  /** cp.async.cg.shared.global 16 bytes, src-size valid_bytes (0..16). */
  void (*cp_async_16)(unsigned shared, const void *global, int valid_bytes, const char *file,
                      int line);
  void (*cp_async_commit)(const char *file, int line);
  void (*cp_async_wait)(int pending, const char *file, int line);
  int (*atomic_add_i32)(int *address, int value, const char *file, int line);
  float (*approx)(int function, float x);
  /** Every load and store the compiler instrumented; `pc` is its return
   * address in the image. */
  void (*access)(const void *address, unsigned long size, int flags, const void *pc);
  /** memcpy/memset/memmove the compiler emitted (checked as ranges). */
  void (*access_range)(const void *address, unsigned long size, int flags, const void *pc);

  /* ABI 2: sm_90 (Hopper). Shared addresses are cvta.to.shared ones. */
  /** mbarrier.init.shared::cta.b64 [address], count */
  void (*mbarrier_init)(unsigned address, unsigned count, const char *file, int line);
  /** mbarrier.arrive[.expect_tx].shared::cta.b64: with expect_tx, the
   * barrier's tx-count grows by tx_bytes before the arrival. */
  void (*mbarrier_arrive)(unsigned address, int expect_tx, unsigned tx_bytes, const char *file,
                          int line);
  /** mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [address], tx_bytes */
  void (*mbarrier_expect_tx)(unsigned address, unsigned tx_bytes, const char *file, int line);
  /** A loop of mbarrier.try_wait.parity.shared::cta.b64 until it succeeds:
   * returns once the phase of parity `parity` has completed. */
  void (*mbarrier_wait)(unsigned address, unsigned parity, const char *file, int line);
  /** cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes */
  void (*bulk_copy)(unsigned shared, const void *global, unsigned bytes, unsigned mbarrier,
                    const char *file, int line);
  void (*fence)(int kind, const char *file, int line);
  /** bar.sync id, threads (sync != 0) or bar.arrive id, threads. */
  void (*named_barrier)(unsigned id, unsigned threads, int sync, const char *file, int line);
  /** wgmma.fence / wgmma.commit_group / wgmma.wait_group N (.sync.aligned) */
  void (*wgmma_fence)(const char *file, int line);
  void (*wgmma_commit)(const char *file, int line);
  void (*wgmma_wait)(int pending, const char *file, int line);
  /** wgmma.mma_async: `d` holds the thread's n / 2 accumulators; the
   * results land in it at the wgmma.wait_group that retires the group. */
  void (*wgmma)(const PagedcEmuWgmma *op, float *d, const char *file, int line);
  /** setmaxnreg.{inc,dec}.sync.aligned.u32 count */
  void (*setmaxnreg)(unsigned count, int increase, const char *file, int line);
  /** cp.async.bulk.tensor.<rank>d.shared::cluster.global.tile
   * .mbarrier::complete_tx::bytes: the box at `coordinates` (innermost
   * first) of the tensor map (the kernel parameter's bytes, as
   * cuTensorMapEncodeTiled of the emulated driver wrote them). */
  void (*bulk_tensor_copy)(unsigned shared, const void *tensor_map, const int *coordinates,
                           int rank, unsigned mbarrier, const char *file, int line);
  /** cp.async.mbarrier.arrive.noinc.shared::cta.b64: one of the barrier's
   * expected arrivals, made once this thread's earlier cp.asyncs landed. */
  void (*cp_async_mbarrier_arrive)(unsigned mbarrier, const char *file, int line);

  /* ABI 3 */
  /** Counts one event of PAGEDC_EMU_TALLY_* for the launch's counters (no
   * instruction of the GPU: the kernels call it from their emulator
   * branches only, once per warp). */
  void (*tally)(int what);
} PagedcEmuRuntime;

/** An image as cuModuleLoadData takes it: these 16 bytes, the shared
 * object's size as 8 little-endian bytes, then the shared object. */
#define PAGEDC_EMU_IMAGE_MAGIC "PAGEDC-EMU-IMG1\n"
#define PAGEDC_EMU_IMAGE_HEADER_BYTES 24

/** Exported by every image: 0 on success, else the image's ABI version. */
typedef int (*PagedcEmuBindFunction)(const PagedcEmuRuntime *runtime);
/** Exported per kernel as pagedc_emu_entry_<name>. */
typedef void (*PagedcEmuEntryFunction)(void **params);
/** Exported per kernel as pagedc_emu_params_<name>: the byte size of each
 * parameter, so the emulator copies them at launch as a driver does. */
typedef const unsigned long *(*PagedcEmuParamsFunction)(unsigned *count);
/* Optionally exported per kernel as const int pagedc_emu_ctas_per_sm_<name>:
 * the minimum CTAs an SM of its __launch_bounds__ (empty in an image), from
 * which the emulator derives the registers a thread holds at launch. */

#ifdef __cplusplus
}
#endif

#endif /* PAGEDC_EMU_KERNELABI_H */
