//===- HopperTest.cpp - The emulator's sm_90 instructions on hand-made kernels -===//
//
// Kernels written for this test with Hopper.cuh's wrappers, run on the
// emulator and checked against a float64 product of the same bf16 inputs:
//  - wgmma with A and B from shared memory (128-byte swizzled, K-major),
//    A from registers, B N-major (imm-trans-b), N 64 and 128;
//  - a producer warpgroup feeding a consumer warpgroup through a two-stage
//    ring of bulk copies guarded by full/empty mbarriers, with setmaxnreg;
//  - named barriers between warpgroups;
// and the bugs each checker must find: a missing mbarrier wait, a wrong
// expect-tx byte count, a ring stage reused before its consumer released
// it, a missing wgmma.wait_group, a missing wgmma.fence, a missing
// fence.proxy.async (before a wgmma, and before a bulk copy over generic
// stores or generic reads), a missing named barrier, setmaxnreg counts that go the wrong way
// or past the CTA's pool (counting an exited warp's registers as in use).
// The same kernels are compiled for sm_90a with
// NVRTC, so the PTX side of every wrapper assembles.
//
//===----------------------------------------------------------------------===//

#include "pagedc-emu/Emulator.h"
#include "pagedc/EmulatorBuild.h"
#include "pagedc/KernelSource.h"
#include "pagedc/Nvrtc.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace pagedc;

