//===- CudaLaunchTest.cpp - Driver loader and launch dry runs -------------===//
//
// Everything up to cuLaunchKernel: compiled cubins that name their kernels,
// launch grids, shared memory, decode split choice and packed arguments.
// The driver test checks the "no driver" path on machines without one.
//
//===----------------------------------------------------------------------===//

#include "pagedc/CudaLaunch.h"
#include "pagedc/Error.h"
#include "pagedc/KernelCache.h"
#include "support/CudaTestSupport.h"

#include <gtest/gtest.h>

#include <cstring>

using namespace pagedc;

namespace {

/// Device-looking addresses: never dereferenced on the host.
template <typename T> T *fakeDevicePointer(uintptr_t address) {
  return reinterpret_cast<T *>(address);
}

/// Memory only: tests never write to the user's cache directory.
KernelCache &testCache() {
  static KernelCache cache("");
  return cache;
}

PagedcAttentionKernelArgs callArgs(int batch, int headsQ, int headsKv, int qLen) {
  PagedcAttentionKernelArgs args{};
  args.q = fakeDevicePointer<void>(0x7f0000100000);
  args.k_cache = fakeDevicePointer<void>(0x7f0000200000);
  args.v_cache = fakeDevicePointer<void>(0x7f0000300000);
  args.out = fakeDevicePointer<void>(0x7f0000400000);
  args.page_table = fakeDevicePointer<int32_t>(0x7f0000500000);
  args.kv_len = fakeDevicePointer<int32_t>(0x7f0000600000);
  args.batch = batch;
  args.heads_q = headsQ;
  args.heads_kv = headsKv;
  args.q_len = qLen;
  args.page_table_stride = 2048;
  args.scale = 0.125f;
  return args;
}

} // namespace

TEST(CudaDriver, ReportsWhyThereIsNoDriver) {
  std::string reason;
  bool present = CudaDriver::available(&reason);
  if (present)
    GTEST_SKIP() << "a CUDA driver is present; the no-driver message is not testable";
  EXPECT_FALSE(reason.empty());
  // Either the library is missing or cuInit refused; both name the cause.
  bool namesLibrary = reason.find("no NVIDIA driver: libcuda.so.1 not found") != std::string::npos;
  bool namesInit = reason.find("cuInit failed with") != std::string::npos;
  EXPECT_TRUE(namesLibrary || namesInit) << reason;
  try {
    CudaDriver::get();
    FAIL() << "CudaDriver::get() succeeded without a driver";
  } catch (const Error &error) {
    EXPECT_EQ(std::string(error.what()), reason);
  }
}

TEST(CudaLaunch, PrefillDryRun) {
  REQUIRE_NVRTC();
  KernelConfig config; // prefill bf16 d128 page 16
  config.returnLse = true;
  std::string mods(embeddedTemplate("testing/alibi.cuh"));
  config.paramsSize = 16; // {const float *slopes; int64_t slopes_stride[1];}
  auto kernel = testCache().getOrCompile(config, mods, CompileOptions{});
  ASSERT_EQ(kernel->image.compare(0, 4, "\x7f" "ELF"), 0);
  EXPECT_NE(kernel->image.find("pagedc_prefill"), std::string::npos);

  PagedcAttentionKernelArgs args = callArgs(4, 32, 8, 1000);
  args.lse = fakeDevicePointer<float>(0x7f0000700000);
  std::vector<unsigned char> params(16, 0xab);
  AttentionLaunchPlan plan = planAttention(config, args, params, 4096, 132);
  ASSERT_EQ(plan.launches.size(), 1u);
  KernelLaunch &launch = plan.launches[0];
  EXPECT_EQ(launch.kernel, kernel->kernelNames[0]);
  EXPECT_EQ(launch.grid[0], 16u * 32 * 4); // ceil(1000 / 64) x heads x batch
  EXPECT_EQ(launch.grid[1], 1u);
  EXPECT_EQ(launch.grid[2], 1u);
  EXPECT_EQ(launch.block[0], 128u);
  EXPECT_EQ(launch.sharedMemoryBytes, (64u + 4 * 64) * 256);
  EXPECT_EQ(plan.workspaceBytes, 0u);
  std::vector<void *> pointers = launch.parameterPointers();
  ASSERT_EQ(pointers.size(), 2u);
  PagedcAttentionKernelArgs packed;
  std::memcpy(&packed, pointers[0], sizeof(packed));
  EXPECT_EQ(packed.q, args.q);
  EXPECT_EQ(packed.lse, args.lse);
  EXPECT_EQ(packed.heads_q, 32);
  EXPECT_EQ(packed.scale, 0.125f);
  EXPECT_EQ(std::memcmp(pointers[1], params.data(), 16), 0);
}

