//===- EmulatorTest.cpp - The SIMT emulator on hand-made kernels ----------===//
//
// Kernels written for this test, with known counts and known bugs, built by
// the runtime's emulator build (compileEmulatorUnit) and run through the
// emulator's own interface: the counters (ldmatrix and shared-store bank
// conflicts, coalesced and strided global loads, mma, shuffles, barriers),
// the fragment mappings of ldmatrix / ldmatrix.trans / mma.sync against a
// plain matrix product, and one finding per checker.
//
//===----------------------------------------------------------------------===//

#include "pagedc-emu/Emulator.h"
#include "pagedc/EmulatorBuild.h"
#include "pagedc/KernelCache.h"
#include "pagedc/KernelSource.h"
#include "pagedc/Tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <vector>

#include <unistd.h>

namespace {

using namespace pagedc;

/// The hand-made kernels. Each takes (float *data, int n).
constexpr const char *kKernels = R"(
#define DEVICE __device__ __forceinline__
typedef unsigned int u32;

// 512 bytes of shared memory written, then one ldmatrix.x4 per warp with row
// `r` of matrix `m` (lane m * 8 + r) at (m * 8 + r) * stride bytes.
template <int kStride> DEVICE void ldmatrix_rows(float *data) {
  PAGEDC_EXTERN_SHARED(unsigned char, shared);
  const int lane = threadIdx.x;
  for (int i = lane; i < 32 * kStride / 4; i += 32)
    reinterpret_cast<u32 *>(shared)[i] = i;
  __syncthreads();
  u32 fragment[4];
  pagedc_emu::ldmatrix_x4(fragment, pagedc_emu::shared_address(shared) + lane * kStride, false);
  data[lane] = static_cast<float>(fragment[0] & 0xffff);
}
extern "C" __global__ void ldmatrix_conflict_free(float *data, int) { ldmatrix_rows<16>(data); }
extern "C" __global__ void ldmatrix_four_way(float *data, int) { ldmatrix_rows<64>(data); }

// One warp-wide 4-byte load: consecutive lanes at consecutive words (4
// sectors), or 128 bytes apart (32 sectors).
extern "C" __global__ void load_coalesced(float *data, int n) {
  data[n + threadIdx.x] = data[threadIdx.x];
}
extern "C" __global__ void load_strided(float *data, int n) {
  data[n + threadIdx.x] = data[threadIdx.x * 32];
}

// One lane in four stores first, then every lane copies as load_coalesced:
// the copy is still one load and one store request of the whole warp.
extern "C" __global__ void some_lanes_first(float *data, int n) {
  if ((threadIdx.x & 3) == 0)
    data[2 * n + threadIdx.x / 4] = 0.0f;
  data[n + threadIdx.x] = data[threadIdx.x];
}

// Shared stores: each lane its own bank, or all lanes one bank.
extern "C" __global__ void store_banks(float *data, int stride) {
  PAGEDC_EXTERN_SHARED(float, shared);
  shared[threadIdx.x * stride] = 1.0f;
  __syncthreads();
  data[threadIdx.x] = shared[threadIdx.x * stride];
}

// D = A B + C for one m16n8k16 tile through ldmatrix (A), ldmatrix.trans
// (B, stored k-major) and mma.sync: data holds A [16x16] then B [16x8] as
// bf16 bit patterns in floats' low halves, C [16x8], and receives D.
extern "C" __global__ void mma_tile(float *data, int) {
  PAGEDC_EXTERN_SHARED(unsigned char, shared);
  uint16_t *a = reinterpret_cast<uint16_t *>(shared);        // [16][16]
  uint16_t *b = reinterpret_cast<uint16_t *>(shared + 512);  // [16][8] k-major
  const int lane = threadIdx.x;
  for (int i = lane; i < 256; i += 32)
    a[i] = static_cast<uint16_t>(__float_as_uint(data[i]) & 0xffff);
  for (int i = lane; i < 128; i += 32)
    b[i] = static_cast<uint16_t>(__float_as_uint(data[256 + i]) & 0xffff);
  __syncthreads();
  const u32 base = pagedc_emu::shared_address(shared);
  u32 fa[4], fb[4];
  // A: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15).
  pagedc_emu::ldmatrix_x4(fa, base + (lane & 15) * 32 + (lane >> 4) * 16, false);
  // B^T via .trans: rows k of the k-major tile, matrices k 0-7 and k 8-15.
  pagedc_emu::ldmatrix_x4(fb, base + 512 + (lane & 15) * 16, true);
  float acc[4];
  const int g = lane / 4, c = (lane % 4) * 2;
  acc[0] = data[384 + g * 8 + c];
  acc[1] = data[384 + g * 8 + c + 1];
  acc[2] = data[384 + (g + 8) * 8 + c];
  acc[3] = data[384 + (g + 8) * 8 + c + 1];
  pagedc_emu::mma_16816(acc, fa, fb[0], fb[1], true);
  data[512 + g * 8 + c] = acc[0];
  data[512 + g * 8 + c + 1] = acc[1];
  data[512 + (g + 8) * 8 + c] = acc[2];
  data[512 + (g + 8) * 8 + c + 1] = acc[3];
}

// cvt.rn.bf16x2.f32 / cvt.rn.f16x2.f32 of data[i] (as bits) into data[n + i],
// and cvt.f32.f16 of every 16-bit pattern i into data[2n + i].
extern "C" __global__ void convert(float *data, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const u32 packed = pagedc_emu::pack_pair(data[i], data[i], true);
    const u32 half = pagedc_emu::pack_pair(data[i], data[i], false);
    data[n + i] = __uint_as_float((packed & 0xffffu) | (half << 16));
  }
  for (int i = threadIdx.x; i < 65536; i += blockDim.x)
    data[2 * n + i] = pagedc_emu::half_to_float(static_cast<uint16_t>(i));
}