constexpr const char *kKernels = R"(
namespace hopper_test {
using namespace pagedc;

/// Byte offset of element (row, k) in a 128-byte-swizzled tile of 64
/// 16-bit elements per row (1024-byte aligned): 16-byte chunk c of row r
/// sits at chunk c ^ (r % 8).
__device__ __forceinline__ uint32_t swizzled(int row, int column) {
  const int chunk = (column * 2) / 16;
  return row * 128 + ((chunk ^ (row % 8)) * 16) + (column * 2) % 16;
}

/// The first 1024-byte aligned shared address of the dynamic area.
__device__ __forceinline__ uint32_t aligned_base(unsigned char *shared) {
  return (shared_address(shared) + 1023u) & ~1023u;
}

/// C (64 x kN) = A (64 x 64) B^T, B given as kN rows of 64 (K-major) or,
/// with kTransB, stored N-major (row k holds B[0..kN) at column k).
/// `data`: A [64][64] then B [kN][64] as bf16 bits in floats' low halves,
/// C out at offset 64 * 64 + kN * 64. mode 0: A in shared memory, 1: A in
/// registers. bug 1: no fence.proxy.async after the generic stores;
/// bug 2: no wgmma.fence; bug 3: an accumulator written (1 added)
/// between the last wgmma and its wait.
template <int kN, bool kTransB>
__device__ void wgmma_gemm(float *data, int mode, int bug) {
  PAGEDC_EXTERN_SHARED(unsigned char, shared);
  const uint32_t base = aligned_base(shared);
  unsigned char *tiles = shared + (base - shared_address(shared));
  const uint32_t a_tile = base, b_tile = base + 8192;
  const int tid = threadIdx.x;
  for (int i = tid; i < 64 * 64; i += 128) {
    const uint16_t bits = static_cast<uint16_t>(__float_as_uint(data[i]) & 0xffffu);
    *reinterpret_cast<uint16_t *>(tiles + swizzled(i / 64, i % 64)) = bits;
  }
  for (int i = tid; i < kN * 64; i += 128) {
    const int n = i / 64, k = i % 64;
    const uint16_t bits = static_cast<uint16_t>(__float_as_uint(data[4096 + i]) & 0xffffu);
    // K-major: row n of 64 k; N-major: 64-column chunks of n, rows k.
    const uint32_t at = kTransB ? (n / 64) * 8192 + swizzled(k, n % 64) : swizzled(n, k);
    *reinterpret_cast<uint16_t *>(tiles + 8192 + at) = bits;
  }
  if (bug != 1)
    fence_proxy_async();
  __syncthreads();
  float d[kN / 2];
  for (int i = 0; i < kN / 2; ++i)
    d[i] = 0.0f;
  if (bug != 2)
    wgmma_fence();
  for (int step = 0; step < 4; ++step) {
    const uint64_t desc_b =
        kTransB ? wgmma_descriptor(b_tile + step * 2048, 8192, 1024, kSwizzle128)
                : wgmma_descriptor(b_tile + step * 32, 16, 1024, kSwizzle128);
    if (mode == 0) {
      const uint64_t desc_a = wgmma_descriptor(a_tile + step * 32, 16, 1024, kSwizzle128);
      wgmma_ss<kN, true, kTransB>(d, desc_a, desc_b, step > 0);
    } else {
      // The thread's A fragment, read from global memory.
      const int warp = tid / 32, lane = tid % 32;
      const int row = 16 * warp + lane / 4, col = step * 16 + 2 * (lane % 4);
      auto pair = [&](int r, int c) {
        return (__float_as_uint(data[r * 64 + c]) & 0xffffu) |
               ((__float_as_uint(data[r * 64 + c + 1]) & 0xffffu) << 16);
      };
      const uint32_t a[4] = {pair(row, col), pair(row + 8, col), pair(row, col + 8),
                             pair(row + 8, col + 8)};
      wgmma_rs<kN, true, kTransB>(d, a, desc_b, step > 0);
    }
  }
  wgmma_commit();
  if (bug == 3)
    d[0] += 1.0f;
  wgmma_wait<0>();
  const int warp = tid / 32, lane = tid % 32;
  float *c = data + 4096 + kN * 64;
  for (int i = 0; i < kN / 2; ++i) {
    const int row = 16 * warp + lane / 4 + 8 * ((i / 2) % 2);
    const int col = 8 * (i / 4) + 2 * (lane % 4) + (i % 2);
    c[row * kN + col] = d[i];
  }
}

/// A producer warpgroup streams the K tiles of A (64 x 64) and B (64 x 64)
/// through a two-stage ring; the consumer warpgroup multiplies. Sources:
/// kBulk: one elected thread bulk-copies 8 KiB images pre-swizzled in global
/// memory; kTensor: it copies boxes of the row-major matrices through tensor
/// maps with 128-byte swizzle (rows or columns past the tensor are zeros);
/// kGather: warp 0 gathers 16-byte chunks of the row-major matrices with
/// cp.async into their swizzled places, each lane arriving on the full
/// barrier when its copies land.
/// bug 1: the consumer skips the full-barrier wait; 2: expect-tx 16 bytes
/// short; 3: the producer skips the empty-barrier wait; 4: the consumer
/// stores its accumulators before wgmma.wait_group and releases the stage
/// with its wgmma still reading; 5 (kGather): no proxy fence before wgmma.
enum Source { kBulk, kTensor, kGather };
template <Source kSource>
__device__ void ring_gemm(float *data, const unsigned char *a_source,
                          const unsigned char *b_source, const TensorMap *a_map,
                          const TensorMap *b_map, int k_tiles, int bug) {
  PAGEDC_EXTERN_SHARED(unsigned char, shared);
  const uint32_t base = aligned_base(shared);
  // Stage s: A at base + s * 16384, B 8 KiB after it; barriers after both.
  const uint32_t barriers = base + 2 * 16384;
  const uint32_t full0 = barriers, empty0 = barriers + 16;
  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int s = 0; s < 2; ++s) {
      mbarrier_init(full0 + 8 * s, kSource == kGather ? 32 : 1);
      mbarrier_init(empty0 + 8 * s, 128);
    }
    fence_mbarrier_init();
  }
  __syncthreads();
  if (tid < 128) {
    setmaxnreg_dec<40>();
    if (tid >= (kSource == kGather ? 32 : 1))
      return;
    for (int t = 0; t < k_tiles; ++t) {
      const int s = t % 2;
      const uint32_t a_tile = base + s * 16384, b_tile = a_tile + 8192;
      if (bug != 3)
        mbarrier_wait(empty0 + 8 * s, ((t / 2) & 1) ^ 1);
      if (kSource == kBulk) {
        mbarrier_arrive_expect_tx(full0 + 8 * s, bug == 2 ? 16384 - 16 : 16384);
        bulk_copy_g2s(a_tile, a_source + t * 8192, 8192, full0 + 8 * s);
        bulk_copy_g2s(b_tile, b_source + t * 8192, 8192, full0 + 8 * s);
      } else if (kSource == kTensor) {
        mbarrier_arrive_expect_tx(full0 + 8 * s, bug == 2 ? 16384 - 16 : 16384);
        const int at[2] = {64 * t, 0};
        bulk_tensor_g2s<2>(a_tile, a_map, at, full0 + 8 * s);
        bulk_tensor_g2s<2>(b_tile, b_map, at, full0 + 8 * s);
      } else {
        // Row-major [64][64 * k_tiles] bf16: lane l moves chunks l, l + 32, ...
        for (int chunk = tid; chunk < 512; chunk += 32) {
          const int row = chunk / 8, c = chunk % 8;
          const int64_t from = (int64_t(row) * 64 * k_tiles + 64 * t + 8 * c) * 2;
          const uint32_t to = row * 128 + ((c ^ (row % 8)) * 16);
          cp_async_16(a_tile + to, a_source + from, 16);
          cp_async_16(b_tile + to, b_source + from, 16);
        }
        cp_async_mbarrier_arrive(full0 + 8 * s);
      }
    }
    return;
  }
  setmaxnreg_inc<232>();
  float d[32];
  for (int i = 0; i < 32; ++i)
    d[i] = 0.0f;
  for (int t = 0; t < k_tiles; ++t) {
    const int s = t % 2;
    if (bug != 1)
      mbarrier_wait(full0 + 8 * s, (t / 2) & 1);
    // cp.async writes through the generic proxy: the consumer makes what it
    // acquired visible to its wgmma (the async proxy).
    if (kSource == kGather && bug != 5)
      fence_proxy_async();
    wgmma_fence();
    for (int step = 0; step < 4; ++step) {
      const uint32_t a_tile = base + s * 16384, b_tile = a_tile + 8192;
      wgmma_ss<64, true, false>(d, wgmma_descriptor(a_tile + step * 32, 16, 1024, kSwizzle128),
                                wgmma_descriptor(b_tile + step * 32, 16, 1024, kSwizzle128),
                                t > 0 || step > 0);
    }
    wgmma_commit();
    if (bug != 4)
      wgmma_wait<0>();
    mbarrier_arrive(empty0 + 8 * s);
  }
  const int c = tid - 128, warp = c / 32, lane = c % 32;
  for (int i = 0; i < 32; ++i) {
    const int row = 16 * warp + lane / 4 + 8 * ((i / 2) % 2);
    const int col = 8 * (i / 4) + 2 * (lane % 4) + (i % 2);
    data[row * 64 + col] = d[i];
  }
  if (bug == 4)
    wgmma_wait<0>();
}