TEST(CudaLaunch, DecodeDryRunSplitsAndMerges) {
  REQUIRE_NVRTC();
  KernelConfig config;
  config.kind = KernelKind::Decode;
  config.groupSize = 4;
  std::string mods(embeddedTemplate("testing/causal.cuh"));
  auto kernel = testCache().getOrCompile(config, mods, CompileOptions{});
  EXPECT_NE(kernel->image.find("pagedc_decode_merge"), std::string::npos);

  // B = 1, 32/8 heads, 32k context: 8 CTAs per split, so many splits.
  PagedcAttentionKernelArgs args = callArgs(1, 32, 8, 1);
  AttentionLaunchPlan plan = planAttention(config, args, std::vector<unsigned char>(1), 32768, 132);
  ASSERT_EQ(plan.launches.size(), 2u);
  const KernelLaunch &main = plan.launches[0], &merge = plan.launches[1];
  EXPECT_EQ(main.kernel, "pagedc_decode");
  EXPECT_EQ(merge.kernel, "pagedc_decode_merge");
  int splits = plan.args.num_splits;
  EXPECT_GE(splits * 8, 132); // at least one CTA per SM
  EXPECT_EQ(plan.args.split_size % 64, 0);
  EXPECT_GE(int64_t(splits) * plan.args.split_size, 32768);
  EXPECT_LT(int64_t(splits - 1) * plan.args.split_size, 32768);
  EXPECT_EQ(main.grid[0], unsigned(splits));
  EXPECT_EQ(main.grid[1], 8u);
  EXPECT_EQ(merge.grid[1], 32u);
  EXPECT_EQ(merge.arguments.size(), 1u);
  EXPECT_EQ(plan.workspaceBytes, size_t(32) * splits * (128 + 1) * 4);
  plan.setWorkspace(0x7f0010000000ull);
  PagedcAttentionKernelArgs packed;
  std::memcpy(&packed, plan.launches[1].arguments[0].data(), sizeof(packed));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(packed.partial_out), 0x7f0010000000ull);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(packed.partial_lse),
            0x7f0010000000ull + size_t(32) * splits * 128 * 4);

  // B = 64 fills the GPU without splitting.
  AttentionLaunchPlan wide = planAttention(config, callArgs(64, 32, 8, 1),
                                           std::vector<unsigned char>(1), 8192, 132);
  EXPECT_EQ(wide.args.num_splits, 1);
  EXPECT_EQ(wide.launches.size(), 1u);
  EXPECT_EQ(wide.workspaceBytes, 0u);
}

TEST(CudaLaunch, MismatchesAreNamed) {
  KernelConfig decode;
  decode.kind = KernelKind::Decode;
  decode.groupSize = 4;
  auto expectError = [](const KernelConfig &config, const PagedcAttentionKernelArgs &args,
                        const std::string &needle) {
    try {
      planAttention(config, args, {0}, 1024, 132);
      ADD_FAILURE() << "accepted; wanted " << needle;
    } catch (const Error &error) {
      EXPECT_NE(std::string(error.what()).find(needle), std::string::npos) << error.what();
    }
  };
  expectError(decode, callArgs(1, 32, 4, 1), "built for 4 query heads per KV head, the call has 8");
  expectError(decode, callArgs(1, 32, 8, 3), "at most 1 query tokens, the call has 3");
  expectError(decode, callArgs(1, 30, 8, 1), "heads_q 30 is not a multiple of heads_kv 8");
  PagedcAttentionKernelArgs withLse = callArgs(1, 32, 8, 1);
  withLse.lse = fakeDevicePointer<float>(0x1000);
  expectError(decode, withLse, "built without lse output");
  PagedcAttentionKernelArgs masked = callArgs(1, 32, 8, 1);
  masked.kv_num_blocks = fakeDevicePointer<int32_t>(0x2000);
  masked.kv_indices = fakeDevicePointer<int32_t>(0x3000);
  masked.q_block_size = 128;
  masked.kv_block_size = 96;
  masked.mask_batch = masked.mask_heads = masked.num_q_blocks = masked.max_kv_blocks = 1;
  expectError(decode, masked, "kv block size 96 must be a multiple of the kernel's KV tile 64");
  PagedcAttentionKernelArgs noQ = callArgs(1, 32, 8, 1);
  noQ.q = nullptr;
  expectError(decode, noQ, "must all be device pointers");
}

TEST(CudaLaunch, BlockMaskBuildDryRun) {
  PagedcBlockMaskKernelArgs args{};
  args.kv_num_blocks = fakeDevicePointer<int32_t>(0x1000);
  args.kv_indices = fakeDevicePointer<int32_t>(0x2000);
  args.full_kv_num_blocks = fakeDevicePointer<int32_t>(0x3000);
  args.full_kv_indices = fakeDevicePointer<int32_t>(0x4000);
  args.batch = 2;
  args.heads = 1;
  args.q_len = 1000;
  args.kv_len = 1000;
  args.q_block_size = args.kv_block_size = 128;
  args.num_q_blocks = args.max_kv_blocks = 8;
  KernelLaunch launch = planBlockMaskBuild(args, {0});
  EXPECT_EQ(launch.grid[0], 8u);
  EXPECT_EQ(launch.grid[2], 2u);
  args.max_kv_blocks = 7;
  EXPECT_THROW(planBlockMaskBuild(args, {0}), Error);
}