// Every 8-bit float code of both formats through templates/Float8.cuh (held
// in the unit before these kernels): code c (low half) and c ^ 0x80 (high
// half) as f16 and bf16 pairs, into data[4 c .. 4 c + 3] as bits: e4m3 f16,
// e4m3 bf16, e5m2 f16, e5m2 bf16.
extern "C" __global__ void float8_convert(float *data, int) {
  for (int code = threadIdx.x; code < 256; code += blockDim.x) {
    const u32 pair = static_cast<u32>(code) | (static_cast<u32>(code ^ 0x80) << 8);
    data[4 * code] = __uint_as_float(
        pagedc::float8x2_to_elements<pagedc::kFloat8E4M3, false>(pair));
    data[4 * code + 1] = __uint_as_float(
        pagedc::float8x2_to_elements<pagedc::kFloat8E4M3, true>(pair));
    data[4 * code + 2] = __uint_as_float(
        pagedc::float8x2_to_elements<pagedc::kFloat8E5M2, false>(pair));
    data[4 * code + 3] = __uint_as_float(
        pagedc::float8x2_to_elements<pagedc::kFloat8E5M2, true>(pair));
  }
}

// __shfl_sync: data[i] = lane 0's value of i's warp, data[64 + i] = the
// value of lane (lane * 7 + 3) % 32 of the same warp.
extern "C" __global__ void shuffle_index(float *data, int) {
  const float value = data[threadIdx.x] * 2.0f + static_cast<float>(threadIdx.x);
  const int lane = threadIdx.x & 31;
  const float first = __uint_as_float(__shfl_sync(0xffffffffu, __float_as_uint(value), 0));
  const float other = __uint_as_float(
      __shfl_sync(0xffffffffu, __float_as_uint(value), (lane * 7 + 3) % 32));
  data[threadIdx.x] = first;
  data[64 + threadIdx.x] = other;
}