/// Warpgroup 0 writes shared words that warpgroup 1 reads after a named
/// barrier (bar.arrive / bar.sync 1, 256); bug 1: no barrier.
__device__ void named_handoff(float *data, int bug) {
  PAGEDC_EXTERN_SHARED(unsigned char, shared);
  float *words = reinterpret_cast<float *>(shared);
  const int tid = threadIdx.x;
  if (tid < 128) {
    words[tid] = data[tid] * 2.0f;
    if (bug != 1)
      named_barrier_arrive(1, 256);
  } else {
    if (bug != 1)
      named_barrier_sync(1, 256);
    data[tid] = words[tid - 128];
  }
}

/// One shared word read by all 128 threads, then rewritten by thread 0
/// after a named barrier (bar.sync 1, 128) that orders every read before
/// the write; bug 1: no barrier between the reads and the write.
__device__ void many_readers(float *data, int bug) {
  PAGEDC_EXTERN_SHARED(unsigned char, shared);
  float *word = reinterpret_cast<float *>(shared);
  const int tid = threadIdx.x;
  if (tid == 0)
    word[0] = data[0];
  named_barrier_sync(1, 128);
  const float first = word[0];
  if (bug != 1)
    named_barrier_sync(1, 128);
  if (tid == 0)
    word[0] = first + 1.0f;
  named_barrier_sync(1, 128);
  data[tid] = first + word[0];
}

/// Warpgroup 0 hands registers to warpgroup 1, launched at 128 a thread
/// (a pool of 32768): mode 0: .dec to 40, .inc to 216 (the pool, exactly);
/// 1: the counts swapped (a .dec above the warps' count, an .inc below it);
/// 2: .inc to 232 (past the pool: it waits for registers no warp frees);
/// 3: warpgroup 0's .dec only after a named barrier that warpgroup 1
/// passes before its .inc, which waits for the .dec; 4: warpgroup 0 exits
/// without a .dec (after a named barrier, so it has exited before the .inc):
/// its registers stay out of the pool; 5: as 4 with the .dec before the exit.
__device__ void register_handoff(float *data, int mode) {
  const int tid = threadIdx.x;
  if (mode >= 4) {
    data[tid] = static_cast<float>(tid);
    if (tid < 128) {
      if (mode == 5)
        setmaxnreg_dec<40>();
      named_barrier_arrive(1, 256);
      return;
    }
    named_barrier_sync(1, 256);
    setmaxnreg_inc<216>();
    return;
  }
  if (tid < 128) {
    if (mode == 3)
      named_barrier_sync(1, 256);
    if (mode == 1)
      setmaxnreg_dec<216>();
    else
      setmaxnreg_dec<40>();
  } else {
    if (mode == 3)
      named_barrier_arrive(1, 256);
    if (mode == 1)
      setmaxnreg_inc<40>();
    else if (mode == 2)
      setmaxnreg_inc<232>();
    else
      setmaxnreg_inc<216>();
  }
  data[tid] = static_cast<float>(tid);
}

/// Every thread stores a shared word (the generic proxy), then thread 0
/// bulk-copies `source` over the 512 bytes (the async proxy) and all read
/// them: mode 0: thread 0 fences the proxies after the __syncthreads that
/// acquired the stores; 1: each writer fences after its store; 2: no fence
/// (the stores and the copy's writes are unordered); 3: warp 1 fences
/// after the __syncthreads and releases to warp 0 by a named barrier.
/// Modes 4-6: each writer fences, then every thread reads its neighbour's
/// word (the generic proxy) before the copy overwrites it, ordered by a
/// __syncthreads: 4: no fence after the reads; 5: thread 0 fences after
/// that __syncthreads; 6: each reader fences after its read.
__device__ void bulk_over_generic(float *data, const float *source, int mode) {
  PAGEDC_EXTERN_SHARED(unsigned char, shared);
  const uint32_t base = aligned_base(shared);
  float *words = reinterpret_cast<float *>(shared + (base - shared_address(shared)));
  const uint32_t bar = base + 1024;
  const int tid = threadIdx.x;
  if (tid == 0) {
    mbarrier_init(bar, 1);
    fence_mbarrier_init();
  }
  words[tid] = -1.0f;
  if (mode == 1 || mode >= 4)
    fence_proxy_async();
  __syncthreads();
  if (mode >= 4) {
    if (words[(tid + 1) % 128] != -1.0f)
      data[tid] = 0.0f;
    if (mode == 6)
      fence_proxy_async();
    __syncthreads();
  }
  if (mode == 3 && tid >= 32 && tid < 64) {
    fence_proxy_async();
    named_barrier_arrive(1, 64);
  }
  if (mode == 3 && tid < 32)
    named_barrier_sync(1, 64);
  if (tid == 0) {
    if (mode == 0 || mode == 5)
      fence_proxy_async();
    mbarrier_arrive_expect_tx(bar, 512);
    bulk_copy_g2s(base, source, 512, bar);
  }
  mbarrier_wait(bar, 0);
  data[tid] = words[tid];
}
} // namespace hopper_test

extern "C" __global__ void __launch_bounds__(256, 1) register_handoff(float *data, int mode) {
  hopper_test::register_handoff(data, mode);
}
extern "C" __global__ void bulk_over_generic(float *data, const float *source, int mode) {
  hopper_test::bulk_over_generic(data, source, mode);
}
extern "C" __global__ void many_readers(float *data, int bug) {
  hopper_test::many_readers(data, bug);
}
extern "C" __global__ void wgmma_n64(float *data, int mode, int bug) {
  hopper_test::wgmma_gemm<64, false>(data, mode, bug);
}
extern "C" __global__ void wgmma_n128(float *data, int mode, int bug) {
  hopper_test::wgmma_gemm<128, false>(data, mode, bug);
}
extern "C" __global__ void wgmma_n64_trans_b(float *data, int mode, int bug) {
  hopper_test::wgmma_gemm<64, true>(data, mode, bug);
}
extern "C" __global__ void wgmma_n128_trans_b(float *data, int mode, int bug) {
  hopper_test::wgmma_gemm<128, true>(data, mode, bug);
}
extern "C" __global__ void wgmma_n256_trans_b(float *data, int mode, int bug) {
  hopper_test::wgmma_gemm<256, true>(data, mode, bug);
}
extern "C" __global__ void __launch_bounds__(256, 1)
    ring_bulk(float *data, const unsigned char *a, const unsigned char *b, int k_tiles, int bug) {
  hopper_test::ring_gemm<hopper_test::kBulk>(data, a, b, nullptr, nullptr, k_tiles, bug);
}
extern "C" __global__ void __launch_bounds__(256, 1)
    ring_tensor(float *data, const __grid_constant__ pagedc::TensorMap a_map,
                const __grid_constant__ pagedc::TensorMap b_map, int k_tiles, int bug) {
  hopper_test::ring_gemm<hopper_test::kTensor>(data, nullptr, nullptr, &a_map, &b_map, k_tiles,
                                               bug);
}
extern "C" __global__ void __launch_bounds__(256, 1)
    ring_gather(float *data, const unsigned char *a, const unsigned char *b, int k_tiles,
                int bug) {
  hopper_test::ring_gemm<hopper_test::kGather>(data, a, b, nullptr, nullptr, k_tiles, bug);
}
extern "C" __global__ void named_handoff(float *data, int bug) {
  hopper_test::named_handoff(data, bug);
}
)";

const char *const kNames[] = {"wgmma_n64",          "wgmma_n128",         "wgmma_n64_trans_b",
                              "wgmma_n128_trans_b", "wgmma_n256_trans_b", "ring_bulk",
                              "ring_tensor",        "ring_gather",        "named_handoff",
                              "many_readers",       "register_handoff",   "bulk_over_generic"};

std::string unitText() {
  return std::string(embeddedTemplate("Prelude.cuh")) +
         std::string(embeddedTemplate("Hopper.cuh")) + kKernels;
}

/// bf16 bits of `value` (round to nearest even) and back.
uint16_t toBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}
float fromBf16(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, 4);
  return value;
}
float bitsAsFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

/// Random bf16 values in [-1, 1] (none zero), as bit patterns.
std::vector<uint16_t> randomBf16(size_t count, std::mt19937 &random) {
  std::uniform_real_distribution<float> uniform(0.05f, 1.0f);
  std::vector<uint16_t> values(count);
  for (uint16_t &value : values)
    value = toBf16(random() % 2 ? uniform(random) : -uniform(random));
  return values;
}

/// C = A B^T in float64: A [64][K], B [N][K].
std::vector<double> reference(const std::vector<uint16_t> &a, const std::vector<uint16_t> &b,
                              int n, int k) {
  std::vector<double> c(64 * n, 0.0);
  for (int row = 0; row < 64; ++row)
    for (int col = 0; col < n; ++col)
      for (int i = 0; i < k; ++i)
        c[row * n + col] +=
            double(fromBf16(a[row * k + i])) * double(fromBf16(b[col * k + i]));
  return c;
}

double maxError(const float *out, const std::vector<double> &expected) {
  double worst = 0.0;
  for (size_t i = 0; i < expected.size(); ++i)
    worst = std::max(worst, std::fabs(double(out[i]) - expected[i]));
  return worst;
}

std::string describe(const emu::LaunchResult &result) {
  std::string text = result.error;
  for (const emu::Report &report : result.reports)
    text += "\n" + report.format();
  return text;
}

bool hasReport(const emu::LaunchResult &result, const char *checker, const char *text) {
  if (std::getenv("PAGEDC_TEST_VERBOSE"))
    fprintf(stderr, "reports:%s\n", describe(result).c_str());
  for (const emu::Report &report : result.reports)
    if (report.checker == checker && report.message.find(text) != std::string::npos)
      return true;
  return false;
}

/// The test kernels, built once for the emulator.
std::shared_ptr<emu::Module> &module() {
  static std::shared_ptr<emu::Module> loaded = [] {
    std::string code = emulatorPrologue() + unitText();
    for (const char *name : kNames)
      code += std::string("PAGEDC_EMU_ENTRY(") + name + ")\n";
    CompileResult compiled = compileEmulatorUnit(code, "the Hopper test kernels");
    std::string error;
    auto result = emu::loadModule(compiled.image.data(), &error);
    if (!result)
      ADD_FAILURE() << error;
    return result;
  }();
  return loaded;
}