// Bugs, one per checker.
extern "C" __global__ void write_past_end(float *data, int n) {
  data[n + threadIdx.x] = 1.0f;
}
extern "C" __global__ void shared_race(float *data, int) {
  PAGEDC_EXTERN_SHARED(float, shared);
  shared[threadIdx.x] = 1.0f;
  data[threadIdx.x] = shared[(threadIdx.x + 1) % blockDim.x]; // no barrier
}
// Every block writes the same words: a hazard between blocks.
extern "C" __global__ void blocks_collide(float *data, int) {
  data[threadIdx.x] = static_cast<float>(blockIdx.x);
}
// Each block its own words: no hazard.
extern "C" __global__ void blocks_apart(float *data, int) {
  data[blockIdx.x * blockDim.x + threadIdx.x] = static_cast<float>(blockIdx.x);
}
// Every block takes from one atomic counter: no hazard between atomics.
extern "C" __global__ void blocks_count(float *data, int) {
  if (threadIdx.x == 0)
    atomicAdd(reinterpret_cast<int *>(data), 1);
}
// One block's atomic and another's plain store on the same word: a hazard.
extern "C" __global__ void blocks_count_and_store(float *data, int) {
  if (threadIdx.x != 0)
    return;
  if (blockIdx.x == 0)
    atomicAdd(reinterpret_cast<int *>(data), 1);
  else
    reinterpret_cast<int *>(data)[0] = 7;
}
extern "C" __global__ void read_unwritten(float *data, int) {
  data[threadIdx.x] = data[64 + threadIdx.x];
}
extern "C" __global__ void partial_shuffle(float *data, int) {
  float value = data[threadIdx.x];
  if (threadIdx.x < 16)
    value = __shfl_xor_sync(0xffffffffu, value, 1);
  data[threadIdx.x] = value;
}
extern "C" __global__ void half_barrier(float *data, int) {
  if (threadIdx.x < 32)
    __syncthreads();
  data[threadIdx.x] = 0.0f;
}
)";

const char *const kNames[] = {"ldmatrix_conflict_free", "ldmatrix_four_way", "load_coalesced",
                              "load_strided",           "some_lanes_first",
                              "store_banks",            "mma_tile",
                              "convert",                "shuffle_index",
                              "blocks_collide",         "blocks_apart",
                              "blocks_count",           "blocks_count_and_store",
                              "write_past_end",         "shared_race",       "read_unwritten",
                              "partial_shuffle",        "half_barrier",      "float8_convert"};

class Emulator : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    std::string code = emulatorPrologue() + std::string(embeddedTemplate("Float8.cuh")) + kKernels;
    for (const char *name : kNames)
      code += std::string("PAGEDC_EMU_ENTRY(") + name + ")\n";
    CompileResult compiled = compileEmulatorUnit(code, "the emulator test kernels");
    std::string error;
    auto loaded = emu::loadModule(compiled.image.data(), &error);
    ASSERT_TRUE(loaded) << error;
    module_ = new std::shared_ptr<emu::Module>(std::move(loaded));
  }

  /// Runs `name` on one block of `threads` over device memory `data`
  /// (`floats` floats, the first `written` of them uploaded).
  emu::LaunchResult run(const char *name, float *data, int n, unsigned threads = 32,
                        unsigned shared = 4096) {
    const emu::Kernel *kernel = emu::findKernel(**module_, name);
    EXPECT_NE(kernel, nullptr) << name;
    emu::LaunchConfig config;
    config.block[0] = threads;
    config.dynamicSharedBytes = shared;
    void *params[] = {&data, &n};
    return emu::launch(*kernel, config, params, emu::Checks{});
  }

  static std::shared_ptr<emu::Module> *module_;
};
std::shared_ptr<emu::Module> *Emulator::module_ = nullptr;

/// Device memory of `floats` floats, all written.
float *deviceFloats(size_t floats) {
  auto *data = static_cast<float *>(emu::allocate(floats * sizeof(float)));
  for (size_t i = 0; i < floats; ++i)
    data[i] = static_cast<float>(i % 97) * 0.25f + 1.0f;
  emu::markWritten(data, floats * sizeof(float));
  return data;
}