/// `registers`: per thread at launch (setmaxnreg's start; 0: the
/// emulator's default for one CTA per SM).
emu::LaunchResult launch(const char *name, std::vector<void *> params, unsigned threads,
                         unsigned shared, unsigned registers = 0) {
  const emu::Kernel *kernel = module() ? emu::findKernel(*module(), name) : nullptr;
  if (!kernel) {
    emu::LaunchResult missing;
    missing.ok = false;
    missing.error = std::string("no kernel ") + name;
    return missing;
  }
  emu::LaunchConfig config;
  config.block[0] = threads;
  config.dynamicSharedBytes = shared;
  config.maxDynamicSharedBytes = 227 * 1024;
  config.launchRegisters = registers;
  return emu::launch(*kernel, config, params.data(), emu::Checks{});
}

/// One wgmma_gemm launch: the result and the max error against float64.
struct GemmRun {
  emu::LaunchResult result;
  double error = 0, scale = 0;
};
GemmRun runGemm(const char *name, int n, int mode, int bug, uint32_t seed) {
  std::mt19937 random(seed);
  std::vector<uint16_t> a = randomBf16(64 * 64, random), b = randomBf16(n * 64, random);
  const size_t inputs = 4096 + size_t(n) * 64, floats = inputs + 64 * size_t(n);
  auto *data = static_cast<float *>(emu::allocate(floats * sizeof(float)));
  for (size_t i = 0; i < 4096; ++i)
    data[i] = bitsAsFloat(a[i]);
  for (size_t i = 0; i < size_t(n) * 64; ++i)
    data[4096 + i] = bitsAsFloat(b[i]);
  emu::markWritten(data, inputs * sizeof(float));
  float *pointer = data;
  GemmRun run;
  run.result = launch(name, {&pointer, &mode, &bug}, 128, 8192 + n * 128 + 1024);
  const std::vector<double> expected = reference(a, b, n, 64);
  if (run.result.ok)
    run.error = maxError(data + inputs, expected);
  for (double value : expected)
    run.scale = std::max(run.scale, std::fabs(value));
  emu::release(data);
  return run;
}

TEST(Hopper, WgmmaMatchesFloat64Product) {
  struct Case {
    const char *kernel;
    int n, mode;
  };
  uint32_t seed = 11;
  for (const Case &c : {Case{"wgmma_n64", 64, 0}, Case{"wgmma_n64", 64, 1},
                        Case{"wgmma_n128", 128, 0}, Case{"wgmma_n64_trans_b", 64, 0},
                        Case{"wgmma_n64_trans_b", 64, 1}, Case{"wgmma_n128_trans_b", 128, 0},
                        Case{"wgmma_n256_trans_b", 256, 1}}) {
    GemmRun run = runGemm(c.kernel, c.n, c.mode, 0, seed++);
    ASSERT_TRUE(run.result.ok) << c.kernel << " mode " << c.mode << describe(run.result);
    EXPECT_GT(run.scale, 1.0);
    // One f32 rounding per k16 step of sums below 64 in magnitude.
    EXPECT_LT(run.error, 2e-5 * run.scale) << c.kernel << " mode " << c.mode;
    EXPECT_EQ(run.result.counters.wgmma, 4u);
    EXPECT_EQ(run.result.counters.wgmmaFlop, 4ull * 2 * 64 * c.n * 16);
  }
}

TEST(Hopper, WgmmaBugsAreReported) {
  GemmRun unfenced = runGemm("wgmma_n64", 64, 0, 1, 3);
  EXPECT_TRUE(hasReport(unfenced.result, "racecheck", "with no proxy fence"))
      << describe(unfenced.result);
  GemmRun noFence = runGemm("wgmma_n64", 64, 0, 2, 4);
  EXPECT_TRUE(hasReport(noFence.result, "synccheck", "without a wgmma.fence"))
      << describe(noFence.result);
  // The write is lost to the result here, so only the checker can see it.
  GemmRun inFlight = runGemm("wgmma_n64", 64, 0, 3, 5);
  EXPECT_TRUE(hasReport(inFlight.result, "synccheck", "written while it was in flight"))
      << describe(inFlight.result);
  GemmRun clean = runGemm("wgmma_n64", 64, 1, 0, 6);
  EXPECT_TRUE(clean.result.reports.empty()) << describe(clean.result);
}

/// Runs a ring_* kernel over A [64][k] and B [rowsB][k] (rowsB <= 64, the
/// rest zeros) with `bug`; returns the launch and the max error.
GemmRun runRing(const char *kernel, int bug, uint32_t seed, int k = 256, int rowsB = 64) {
  std::mt19937 random(seed);
  const int kTiles = (k + 63) / 64, padded = kTiles * 64;
  std::vector<uint16_t> a = randomBf16(64 * k, random), b = randomBf16(rowsB * k, random);
  // The reference sees the zeros the kernel gets past the tensor's edges.
  std::vector<uint16_t> aPadded(64 * padded, 0), bPadded(64 * padded, 0);
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < k; ++c) {
      aPadded[r * padded + c] = a[r * k + c];
      if (r < rowsB)
        bPadded[r * padded + c] = b[r * k + c];
    }
  const std::string name = kernel;
  unsigned char *aBytes = nullptr, *bBytes = nullptr;
  std::vector<void *> params;
  auto *data = static_cast<float *>(emu::allocate(64 * 64 * sizeof(float)));
  float *pointer = data;
  params.push_back(&pointer);
  emu::TensorMap aMap, bMap;
  alignas(64) unsigned char aEncoded[128];
  alignas(64) unsigned char bEncoded[128];
  if (name == "ring_bulk") {
    // Tile t: 64 rows of 128 bytes, 16-byte chunk c of row r at chunk
    // c ^ (r % 8), as the kernel's descriptors expect.
    auto image = [&](const std::vector<uint16_t> &matrix) {
      auto *bytes = static_cast<unsigned char *>(emu::allocate(kTiles * 8192));
      for (int t = 0; t < kTiles; ++t)
        for (int r = 0; r < 64; ++r)
          for (int c = 0; c < 64; ++c) {
            const int chunk = (c * 2) / 16;
            const int at = t * 8192 + r * 128 + ((chunk ^ (r % 8)) * 16) + (c * 2) % 16;
            std::memcpy(bytes + at, &matrix[r * padded + t * 64 + c], 2);
          }
      emu::markWritten(bytes, kTiles * 8192);
      return bytes;
    };
    aBytes = image(aPadded);
    bBytes = image(bPadded);
  } else {
    // Row-major, unpadded for the tensor maps (their edges give the zeros).
    auto rowMajor = [&](const std::vector<uint16_t> &matrix, int rows, int columns) {
      auto *bytes = static_cast<unsigned char *>(emu::allocate(size_t(rows) * columns * 2));
      std::memcpy(bytes, matrix.data(), size_t(rows) * columns * 2);
      emu::markWritten(bytes, size_t(rows) * columns * 2);
      return bytes;
    };
    if (name == "ring_gather") {
      aBytes = rowMajor(aPadded, 64, padded);
      bBytes = rowMajor(bPadded, 64, padded);
    } else {
      aBytes = rowMajor(a, 64, k);
      bBytes = rowMajor(b, rowsB, k);
      auto encode = [&](emu::TensorMap &map, unsigned char *encoded, unsigned char *bytes,
                        int rows) {
        map.rank = 2;
        map.elementBytes = 2;
        map.swizzle = 3;
        map.address = reinterpret_cast<uintptr_t>(bytes);
        map.dims[0] = k;
        map.dims[1] = rows;
        map.strides[0] = 2;
        map.strides[1] = uint64_t(k) * 2;
        map.box[0] = 64;
        map.box[1] = 64;
        const std::string error = emu::encodeTensorMap(encoded, map);
        EXPECT_EQ(error, "");
      };
      encode(aMap, aEncoded, aBytes, 64);
      encode(bMap, bEncoded, bBytes, rowsB);
    }
  }
  const unsigned char *aPointer = aBytes, *bPointer = bBytes;
  int tiles = kTiles;
  if (name == "ring_tensor") {
    params.push_back(aEncoded);
    params.push_back(bEncoded);
  } else {
    params.push_back(&aPointer);
    params.push_back(&bPointer);
  }
  params.push_back(&tiles);
  params.push_back(&bug);
  GemmRun run;
  // 168 registers a thread at launch (what ptxas gives a kernel of this
  // size under -maxrregcount 168): the producer's .dec to 40 and the
  // consumer's .inc to 232 fit the pool.
  run.result = launch(kernel, params, 256, 2 * 16384 + 64 + 1024, 168);
  const std::vector<double> expected = reference(aPadded, bPadded, 64, padded);
  if (run.result.ok || bug == 4)
    run.error = maxError(data, expected);
  for (double value : expected)
    run.scale = std::max(run.scale, std::fabs(value));
  emu::release(data);
  emu::release(aBytes);
  emu::release(bBytes);
  return run;
}

TEST(Hopper, RingsFeedWgmma) {
  for (const char *kernel : {"ring_bulk", "ring_tensor", "ring_gather"}) {
    GemmRun run = runRing(kernel, 0, 21);
    ASSERT_TRUE(run.result.ok) << kernel << describe(run.result);
    EXPECT_LT(run.error, 2e-5 * run.scale) << kernel;
    EXPECT_EQ(run.result.counters.wgmma, 16u) << kernel;
    if (std::string(kernel) != "ring_gather") {
      EXPECT_EQ(run.result.counters.bulkCopies, 8u) << kernel;
      EXPECT_EQ(run.result.counters.bulkCopyBytes, 8u * 8192) << kernel;
    } else {
      EXPECT_EQ(run.result.counters.cpAsync, 4u * 1024);
    }
  }
  // Tensor maps: K 248 (the last box reaches past dimension 0) and 60 rows
  // of B (past dimension 1): zeros there, and the full box still counts.
  GemmRun edges = runRing("ring_tensor", 0, 31, 248, 60);
  ASSERT_TRUE(edges.result.ok) << describe(edges.result);
  EXPECT_LT(edges.error, 2e-5 * edges.scale);
  EXPECT_EQ(edges.result.counters.bulkCopyBytes, 8u * 8192);
}