TEST_F(Emulator, LdmatrixWavefronts) {
  float *data = deviceFloats(64);
  emu::LaunchResult free = run("ldmatrix_conflict_free", data, 32);
  ASSERT_TRUE(free.ok) << (free.reports.empty() ? free.error : free.reports[0].format());
  EXPECT_EQ(free.counters.ldmatrix, 1u);
  EXPECT_EQ(free.counters.ldmatrixWavefronts, 4u);
  EXPECT_EQ(free.counters.ldmatrixIdealWavefronts, 4u);
  emu::LaunchResult conflicted = run("ldmatrix_four_way", data, 32);
  ASSERT_TRUE(conflicted.ok);
  EXPECT_EQ(conflicted.counters.ldmatrixWavefronts, 16u); // 4-way: 4 per matrix
  EXPECT_EQ(conflicted.counters.ldmatrixIdealWavefronts, 4u);
  emu::release(data);
}

TEST_F(Emulator, GlobalSectorsOfCoalescedAndStridedLoads) {
  float *data = deviceFloats(32 * 32 + 64);
  emu::LaunchResult coalesced = run("load_coalesced", data, 32 * 32);
  ASSERT_TRUE(coalesced.ok);
  // One load request (4 sectors) and one store request (4 sectors).
  EXPECT_EQ(coalesced.counters.globalRequests, 2u);
  EXPECT_EQ(coalesced.counters.globalSectorsRequested, 8u);
  EXPECT_EQ(coalesced.counters.globalSectorsUnique, 8u);
  EXPECT_EQ(coalesced.counters.globalLoadBytes, 128u);
  emu::LaunchResult strided = run("load_strided", data, 32 * 32);
  ASSERT_TRUE(strided.ok);
  EXPECT_EQ(strided.counters.globalRequests, 2u);
  EXPECT_EQ(strided.counters.globalSectorsRequested, 32u + 4u);
  EXPECT_EQ(strided.counters.globalLoadBytes, 128u);
  emu::release(data);
}

// A request is one instruction's n-th execution across the lanes: lanes
// that skipped an access under a branch still join the others' next ones
// (grouped by the lanes' k-th access, the copy split into four requests).
TEST_F(Emulator, RequestsOfLanesThatSkippedAnAccess) {
  float *data = deviceFloats(3 * 32);
  emu::LaunchResult result = run("some_lanes_first", data, 32);
  ASSERT_TRUE(result.ok);
  EXPECT_EQ(result.counters.globalRequests, 3u);
  EXPECT_EQ(result.counters.globalSectorsRequested, 1u + 4u + 4u);
  emu::release(data);
}

TEST_F(Emulator, SharedStoreBankConflicts) {
  float *data = deviceFloats(64);
  emu::LaunchResult spread = run("store_banks", data, 1);
  ASSERT_TRUE(spread.ok);
  // A store and a load request, one wavefront each.
  EXPECT_EQ(spread.counters.sharedRequests, 2u);
  EXPECT_EQ(spread.counters.sharedWavefronts, 2u);
  emu::LaunchResult same = run("store_banks", data, 32);
  ASSERT_TRUE(same.ok);
  EXPECT_EQ(same.counters.sharedWavefronts, 64u); // 32-way, twice
  EXPECT_EQ(same.counters.sharedIdealWavefronts, 2u);
  EXPECT_EQ(same.counters.barriers, 1u);
  emu::release(data);
}

uint16_t toBF16(float value) { return floatToBF16(value); }