TEST(Hopper, RingBugsAreReported) {
  for (const char *kernel : {"ring_bulk", "ring_tensor", "ring_gather"}) {
    const std::string name = kernel;
    GemmRun noWait = runRing(kernel, 1, 22);
    EXPECT_TRUE(name == "ring_gather"
                    ? hasReport(noWait.result, "racecheck", "read-after-write hazard")
                    : hasReport(noWait.result, "racecheck", "which this thread has not waited for"))
        << kernel << describe(noWait.result);
    if (name != "ring_gather") {
      GemmRun shortTx = runRing(kernel, 2, 23);
      EXPECT_TRUE(hasReport(shortTx.result, "synccheck", "tx-count of -16 bytes"))
          << kernel << describe(shortTx.result);
    }
    // The producer overwrites a stage it never saw released: a hazard with
    // the bulk copy of the earlier tile; the gather's lanes (writers of both
    // tiles) run two phases ahead, and the consumer's wait never passes.
    GemmRun reused = runRing(kernel, 3, 24);
    EXPECT_TRUE(name == "ring_gather" ? hasReport(reused.result, "synccheck", "never completes")
                                      : hasReport(reused.result, "racecheck", "hazard"))
        << kernel << describe(reused.result);
    // Accumulators stored before the wait are stale, and the empty-barrier
    // arrival before it releases nothing of the wgmma's reads.
    GemmRun early = runRing(kernel, 4, 25);
    EXPECT_GT(early.error, 0.1 * early.scale)
        << kernel << ": accumulators read before the wait held results";
    EXPECT_TRUE(hasReport(early.result, "racecheck", "write-after-read hazard"))
        << kernel << describe(early.result);
    if (name == "ring_gather") {
      GemmRun unfenced = runRing(kernel, 5, 26);
      EXPECT_TRUE(hasReport(unfenced.result, "racecheck", "with no proxy fence"))
          << describe(unfenced.result);
    }
  }
}

TEST(Hopper, TensorMapEncodingChecksItsArguments) {
  alignas(64) unsigned char encoded[128];
  auto *bytes = static_cast<unsigned char *>(emu::allocate(4096));
  emu::TensorMap map;
  map.rank = 2;
  map.elementBytes = 2;
  map.swizzle = 3;
  map.address = reinterpret_cast<uintptr_t>(bytes);
  map.dims[0] = 64;
  map.dims[1] = 32;
  map.strides[1] = 128;
  map.box[0] = 64;
  map.box[1] = 8;
  EXPECT_EQ(emu::encodeTensorMap(encoded, map), "");
  emu::TensorMap decoded;
  ASSERT_TRUE(emu::decodeTensorMap(encoded, &decoded));
  EXPECT_EQ(decoded.box[1], 8u);
  EXPECT_EQ(decoded.strides[1], 128u);
  emu::TensorMap bad = map;
  bad.box[0] = 128; // 256 bytes: past the 128-byte swizzle span
  EXPECT_NE(emu::encodeTensorMap(encoded, bad).find("swizzle span"), std::string::npos);
  bad = map;
  bad.strides[1] = 120;
  EXPECT_NE(emu::encodeTensorMap(encoded, bad).find("multiple of 16"), std::string::npos);
  bad = map;
  bad.address += 8;
  EXPECT_NE(emu::encodeTensorMap(encoded, bad).find("16-byte aligned"), std::string::npos);
  emu::release(bytes);
}

/// Device floats first, first + 1, ... (`count` of them), marked written;
/// with `data`, refills that allocation instead.
float *rampFloats(int count, float first, float *data = nullptr) {
  if (!data)
    data = static_cast<float *>(emu::allocate(count * sizeof(float)));
  for (int i = 0; i < count; ++i)
    data[i] = first + i;
  emu::markWritten(data, count * sizeof(float));
  return data;
}

TEST(Hopper, NamedBarrierOrdersWarpgroups) {
  float *data = rampFloats(256, 0.5f);
  float *pointer = data;
  int bug = 0;
  emu::LaunchResult ok = launch("named_handoff", {&pointer, &bug}, 256, 1024);
  ASSERT_TRUE(ok.ok) << describe(ok);
  for (int i = 128; i < 256; ++i)
    EXPECT_EQ(data[i], 2.0f * (0.5f + (i - 128)));
  bug = 1;
  emu::LaunchResult racy = launch("named_handoff", {&pointer, &bug}, 256, 1024);
  EXPECT_TRUE(hasReport(racy, "racecheck", "read-after-write")) << describe(racy);
  emu::release(data);
}

// A word read by more than two threads keeps every reader's clock once the
// block orders by named barriers or mbarriers: the write after a barrier
// that follows all the reads is not a hazard; without it, it is.
TEST(Hopper, NamedBarrierOrdersManyReadersBeforeAWrite) {
  float *data = rampFloats(128, 0.25f);
  float *pointer = data;
  int bug = 0;
  emu::LaunchResult ok = launch("many_readers", {&pointer, &bug}, 128, 1024);
  ASSERT_TRUE(ok.ok) << describe(ok);
  for (int i = 0; i < 128; ++i)
    EXPECT_EQ(data[i], 2.0f * 0.25f + 1.0f) << i;
  rampFloats(128, 0.25f, data);
  bug = 1;
  emu::LaunchResult racy = launch("many_readers", {&pointer, &bug}, 128, 1024);
  EXPECT_TRUE(hasReport(racy, "racecheck", "write-after-read")) << describe(racy);
  emu::release(data);
}

// setmaxnreg keeps each warp's count and the CTA's pool: .dec never
// raises a count, .inc never lowers one, and an .inc waits until other
// warps' .dec leave room in the pool (a deadlock if none ever does).
TEST(Hopper, SetmaxnregAccountsForRegisters) {
  float *data = rampFloats(256, 0.0f);
  float *pointer = data;
  for (int mode : {0, 3}) {
    emu::LaunchResult ok = launch("register_handoff", {&pointer, &mode}, 256, 0, 128);
    ASSERT_TRUE(ok.ok) << "mode " << mode << describe(ok);
    EXPECT_TRUE(ok.reports.empty()) << "mode " << mode << describe(ok);
    EXPECT_EQ(data[255], 255.0f);
  }
  int mode = 1;
  emu::LaunchResult swapped = launch("register_handoff", {&pointer, &mode}, 256, 0, 128);
  EXPECT_TRUE(hasReport(swapped, "synccheck", "so .dec would raise its count") ||
              hasReport(swapped, "synccheck", "so .inc would lower its count"))
      << describe(swapped);
  mode = 2;
  emu::LaunchResult greedy = launch("register_handoff", {&pointer, &mode}, 256, 0, 128);
  EXPECT_TRUE(hasReport(greedy, "synccheck", "deadlock: setmaxnreg.inc 232 of warpgroup 1"))
      << describe(greedy);
  // An exited warp's registers do not return to the pool (only .dec
  // returns them): the .inc that fits only with them never completes, and
  // the report names them; with the .dec before the exit it completes.
  mode = 4;
  emu::LaunchResult exited = launch("register_handoff", {&pointer, &mode}, 256, 0, 128);
  EXPECT_TRUE(hasReport(exited, "synccheck",
                        "deadlock: setmaxnreg.inc 216 of warpgroup 1 waits for registers no "
                        "other warp frees"))
      << describe(exited);
  EXPECT_TRUE(
      hasReport(exited, "synccheck", "16384 of those in use are held by warps that have exited"))
      << describe(exited);
  mode = 5;
  emu::LaunchResult released = launch("register_handoff", {&pointer, &mode}, 256, 0, 128);
  ASSERT_TRUE(released.ok) << describe(released);
  EXPECT_TRUE(released.reports.empty()) << describe(released);
  EXPECT_EQ(data[255], 255.0f);
  // Unset, the launch count is one CTA per SM's: 65536 / 256 threads, at
  // most 255, which the .inc to 216 would lower.
  mode = 0;
  emu::LaunchResult derived = launch("register_handoff", {&pointer, &mode}, 256, 0);
  EXPECT_TRUE(hasReport(derived, "synccheck", "warp 4 holds 255 registers per thread"))
      << describe(derived);
  emu::release(data);
}

// A bulk copy's writes (the async proxy) over shared bytes that generic
// stores wrote need a fence.proxy.async between: by the writers, by the
// issuing thread after it acquired the stores, or by a thread whose
// release the issuer acquired after that thread's fence. So do bytes that
// generic loads read (docs/emulator.md states the rule and its source).
TEST(Hopper, BulkCopyOverGenericStoresNeedsAProxyFence) {
  float *source = rampFloats(128, 3.0f);
  float *data = rampFloats(128, 0.0f);
  float *pointer = data;
  const float *from = source;
  for (int mode : {0, 1, 3}) {
    emu::LaunchResult ok = launch("bulk_over_generic", {&pointer, &from, &mode}, 128, 4096);
    ASSERT_TRUE(ok.ok) << "mode " << mode << describe(ok);
    EXPECT_TRUE(ok.reports.empty()) << "mode " << mode << describe(ok);
    for (int i = 0; i < 128; ++i)
      EXPECT_EQ(data[i], 3.0f + i) << "mode " << mode;
  }
  int mode = 2;
  emu::LaunchResult unfenced = launch("bulk_over_generic", {&pointer, &from, &mode}, 128, 4096);
  EXPECT_TRUE(hasReport(unfenced, "racecheck",
                        "async-proxy write over a generic store with no proxy fence"))
      << describe(unfenced);
  // Generic reads before the copy's writes, ordered by a __syncthreads: the
  // proxies still need a fence after the reads (by the readers, or by the
  // issuer once it acquired them).
  for (int fenced : {5, 6}) {
    emu::LaunchResult ok = launch("bulk_over_generic", {&pointer, &from, &fenced}, 128, 4096);
    ASSERT_TRUE(ok.ok) << "mode " << fenced << describe(ok);
    EXPECT_TRUE(ok.reports.empty()) << "mode " << fenced << describe(ok);
    for (int i = 0; i < 128; ++i)
      EXPECT_EQ(data[i], 3.0f + i) << "mode " << fenced;
  }
  mode = 4;
  emu::LaunchResult readUnfenced = launch("bulk_over_generic", {&pointer, &from, &mode}, 128, 4096);
  EXPECT_TRUE(hasReport(readUnfenced, "racecheck",
                        "async-proxy write over a generic read with no proxy fence"))
      << describe(readUnfenced);
  emu::release(data);
  emu::release(source);
}

TEST(Hopper, WrappersAssembleForSm90a) {
  std::string reason;
  if (!Nvrtc::available(&reason))
    GTEST_SKIP() << "NVRTC is not available: " << reason;
  CompileOptions options;
  options.arch = "sm_90a";
  options.ptxasVerbose = true;
  CompileResult result = Nvrtc::get().compile(unitText(), "hopper-test.cu", options);
  EXPECT_FALSE(result.image.empty());
  // Every kernel assembled, none spilled.
  auto reports = parsePtxasReport(result.log);
  EXPECT_GE(reports.size(), std::size(kNames)) << result.log;
  for (const PtxasKernelReport &report : reports)
    EXPECT_EQ(report.spillStoreBytes, 0) << report.kernel;
}

} // namespace