TEST_F(Emulator, MmaFragmentsMatchMatrixProduct) {
  float *data = deviceFloats(512 + 128);
  std::mt19937 random(7);
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  float a[16][16], b[16][8], c[16][8];
  for (int i = 0; i < 16; ++i)
    for (int k = 0; k < 16; ++k) {
      a[i][k] = bf16ToFloat(toBF16(uniform(random)));
      uint32_t bits = toBF16(a[i][k]);
      std::memcpy(&data[i * 16 + k], &bits, 4);
    }
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 8; ++n) {
      b[k][n] = bf16ToFloat(toBF16(uniform(random)));
      uint32_t bits = toBF16(b[k][n]);
      std::memcpy(&data[256 + k * 8 + n], &bits, 4);
    }
  for (int i = 0; i < 16; ++i)
    for (int n = 0; n < 8; ++n)
      data[384 + i * 8 + n] = c[i][n] = uniform(random);
  emu::LaunchResult result = run("mma_tile", data, 0);
  ASSERT_TRUE(result.ok) << (result.reports.empty() ? result.error : result.reports[0].format());
  EXPECT_EQ(result.counters.mma, 1u);
  EXPECT_EQ(result.counters.ldmatrix, 2u);
  for (int i = 0; i < 16; ++i)
    for (int n = 0; n < 8; ++n) {
      double expected = c[i][n];
      for (int k = 0; k < 16; ++k)
        expected += double(a[i][k]) * b[k][n];
      EXPECT_NEAR(data[512 + i * 8 + n], expected, 1e-5) << "row " << i << " col " << n;
    }
  emu::release(data);
}

TEST_F(Emulator, ConversionsAreBitExact) {
  // Edge cases (ties, subnormals, overflow, infinities, NaN) and random bits.
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x3f800000u, 0x3f808000u, 0x3f818000u,
                                0x3f80c000u, 0x477fe000u, 0x477ff000u, 0x477fefffu, 0x47800000u,
                                0x33000000u, 0x33000001u, 0x387fc000u, 0x38800000u, 0x00000001u,
                                0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f7fffffu, 0x3ffff000u,
                                0x7f7f8000u, 0x7f7f7fffu};
  std::mt19937 random(11);
  while (bits.size() < 20000)
    bits.push_back(static_cast<uint32_t>(random()));
  const int n = static_cast<int>(bits.size());
  float *data = deviceFloats(2 * n + 65536);
  std::memcpy(data, bits.data(), bits.size() * 4);
  emu::LaunchResult result = run("convert", data, n, 128);
  ASSERT_TRUE(result.ok) << (result.reports.empty() ? result.error : result.reports[0].format());
  int mismatches = 0;
  for (int i = 0; i < n; ++i) {
    float value;
    std::memcpy(&value, &bits[i], 4);
    uint32_t out;
    std::memcpy(&out, &data[n + i], 4);
    const uint16_t bf16 = out & 0xffff, half = out >> 16;
    if (std::isnan(value)) {
      mismatches += !std::isnan(bf16ToFloat(bf16)) || !std::isnan(halfToFloat(half));
      continue;
    }
    if (bf16 != floatToBF16(value) || half != floatToHalf(value)) {
      if (++mismatches < 5)
        ADD_FAILURE() << std::hex << "bits 0x" << bits[i] << ": bf16 0x" << bf16 << " expected 0x"
                      << floatToBF16(value) << ", f16 0x" << half << " expected 0x"
                      << floatToHalf(value);
    }
  }
  EXPECT_EQ(mismatches, 0);
  for (int i = 0; i < 65536; ++i) {
    const float expected = halfToFloat(static_cast<uint16_t>(i)), actual = data[2 * n + i];
    if (std::isnan(expected))
      EXPECT_TRUE(std::isnan(actual)) << i;
    else
      EXPECT_EQ(std::memcmp(&expected, &actual, 4), 0) << "f16 pattern " << i;
  }
  emu::release(data);
}

// The 8-bit float conversions of the decode kernel (templates/Float8.cuh:
// the form of cvt.rn.f16x2.e4m3x2 / .e5m2x2 that the emulator and targets
// before sm_89 run) against the runtime's table of code values
// (float8ToFloat, the CPU backend's and the float64 reference's): all 256
// codes of both formats, in both halves of the pair, to f16 and bf16. A
// finite code gives the f16 / bf16 of its value exactly (signed zeros
// included), e5m2's infinities stay infinite, and every NaN code gives the
// canonical NaN 0x7fff of both types, as the PTX instruction does.
TEST_F(Emulator, Float8ConversionsMatchTheRuntimeTable) {
  float *data = deviceFloats(4 * 256);
  emu::LaunchResult result = run("float8_convert", data, 0, 64);
  ASSERT_TRUE(result.ok) << (result.reports.empty() ? result.error : result.reports[0].format());
  int checked = 0;
  for (int code = 0; code < 256; ++code)
    for (int format = 0; format < 2; ++format) {
      const DType type = format == 0 ? DType::F8E4M3 : DType::F8E5M2;
      uint32_t halves, bf16s;
      std::memcpy(&halves, &data[4 * code + 2 * format], 4);
      std::memcpy(&bf16s, &data[4 * code + 2 * format + 1], 4);
      for (int high = 0; high < 2; ++high) {
        const int which = high ? code ^ 0x80 : code;
        const uint16_t half = static_cast<uint16_t>(high ? halves >> 16 : halves & 0xffff);
        const uint16_t bf16 = static_cast<uint16_t>(high ? bf16s >> 16 : bf16s & 0xffff);
        const float value = float8ToFloat(static_cast<uint8_t>(which), type);
        SCOPED_TRACE(std::string(dtypeName(type)) + " code " + std::to_string(which));
        if (std::isnan(value)) {
          EXPECT_EQ(half, 0x7fff);
          EXPECT_EQ(bf16, 0x7fff);
        } else {
          EXPECT_EQ(half, floatToHalf(value));
          EXPECT_EQ(bf16, floatToBF16(value));
          const float fromHalf = halfToFloat(half), fromBf16 = bf16ToFloat(bf16);
          EXPECT_EQ(std::memcmp(&fromHalf, &value, 4), 0);
          EXPECT_EQ(std::memcmp(&fromBf16, &value, 4), 0);
        }
        ++checked;
      }
    }
  EXPECT_EQ(checked, 1024);
  emu::release(data);
}

TEST_F(Emulator, ShuffleReadsTheSourceLaneOfItsOwnWarp) {
  float *data = deviceFloats(128);
  std::vector<float> before(data, data + 64);
  emu::LaunchResult result = run("shuffle_index", data, 64, 64);
  ASSERT_TRUE(result.ok) << (result.reports.empty() ? result.error : result.reports[0].format());
  for (int i = 0; i < 64; ++i) {
    const int warp = i / 32, source = ((i % 32) * 7 + 3) % 32;
    auto value = [&](int thread) { return before[thread] * 2.0f + static_cast<float>(thread); };
    EXPECT_EQ(data[i], value(32 * warp)) << i;
    EXPECT_EQ(data[64 + i], value(32 * warp + source)) << i;
  }
  EXPECT_EQ(result.counters.shuffles, 4u);
  emu::release(data);
}

TEST_F(Emulator, EachCheckerReportsItsBug) {
  float *data = deviceFloats(64);
  struct Case {
    const char *kernel, *checker, *message;
  };
  for (const Case &c : {Case{"write_past_end", "memcheck", "outside every device allocation"},
                        Case{"shared_race", "racecheck", "write-after-read"},
                        Case{"partial_shuffle", "synccheck", "reached by lanes 0-15"},
                        Case{"half_barrier", "synccheck", "completed by 32 of 64 threads"}}) {
    emu::LaunchResult result = run(c.kernel, data, 64, c.kernel[0] == 'h' ? 64 : 32);
    EXPECT_FALSE(result.ok) << c.kernel;
    bool found = false;
    for (const emu::Report &report : result.reports) {
      if (report.checker != c.checker || report.message.find(c.message) == std::string::npos)
        continue;
      found = true;
      EXPECT_NE(report.location.find(":"), std::string::npos)
          << "no source line: " << report.format();
    }
    std::string all;
    for (const emu::Report &report : result.reports)
      all += report.format() + "\n";
    EXPECT_TRUE(found) << c.kernel << " has no " << c.checker << " report '" << c.message
                       << "'; reports:\n"
                       << all;
  }
  // Blocks writing the same global words race; blocks with their own don't.
  {
    const emu::Kernel *collide = emu::findKernel(**module_, "blocks_collide");
    const emu::Kernel *apart = emu::findKernel(**module_, "blocks_apart");
    emu::LaunchConfig config;
    config.grid[0] = 2;
    config.block[0] = 32;
    int n = 0;
    void *params[] = {&data, &n};
    emu::LaunchResult result = emu::launch(*collide, config, params, emu::Checks{});
    ASSERT_FALSE(result.reports.empty());
    EXPECT_EQ(result.reports[0].checker, "racecheck");
    EXPECT_NE(result.reports[0].message.find("hazard between blocks"), std::string::npos)
        << result.reports[0].format();
    result = emu::launch(*apart, config, params, emu::Checks{});
    EXPECT_TRUE(result.ok) << (result.reports.empty() ? "" : result.reports[0].format());
    // A later launch may rewrite what an earlier one wrote.
    result = emu::launch(*apart, config, params, emu::Checks{});
    EXPECT_TRUE(result.ok);
    // Atomics of many blocks on one word (a work counter) are ordered; an
    // atomic and another block's plain store are not.
    config.grid[0] = 5;
    int start = 0;
    std::memcpy(&start, data, sizeof start);
    result = emu::launch(*emu::findKernel(**module_, "blocks_count"), config, params,
                         emu::Checks{});
    EXPECT_TRUE(result.ok) << (result.reports.empty() ? "" : result.reports[0].format());
    int counted = 0;
    std::memcpy(&counted, data, sizeof counted);
    EXPECT_EQ(counted, start + 5);
    config.grid[0] = 2;
    result = emu::launch(*emu::findKernel(**module_, "blocks_count_and_store"), config, params,
                         emu::Checks{});
    ASSERT_FALSE(result.reports.empty());
    EXPECT_EQ(result.reports[0].checker, "racecheck");
    EXPECT_NE(result.reports[0].message.find("hazard between blocks"), std::string::npos)
        << result.reports[0].format();
  }
  // initcheck: a fresh allocation read before anything wrote it.
  auto *fresh = static_cast<float *>(emu::allocate(128 * sizeof(float)));
  emu::LaunchResult unwritten = run("read_unwritten", fresh, 0);
  ASSERT_FALSE(unwritten.reports.empty());
  EXPECT_EQ(unwritten.reports[0].checker, "initcheck");
  emu::release(fresh);
  emu::release(data);
}

TEST(EmulatorImages, AreCachedLikeCubins) {
  const std::string directory =
      (std::filesystem::temp_directory_path() / ("pagedc-emu-cache-" + std::to_string(getpid())))
          .string();
  std::filesystem::remove_all(directory);
  KernelConfig config;
  config.kind = KernelKind::Decode;
  config.headDim = 64;
  CompileOptions options;
  options.arch = std::string(kEmulatorArch);
  const std::string modCode(embeddedTemplate("testing/causal.cuh"));
  {
    KernelCache cache(directory);
    auto kernel = cache.getOrCompile(config, modCode, options);
    EXPECT_EQ(kernel->image.compare(0, 16, "PAGEDC-EMU-IMG1\n"), 0);
    EXPECT_EQ(cache.stats().compiles, 1u);
    cache.getOrCompile(config, modCode, options);
    EXPECT_EQ(cache.stats().memoryHits, 1u);
  }
  KernelCache fresh(directory);
  auto again = fresh.getOrCompile(config, modCode, options);
  EXPECT_EQ(fresh.stats().diskHits, 1u);
  EXPECT_EQ(fresh.stats().compiles, 0u);
  // A cubin key and an emulator key never meet.
  CompileOptions gpu;
  gpu.arch = "sm_90";
  KernelSource source = assembleKernel(config, modCode);
  EXPECT_NE(KernelCache::diskKey(source.code, gpu), KernelCache::diskKey(source.code, options));
  std::string error;
  EXPECT_TRUE(emu::loadModule(again->image.data(), &error)) << error;
  std::filesystem::remove_all(directory);
}

} // namespace
