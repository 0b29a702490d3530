//===- CudaLaunchTest.cpp - Driver loader and launch dry runs -------------===//
//
// Everything up to cuLaunchKernel: compiled cubins that name their kernels,
// launch grids, shared memory, decode split choice and packed arguments.
// The driver test checks the "no driver" path on machines without one.
//
//===----------------------------------------------------------------------===//

#include "pagedc/CudaAttention.h"
#include "pagedc/CudaLaunch.h"
#include "pagedc/EmulatorBuild.h"
#include "pagedc/Error.h"
#include "pagedc/KernelCache.h"
#include "pagedc/KernelOptions.h"
#include "support/CudaTestSupport.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>

using namespace pagedc;

namespace {

/// Memory only: tests never write to the user's cache directory.
KernelCache &testCache() {
  static KernelCache cache("");
  return cache;
}

PagedcAttentionKernelArgs callArgs(int batch, int headsQ, int headsKv, int qLen) {
  return test::fakeAttentionArgs(batch, headsQ, headsKv, qLen);
}

/// The warpgroup prefill's default tiles at D 128: 128 x 64, two consumer
/// warpgroups.
KernelConfig warpgroupPrefill() {
  KernelConfig config;
  config.blockM = 128;
  config.blockN = 64;
  config.warpRows = 64;
  return config;
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
  args.lse = test::fakeDevicePointer<float>(0x7f0000700000);
  std::vector<unsigned char> params(16, 0xab);
  AttentionLaunchPlan plan = planAttention(config, args, params, 4096, 132);
  ASSERT_EQ(plan.launches.size(), 1u);
  KernelLaunch &launch = plan.launches[0];
  EXPECT_EQ(launch.kernel, kernel->kernelNames[0]);
  EXPECT_EQ(launch.grid[0], 16u * 32 * 4); // ceil(1000 / 64) x heads x batch
  EXPECT_EQ(launch.grid[1], 1u);
  EXPECT_EQ(launch.grid[2], 1u);
  EXPECT_EQ(launch.block[0], 128u);
  EXPECT_EQ(launch.sharedMemoryBytes, (64u + 4 * 64) * 256 + 256); // + staged pages
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

// The warpgroup prefill takes a third parameter, its tensor maps, which a
// plan packs disabled (zeros) until bindPrefillTensorMaps fills them: the
// kernel then gathers every tile. The mma.sync prefill has two.
TEST(CudaLaunch, WarpgroupPrefillPlansDisabledTensorMaps) {
  KernelConfig config = warpgroupPrefill();
  PagedcAttentionKernelArgs args = callArgs(2, 8, 2, 300);
  AttentionLaunchPlan plan = planAttention(config, args, std::vector<unsigned char>(4), 300, 132);
  ASSERT_EQ(plan.launches.size(), 1u);
  const KernelLaunch &launch = plan.launches[0];
  ASSERT_EQ(launch.arguments.size(), 3u);
  ASSERT_EQ(launch.arguments[2].size(), sizeof(PagedcWgmmaPrefillArgs));
  // The run maps are appended: the fields before them keep their offsets,
  // which kernels built before them read.
  EXPECT_EQ(sizeof(PagedcWgmmaPrefillArgs), 640u);
  EXPECT_EQ(alignof(PagedcWgmmaPrefillArgs), 64u);
  EXPECT_EQ(offsetof(PagedcWgmmaPrefillArgs, v_map), 128u);
  EXPECT_EQ(offsetof(PagedcWgmmaPrefillArgs, tensor_maps), 256u);
  EXPECT_EQ(offsetof(PagedcWgmmaPrefillArgs, ping_pong), 260u);
  EXPECT_EQ(offsetof(PagedcWgmmaPrefillArgs, k_run_map), 320u);
  EXPECT_EQ(offsetof(PagedcWgmmaPrefillArgs, v_run_map), 448u);
  EXPECT_EQ(offsetof(PagedcWgmmaPrefillArgs, run_boxes), 576u);
  for (unsigned char byte : launch.arguments[2])
    ASSERT_EQ(byte, 0);
  EXPECT_EQ(launch.note, "gather (tensor maps not bound)");

  // Ping-pong: the switch and the note, on and off again.
  setPrefillPingPong(plan, true);
  PagedcWgmmaPrefillArgs extra;
  std::memcpy(&extra, plan.launches[0].arguments[2].data(), sizeof(extra));
  EXPECT_EQ(extra.ping_pong, 1);
  EXPECT_EQ(extra.tensor_maps, 0);
  EXPECT_EQ(plan.launches[0].note, "gather (tensor maps not bound), ping-pong");
  setPrefillPingPong(plan, false);
  std::memcpy(&extra, plan.launches[0].arguments[2].data(), sizeof(extra));
  EXPECT_EQ(extra.ping_pong, 0);
  EXPECT_EQ(plan.launches[0].note, "gather (tensor maps not bound)");

  KernelConfig mma; // 64 x 64, 16 rows per warp
  AttentionLaunchPlan plain = planAttention(mma, args, std::vector<unsigned char>(4), 300, 132);
  EXPECT_EQ(plain.launches[0].arguments.size(), 2u);
  EXPECT_EQ(plain.launches[0].note, "");
  setPrefillPingPong(plain, true); // no third argument: nothing to set
  EXPECT_EQ(plain.launches[0].arguments.size(), 2u);
  EXPECT_EQ(plain.launches[0].note, "");
}

TEST(KernelOptions, SwitchesParseAsZeroOrOne) {
  // Tensor maps (prefill and decode) and the work counter are on unless
  // set to 0; ping-pong is off unless set to 1; "" unsets.
  struct Switch {
    const char *name;
    std::optional<bool> KernelOptions::*field;
  };
  for (const auto &[name, field] :
       {Switch{"prefill_tma", &KernelOptions::prefillTma},
        Switch{"prefill_tma_runs", &KernelOptions::prefillTmaRuns},
        Switch{"prefill_pingpong", &KernelOptions::prefillPingPong},
        Switch{"prefill_tile_counter", &KernelOptions::prefillTileCounter},
        Switch{"decode_tma", &KernelOptions::decodeTma},
        Switch{"decode_tma_runs", &KernelOptions::decodeTmaRuns}}) {
    KernelOptions options;
    setKernelOption(options, name, "0");
    EXPECT_EQ(options.*field, false) << name;
    setKernelOption(options, name, "1");
    EXPECT_EQ(options.*field, true) << name;
    setKernelOption(options, std::string(name) + "=");
    EXPECT_FALSE((options.*field).has_value()) << name;
    setKernelOption(options, std::string(name) + "=0");
    for (const char *bad : {"yes", "true", "2", " 1", "01"}) {
      try {
        setKernelOption(options, name, bad);
        ADD_FAILURE() << name << "=" << bad << " was taken";
      } catch (const Error &error) {
        const std::string message = error.what();
        EXPECT_NE(message.find(fmt::format("kernel option {} is '{}'", name, bad)),
                  std::string::npos)
            << message;
        EXPECT_NE(message.find("expected 1 ("), std::string::npos) << message;
        EXPECT_NE(message.find(") or 0"), std::string::npos) << message;
      }
      EXPECT_EQ(options.*field, false) << name << ": changed by a refused value";
    }
  }
}

TEST(KernelOptions, LinkModsTakesZeroOneOrFirst) {
  KernelOptions options;
  setKernelOption(options, "link_mods", "0");
  EXPECT_EQ(options.linkMods, ModLinking::Inline);
  setKernelOption(options, "link_mods", "1");
  EXPECT_EQ(options.linkMods, ModLinking::Linked);
  setKernelOption(options, "link_mods=first");
  EXPECT_EQ(options.linkMods, ModLinking::LinkedFirst);
  for (const char *bad : {"2", "yes", "First", " 1"}) {
    try {
      setKernelOption(options, "link_mods", bad);
      ADD_FAILURE() << "'" << bad << "' was taken";
    } catch (const Error &error) {
      const std::string message = error.what();
      EXPECT_NE(message.find(fmt::format("kernel option link_mods is '{}': expected 0", bad)),
                std::string::npos)
          << message;
      EXPECT_NE(message.find("or first ("), std::string::npos) << message;
    }
    EXPECT_EQ(options.linkMods, ModLinking::LinkedFirst) << "changed by a refused value";
  }
  setKernelOption(options, "link_mods", "");
  EXPECT_FALSE(options.linkMods.has_value());
}

// Persistent CTAs: the grid shrinks to min(CTAs, query tiles) and the note
// says so; the kernel needs nothing else (it walks rounds of gridDim.x
// tiles). The mma.sync prefill and the decode kernel are left alone.
TEST(CudaLaunch, PersistentPrefillShrinksTheGrid) {
  KernelConfig config = warpgroupPrefill();
  // 300 rows: 3 query tiles x 8 heads x batch 2 = 48.
  PagedcAttentionKernelArgs args = callArgs(2, 8, 2, 300);
  AttentionLaunchPlan plan = planAttention(config, args, std::vector<unsigned char>(4), 300, 132);
  EXPECT_EQ(plan.launches[0].grid[0], 48u);
  setPrefillPersistent(config, plan, 5);
  EXPECT_EQ(plan.launches[0].grid[0], 5u);
  EXPECT_EQ(plan.launches[0].note, "gather (tensor maps not bound), persistent (5 CTAs)");
  setPrefillPingPong(plan, true);
  EXPECT_EQ(plan.launches[0].note,
            "gather (tensor maps not bound), persistent (5 CTAs), ping-pong");
  // More CTAs than tiles: one per tile.
  AttentionLaunchPlan wide = planAttention(config, args, std::vector<unsigned char>(4), 300, 132);
  setPrefillPersistent(config, wide, 132);
  EXPECT_EQ(wide.launches[0].grid[0], 48u);
  EXPECT_EQ(wide.launches[0].note, "gather (tensor maps not bound), persistent (48 CTAs)");

  KernelConfig mma; // 64 x 64, 16 rows per warp
  AttentionLaunchPlan plain = planAttention(mma, args, std::vector<unsigned char>(4), 300, 132);
  const unsigned grid = plain.launches[0].grid[0];
  setPrefillPersistent(mma, plain, 5);
  EXPECT_EQ(plain.launches[0].grid[0], grid);
  EXPECT_EQ(plain.launches[0].note, "");
}

// The work counter: bound only where the grid is persistent (fewer CTAs
// than query tiles), unbound by 0; the note says so once.
TEST(CudaLaunch, PersistentPrefillTileCounter) {
  KernelConfig config = warpgroupPrefill();
  PagedcAttentionKernelArgs args = callArgs(2, 8, 2, 300); // 48 query tiles
  auto counterOf = [](const AttentionLaunchPlan &plan) {
    PagedcWgmmaPrefillArgs extra;
    std::memcpy(&extra, plan.launches[0].arguments[2].data(), sizeof(extra));
    return reinterpret_cast<uintptr_t>(extra.tile_counter);
  };
  AttentionLaunchPlan plan = planAttention(config, args, std::vector<unsigned char>(4), 300, 132);
  EXPECT_EQ(counterOf(plan), 0u);
  setPrefillTileCounter(config, plan, 0x1000); // one CTA per tile: nothing to count
  EXPECT_EQ(counterOf(plan), 0u);
  EXPECT_EQ(plan.launches[0].note, "gather (tensor maps not bound)");
  setPrefillPersistent(config, plan, 5);
  setPrefillTileCounter(config, plan, 0x1000);
  setPrefillTileCounter(config, plan, 0x2000);
  EXPECT_EQ(counterOf(plan), 0x2000u);
  EXPECT_EQ(plan.launches[0].note,
            "gather (tensor maps not bound), persistent (5 CTAs), tile counter");
  setPrefillTileCounter(config, plan, 0);
  EXPECT_EQ(counterOf(plan), 0u);
  EXPECT_EQ(plan.launches[0].note, "gather (tensor maps not bound), persistent (5 CTAs)");
  // More CTAs than tiles: one per tile, no counter.
  AttentionLaunchPlan wide = planAttention(config, args, std::vector<unsigned char>(4), 300, 132);
  setPrefillPersistent(config, wide, 132);
  setPrefillTileCounter(config, wide, 0x1000);
  EXPECT_EQ(counterOf(wide), 0u);
  KernelConfig mma;
  AttentionLaunchPlan plain = planAttention(mma, args, std::vector<unsigned char>(4), 300, 132);
  setPrefillTileCounter(mma, plain, 0x1000);
  EXPECT_EQ(plain.launches[0].arguments.size(), 2u);
}

// The second Q tile: where it fits beside the ring's stages, which come
// first (KernelConfig::prefillQBuffers).
TEST(CudaLaunch, WarpgroupPrefillQBuffers) {
  KernelConfig config = warpgroupPrefill();
  EXPECT_EQ(config.headDim, 128);
  EXPECT_EQ(config.prefillStages(), 4);
  EXPECT_EQ(config.prefillQBuffers(), 2);
  EXPECT_EQ(config.sharedMemoryBytes(), 1024 + (2 * 128 + 2 * 4 * 64) * 256 + 128);
  config.blockN = 128; // three stages fill 227 KiB
  EXPECT_EQ(config.prefillStages(), 3);
  EXPECT_EQ(config.prefillQBuffers(), 1);
  EXPECT_EQ(config.sharedMemoryBytes(), 1024 + (128 + 2 * 3 * 128) * 256 + 128);
  config.headDim = 256;
  config.blockM = 64;
  config.blockN = 32;
  EXPECT_EQ(config.prefillQBuffers(), 2);
  KernelConfig mma; // the mma.sync prefill has one Q tile
  EXPECT_EQ(mma.prefillQBuffers(), 1);
}

// An 8-bit cache's producer converts codes from its registers into the
// stages: no shared memory of its own, so the ring, the Q tiles and the
// total are the 16-bit kernel's at every tile the runtime takes.
TEST(CudaLaunch, WarpgroupPrefillFloat8SharedMemory) {
  for (const auto &[headDim, blockN] : {std::pair{128, 64}, {128, 128}, {64, 128}, {256, 64}}) {
    KernelConfig sixteen = warpgroupPrefill();
    sixteen.headDim = headDim;
    sixteen.blockN = blockN;
    KernelConfig codes = sixteen;
    codes.kvFloat8 = DType::F8E4M3;
    codes.validate();
    SCOPED_TRACE(codes.describe());
    EXPECT_EQ(codes.prefillStages(), sixteen.prefillStages());
    EXPECT_EQ(codes.prefillQBuffers(), sixteen.prefillQBuffers());
    EXPECT_EQ(codes.sharedMemoryBytes(), sixteen.sharedMemoryBytes());
  }
  KernelConfig config = warpgroupPrefill();
  config.kvFloat8 = DType::F8E5M2;
  config.blockN = 128; // 128 x 128 at D 128: three stages, one Q tile
  EXPECT_EQ(config.prefillStages(), 3);
  EXPECT_EQ(config.prefillQBuffers(), 1);
  EXPECT_EQ(config.sharedMemoryBytes(), 1024 + (128 + 2 * 3 * 128) * 256 + 128);
}

TEST(KernelOptions, PersistentSettingsAndTheirPairs) {
  KernelOptions options;
  EXPECT_EQ(prefillPersistence(options), PrefillPersistence::Auto);
  setKernelOption(options, "prefill_persistent", "0");
  EXPECT_EQ(prefillPersistence(options), PrefillPersistence::Off);
  setKernelOption(options, "prefill_persistent", "");
  EXPECT_EQ(prefillPersistence(options), PrefillPersistence::Auto);
  try {
    setKernelOption(options, "prefill_persistent", "yes");
    ADD_FAILURE() << "prefill_persistent=yes was taken";
  } catch (const Error &error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("kernel option prefill_persistent is 'yes'"), std::string::npos)
        << message;
    EXPECT_NE(message.find("expected 1 ("), std::string::npos) << message;
  }
  setKernelOption(options, "prefill_persistent", "1");
  EXPECT_EQ(prefillPersistence(options), PrefillPersistence::On);
  setKernelOption(options, "prefill_persistent_ctas", "7");
  EXPECT_EQ(options.prefillPersistentCtas, 7);
  for (const char *bad : {"0", "-3", "x", "7x", "2000000"}) {
    try {
      setKernelOption(options, "prefill_persistent_ctas", bad);
      ADD_FAILURE() << "prefill_persistent_ctas=" << bad << " was taken";
    } catch (const Error &error) {
      EXPECT_NE(std::string(error.what()).find("expected an integer from 1 to 1048576"),
                std::string::npos)
          << error.what();
    }
  }
  EXPECT_EQ(options.prefillPersistentCtas, 7);
  EXPECT_NO_THROW(checkKernelOptions(options));
  // A CTA count without the switch on (0 or unset) is refused, naming both.
  for (std::optional<bool> without : {std::optional<bool>(false), std::optional<bool>()}) {
    options.prefillPersistent = without;
    try {
      checkKernelOptions(options);
      ADD_FAILURE() << "prefill_persistent_ctas taken without the switch";
    } catch (const Error &error) {
      EXPECT_NE(std::string(error.what()).find("kernel option prefill_persistent_ctas is '7' but "
                                               "kernel option prefill_persistent is not 1"),
                std::string::npos)
          << error.what();
    }
  }
  // Set on the struct directly, out of range: refused as the parser does.
  options.prefillPersistent = true;
  options.prefillPersistentCtas = 0;
  EXPECT_THROW(checkKernelOptions(options), Error);
  options.prefillPersistentCtas.reset();
  // The work counter: refused when persistent CTAs are off.
  options.prefillTileCounter = true;
  options.prefillPersistent = false;
  try {
    checkKernelOptions(options);
    ADD_FAILURE() << "prefill_tile_counter taken with persistent CTAs off";
  } catch (const Error &error) {
    EXPECT_NE(std::string(error.what()).find("kernel option prefill_persistent is 0"),
              std::string::npos)
        << error.what();
  }
  options.prefillPersistent.reset(); // chosen by the mask: the counter may apply
  EXPECT_NO_THROW(checkKernelOptions(options));
}

// The grid the options and the mask choose: unset, persistent CTAs (one
// per slot) where the visits grow and the tiles outnumber the slots; false
// never; true always, with prefillPersistentCtas or the slots. Other
// kernels: untouched.
TEST(CudaLaunch, PersistentPrefillChosenByTheMask) {
  KernelOptions options;
  KernelConfig config = warpgroupPrefill();
  PagedcAttentionKernelArgs args = callArgs(2, 8, 2, 300); // 48 query tiles
  auto grid = [&](int64_t slots, bool visitsGrow, bool expectPersistent,
                  const KernelConfig &kernel) {
    AttentionLaunchPlan plan =
        planAttention(kernel, args, std::vector<unsigned char>(4), 300, 132);
    const unsigned before = plan.launches[0].grid[0];
    EXPECT_EQ(applyPrefillPersistentRequest(kernel, plan, slots, visitsGrow, options),
              expectPersistent)
        << slots << " " << visitsGrow;
    EXPECT_EQ(plan.launches[0].note.find("persistent") != std::string::npos, expectPersistent)
        << plan.launches[0].note;
    EXPECT_EQ(plan.launches[0].grid[0] != before, expectPersistent);
    return plan.launches[0].grid[0];
  };
  EXPECT_EQ(grid(5, true, true, config), 5u);
  EXPECT_EQ(grid(5, false, false, config), 48u);  // a document mask's rows
  EXPECT_EQ(grid(48, true, false, config), 48u);  // no more tiles than slots
  EXPECT_EQ(grid(132, true, false, config), 48u);
  options.prefillPersistent = false;
  EXPECT_EQ(grid(5, true, false, config), 48u);
  options.prefillPersistent = true;
  EXPECT_EQ(grid(5, false, true, config), 5u);
  options.prefillPersistentCtas = 3;
  EXPECT_EQ(grid(5, false, true, config), 3u);
  options = {};
  KernelConfig mma; // the mma.sync prefill: one CTA per tile always
  AttentionLaunchPlan plain = planAttention(mma, args, std::vector<unsigned char>(4), 300, 132);
  const unsigned mmaGrid = plain.launches[0].grid[0];
  EXPECT_FALSE(applyPrefillPersistentRequest(mma, plain, 5, true, options));
  EXPECT_EQ(plain.launches[0].grid[0], mmaGrid);
}

// Every kernel option set through the C++ API, and the launch plan the
// runtime's steps make of it (chooseCudaAttentionConfig, planAttention,
// applyKernelOptions; no device: tensor maps are not bound, so the copy
// path's note says whether they were asked for).
TEST(KernelOptions, EveryOptionChangesTheLaunchPlan) {
  CompiledMods mods;
  mods.cuda.modCode = std::string(embeddedTemplate("testing/causal.cuh"));
  PagedcModContext noContext{nullptr, nullptr};
  const std::vector<unsigned char> params =
      ParamsLayout::forDeclarations(mods.params, mods.buffers)
          .pack(mods.params, mods.buffers, noContext);
  const PagedcAttentionKernelArgs prefillArgs = callArgs(2, 8, 2, 300); // 48 query tiles
  auto prefill = [&](const KernelOptions &options, int64_t slots = 5, bool visitsGrow = true) {
    const KernelConfig config =
        chooseCudaAttentionConfig(mods, DType::BF16, 128, 16, 4, 300, false, "emu", 0, options);
    AttentionLaunchPlan plan = planAttention(config, prefillArgs, params, 300, 132, 2, -1,
                                             options);
    applyKernelOptions(nullptr, config, "emu", plan, 10, 10, slots, visitsGrow, options,
                       [] { return cu::DevicePointer(0x1000); });
    return std::pair{config, plan};
  };
  auto extraOf = [](const AttentionLaunchPlan &plan) {
    PagedcWgmmaPrefillArgs extra;
    std::memcpy(&extra, plan.launches[0].arguments[2].data(), sizeof(extra));
    return extra;
  };

  // Nothing set on the emulator: the mma.sync tile, no launch options.
  {
    const auto [config, plan] = prefill({});
    EXPECT_EQ(config.warpRows, 16);
    EXPECT_FALSE(config.prefillShapeAsked);
    EXPECT_EQ(plan.launches[0].arguments.size(), 2u);
    EXPECT_EQ(plan.launches[0].note, "");
  }
  // prefill_shape: the warpgroup tile, kept as asked; by default persistent
  // CTAs over the slots with the work counter.
  KernelOptions options;
  options.prefillShape = "128x64x64";
  {
    const auto [config, plan] = prefill(options);
    EXPECT_EQ(config.blockM, 128);
    EXPECT_EQ(config.blockN, 64);
    EXPECT_EQ(config.warpRows, 64);
    EXPECT_TRUE(config.prefillShapeAsked);
    EXPECT_FALSE(config.prefillFallsBackOnSpills());
    EXPECT_EQ(plan.launches[0].grid[0], 5u);
    EXPECT_EQ(plan.launches[0].note,
              "gather (tensor maps not bound), persistent (5 CTAs), tile counter");
    EXPECT_EQ(reinterpret_cast<uintptr_t>(extraOf(plan).tile_counter), 0x1000u);
    EXPECT_EQ(extraOf(plan).ping_pong, 0);
  }
  // prefill_tma=0: gathered whatever the driver could do.
  options.prefillTma = false;
  EXPECT_EQ(prefill(options).second.launches[0].note,
            "gather (prefill_tma=0), persistent (5 CTAs), tile counter");
  // prefill_tile_counter=0: fixed rounds.
  options.prefillTileCounter = false;
  {
    const auto [config, plan] = prefill(options);
    EXPECT_EQ(plan.launches[0].note, "gather (prefill_tma=0), persistent (5 CTAs)");
    EXPECT_EQ(extraOf(plan).tile_counter, nullptr);
  }
  // prefill_pingpong=1.
  options.prefillPingPong = true;
  {
    const auto [config, plan] = prefill(options);
    EXPECT_EQ(plan.launches[0].note, "gather (prefill_tma=0), persistent (5 CTAs), ping-pong");
    EXPECT_EQ(extraOf(plan).ping_pong, 1);
  }
  // prefill_persistent=0: a CTA per query tile, even where visits grow.
  options.prefillPersistent = false;
  options.prefillTileCounter.reset();
  EXPECT_EQ(prefill(options).second.launches[0].grid[0], 48u);
  // prefill_persistent=1 and _ctas=3: 3 CTAs, even where visits do not grow.
  options.prefillPersistent = true;
  options.prefillPersistentCtas = 3;
  EXPECT_EQ(prefill(options, 5, /*visitsGrow=*/false).second.launches[0].grid[0], 3u);
  // prefill_tma_runs: kept for the binding (which needs a driver: GpuTest).
  options.prefillTmaRuns = false;
  EXPECT_EQ(prefill(options).second.launches[0].grid[0], 3u);

  // Decode: decode_split_factor multiplies the model's splits; decode_tma=0
  // gathers.
  const PagedcAttentionKernelArgs decodeArgs = callArgs(1, 32, 8, 1);
  auto decode = [&](const KernelOptions &kernelOptions) {
    const KernelConfig config =
        chooseCudaAttentionConfig(mods, DType::BF16, 128, 16, 4, 1, false, "emu", 0,
                                  kernelOptions);
    EXPECT_EQ(config.kind, KernelKind::Decode);
    AttentionLaunchPlan plan =
        planAttention(config, decodeArgs, params, 32768, 132, 2, -1, kernelOptions);
    applyKernelOptions(nullptr, config, "emu", plan, 600, 600, 264, true, kernelOptions,
                       [] { return cu::DevicePointer(0); });
    return plan;
  };
  const AttentionLaunchPlan base = decode({});
  EXPECT_EQ(base.launches[0].note, "gather (tensor maps not bound)");
  KernelOptions decodeOptions;
  decodeOptions.decodeSplitFactor = 3;
  decodeOptions.decodeTma = false;
  decodeOptions.decodeTmaRuns = false; // for the binding (GpuTest)
  const AttentionLaunchPlan tripled = decode(decodeOptions);
  EXPECT_GT(tripled.args.num_splits, base.args.num_splits);
  EXPECT_LE(tripled.args.num_splits, 3 * base.args.num_splits);
  EXPECT_EQ(tripled.launches[0].grid[0], unsigned(tripled.args.num_splits));
  EXPECT_EQ(tripled.launches[0].note, "gather (decode_tma=0)");

  // decode_merge_chunks: the merge's CTAs a row (grid x; 8 by default at
  // B 1 x Hq 32, D 128), halved while above one per 16 columns; the split
  // kernel's launch is left as it was.
  ASSERT_EQ(base.launches.size(), 2u);
  EXPECT_EQ(base.launches[1].grid[0], 8u);
  for (auto [asked, given] : {std::pair{1, 1u}, {2, 2u}, {4, 4u}, {8, 8u}, {16, 8u}}) {
    KernelOptions chunked;
    chunked.decodeMergeChunks = asked;
    const AttentionLaunchPlan plan = decode(chunked);
    ASSERT_EQ(plan.launches.size(), 2u) << asked;
    EXPECT_EQ(plan.launches[1].grid[0], given) << asked;
    EXPECT_EQ(plan.launches[1].grid[1], 32u) << asked;
    EXPECT_EQ(plan.launches[0].grid[0], base.launches[0].grid[0]) << asked;
    EXPECT_EQ(plan.args.num_splits, base.args.num_splits) << asked;
  }
  for (int bad : {0, 3, 32, -1}) {
    KernelOptions refused;
    refused.decodeMergeChunks = bad; // set directly: refused where it is checked
    EXPECT_THROW(checkKernelOptions(refused), Error) << bad;
  }

  // decode_splits: the count asked for (12 of 64-key tiles: 43 tiles each,
  // the last shorter), one split and no merge, or as many as the call
  // allows (no split shorter than the planner's least).
  KernelOptions forced;
  forced.decodeSplits = 12;
  const AttentionLaunchPlan twelve = decode(forced);
  EXPECT_EQ(twelve.args.num_splits, 12);
  EXPECT_EQ(twelve.launches[0].grid[0], 12u);
  EXPECT_EQ(twelve.args.split_size, 43 * 64);
  ASSERT_EQ(twelve.launches.size(), 2u);
  forced.decodeSplits = 1;
  const AttentionLaunchPlan one = decode(forced);
  EXPECT_EQ(one.args.num_splits, 1);
  EXPECT_EQ(one.launches.size(), 1u);
  forced.decodeSplits = 1024;
  const AttentionLaunchPlan most = decode(forced);
  EXPECT_GT(most.args.num_splits, base.args.num_splits);
  EXPECT_GE(most.args.split_size, 256); // CudaLaunch.cpp's kMinSplitLength
  EXPECT_LT(int64_t(most.args.num_splits - 1) * most.args.split_size, 32768);
  forced.decodeSplitFactor = 2; // with the factor: refused
  EXPECT_THROW(decode(forced), Error);
}

// Which code has sm_90's instructions (the decode kernel's tensor maps, the
// merge's programmatic dependent launch).
TEST(CudaLaunch, ArchesWithSm90Features) {
  for (const char *arch : {"sm_90", "sm_90a", "sm_100", "sm_120", "emu"})
    EXPECT_TRUE(archHasSm90Features(arch)) << arch;
  for (const char *arch : {"sm_80", "sm_86", "sm_89", "sm_9", "compute_90", "", "sm_"})
    EXPECT_FALSE(archHasSm90Features(arch)) << arch;
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
  // D 128, 16 padded rows: Q 4 KiB, two K and two V stages of 64 rows
  // (64 KiB), class map 1 KiB, seen flags 64 B, merge maxima and sums
  // 512 B, staged pages 256 B, two mbarriers 16 B, 1 KiB of alignment
  // (bench/gpu/ptxas_decode.py restates this).
  EXPECT_EQ(config.sharedMemoryBytes(), 72528);
  // The third argument: the tensor maps, off until bound.
  ASSERT_EQ(main.arguments.size(), 3u);
  ASSERT_EQ(main.arguments[2].size(), sizeof(PagedcDecodeMapArgs));
  for (unsigned char byte : main.arguments[2])
    ASSERT_EQ(byte, 0);
  // The run maps are appended (older kernels read the first 260 bytes).
  EXPECT_EQ(sizeof(PagedcDecodeMapArgs), 640u);
  EXPECT_EQ(offsetof(PagedcDecodeMapArgs, tensor_maps), 256u);
  EXPECT_EQ(offsetof(PagedcDecodeMapArgs, k_run_map), 320u);
  EXPECT_EQ(offsetof(PagedcDecodeMapArgs, run_boxes), 576u);
  EXPECT_EQ(main.note, "gather (tensor maps not bound)");
  int splits = plan.args.num_splits;
  EXPECT_GE(splits * 8, 132); // at least one CTA per SM
  EXPECT_EQ(plan.args.split_size % 64, 0);
  EXPECT_GE(int64_t(splits) * plan.args.split_size, 32768);
  EXPECT_LT(int64_t(splits - 1) * plan.args.split_size, 32768);
  EXPECT_EQ(main.grid[0], unsigned(splits));
  EXPECT_EQ(main.grid[1], 8u);
  // 32 rows on 132 SMs' 2,112 merge slots: each row's 128 columns go to 8
  // CTAs (8 column pairs each).
  EXPECT_EQ(merge.grid[0], 8u);
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

/// A decode problem of GQA 4, D 128, one query token on 132 SMs.
DecodeSplitProblem problemOf(int64_t ctasPerSplit, int64_t granules, int residentCtasPerSm,
                             int64_t maxPer = 0, int64_t minPer = 4) {
  DecodeSplitProblem p;
  p.ctasPerSplit = ctasPerSplit;
  p.granules = granules;
  p.granuleLength = 64;
  p.rowsPerCta = 4;
  p.headDim = 128;
  p.multiprocessors = 132;
  p.residentCtasPerSm = residentCtasPerSm;
  p.maxGranulesPerSplit = maxPer;
  p.minGranulesPerSplit = minPer;
  return p;
}

/// The fraction of the CTA slots a plan's waves keep busy.
double busyFraction(const DecodeSplitChoice &c, int64_t ctasPerSplit, int64_t slots) {
  const int64_t ctas = ctasPerSplit * c.splits;
  return double(ctas) / double((ctas + slots - 1) / slots * slots);
}

TEST(CudaLaunch, DecodeSplitsFollowOccupancy) {
  // B 64 x Hkv 8 = 512 CTAs per split over 8k keys (128 tiles of 64).
  // Two CTAs per SM: 264 slots, 1.94 waves unsplit (0.97 busy): no split.
  DecodeSplitChoice two = chooseDecodeSplits(problemOf(512, 128, 2));
  EXPECT_EQ(two.splits, 1);
  // Three CTAs per SM: 396 slots; unsplit is two waves of which the second
  // is 29% full (0.65 busy). The plan splits and keeps >= 0.95 busy, and
  // the partials it writes and the merge reads stay within 1% of the K/V
  // bytes (over-fetch).
  DecodeSplitChoice three = chooseDecodeSplits(problemOf(512, 128, 3));
  EXPECT_GT(three.splits, 1);
  EXPECT_GE(busyFraction(three, 512, 396), 0.95) << three.splits << " splits";
  const double kvBytes = 512.0 * 128 * 64 * 128 * 2 * 2;
  const double partialBytes = 2.0 * 512 * 4 * three.splits * (128 + 1) * 4;
  EXPECT_LE(partialBytes, 0.01 * kvBytes) << three.splits << " splits";
  // B 16 x Hkv 8 = 128 CTAs per split, 32k keys: the former rule (3
  // splits, 384 CTAs on 264 slots) kept 0.73 busy.
  DecodeSplitChoice b16 = chooseDecodeSplits(problemOf(128, 512, 2));
  EXPECT_GE(busyFraction(b16, 128, 264), 0.95) << b16.splits << " splits";
  // One sequence, 1k keys: the merge of 32 rows barely fills the device,
  // but 8 CTAs fill it less: it splits, at least 256 keys a split.
  DecodeSplitChoice b1 = chooseDecodeSplits(problemOf(8, 16, 3));
  EXPECT_GT(b1.splits, 1);
  EXPECT_GE(b1.granulesPerSplit, 4);
}

TEST(CudaLaunch, DecodeMergeChunksFillTheSlots) {
  // 132 SMs x 16 merge CTAs: 2,112 slots.
  EXPECT_EQ(decodeMergeChunks(32, 128, 132), 8); // at most 128 / 16
  EXPECT_EQ(decodeMergeChunks(32, 256, 132), 16);
  EXPECT_EQ(decodeMergeChunks(32, 64, 132), 4);
  EXPECT_EQ(decodeMergeChunks(512, 128, 132), 4);  // 2,048 CTAs
  EXPECT_EQ(decodeMergeChunks(1056, 128, 132), 2); // 2,112
  EXPECT_EQ(decodeMergeChunks(2048, 128, 132), 1); // the rows fill the slots
  EXPECT_EQ(decodeMergeChunks(32, 8, 132), 1);     // too few columns to divide
  EXPECT_EQ(decodeMergeChunks(32, 128, 1), 1);
}

TEST(CudaLaunch, DecodeSplitsKeepTheirBounds) {
  for (int64_t ctas : {1, 8, 32, 128, 512, 2048})
    for (int64_t granules : {1, 2, 3, 17, 64, 65, 128, 500, 4096})
      for (int64_t maxPer : {0, 64})
        for (int resident : {1, 2, 3, 8}) {
          SCOPED_TRACE(testing::Message() << ctas << " CTAs per split, " << granules
                                          << " granules, at most " << maxPer << ", "
                                          << resident << " CTAs per SM");
          DecodeSplitChoice c =
              chooseDecodeSplits(problemOf(ctas, granules, resident, maxPer, 2));
          ASSERT_GE(c.splits, 1);
          // Every granule is covered, no split is empty.
          EXPECT_GE(c.splits * c.granulesPerSplit, granules);
          EXPECT_LT((c.splits - 1) * c.granulesPerSplit, granules);
          if (maxPer)
            EXPECT_LE(c.granulesPerSplit, maxPer);
          // At least 2 granules per split when there are that many.
          if (granules >= 2 && (!maxPer || granules <= maxPer))
            EXPECT_GE(c.granulesPerSplit, 2);
        }
}

TEST(CudaLaunch, DecodeSplitFactorMultipliesTheSplits) {
  // B 16 x Hkv 8, a 4k window in 128-key blocks (32 granules), 3 CTAs per
  // SM: the rule gives one wave; factor 2 twice the splits, two waves.
  DecodeSplitProblem p = problemOf(128, 32, 3, 16, 2);
  p.granuleLength = 128;
  const DecodeSplitChoice one = chooseDecodeSplits(p);
  p.splitFactor = 2;
  const DecodeSplitChoice two = chooseDecodeSplits(p);
  EXPECT_EQ(two.splits, 2 * one.splits) << one.splits << " splits at factor 1";
  EXPECT_GE(two.splits * two.granulesPerSplit, 32);
  EXPECT_LT((two.splits - 1) * two.granulesPerSplit, 32);
  // Never below the minimum split length, never an empty split.
  for (int factor : {2, 3, 16})
    for (int64_t granules : {1, 2, 5, 9, 64, 500}) {
      SCOPED_TRACE(testing::Message() << "factor " << factor << ", " << granules << " granules");
      DecodeSplitProblem q = problemOf(8, granules, 3, 0, 4);
      const DecodeSplitChoice base = chooseDecodeSplits(q);
      q.splitFactor = factor;
      const DecodeSplitChoice c = chooseDecodeSplits(q);
      EXPECT_GE(c.splits, base.splits);
      EXPECT_LE(c.splits, std::max<int64_t>(base.splits, granules / 4));
      EXPECT_GE(c.splits * c.granulesPerSplit, granules);
      EXPECT_LT((c.splits - 1) * c.granulesPerSplit, granules);
    }
}

// Unknown names and text that is not NAME=VALUE are refused, listing the
// valid names; a refused list leaves nothing half-applied.
TEST(KernelOptions, UnknownNamesListTheValidOnes) {
  const std::string names = kernelOptionNames();
  EXPECT_EQ(names, "prefill_shape, prefill_persistent, prefill_persistent_ctas, "
                   "prefill_tile_counter, prefill_tma, prefill_tma_runs, prefill_pingpong, "
                   "decode_split_factor, decode_splits, decode_merge_chunks, decode_tma, "
                   "decode_tma_runs, link_mods");
  KernelOptions options;
  for (const char *bad : {"prefill_tmaa=1", "PREFILL_TMA=1", "PAGEDC_PREFILL_TMA=1", "=1",
                          "prefill_tma"}) {
    try {
      setKernelOption(options, bad);
      ADD_FAILURE() << "'" << bad << "' was taken";
    } catch (const Error &error) {
      EXPECT_NE(std::string(error.what()).find(names), std::string::npos) << error.what();
    }
  }
  try {
    setKernelOption(options, "prefill_tmaa", "1");
    ADD_FAILURE() << "prefill_tmaa was taken";
  } catch (const Error &error) {
    EXPECT_EQ(std::string(error.what()),
              "unknown kernel option 'prefill_tmaa': the options are " + names);
  }
  EXPECT_EQ(options, KernelOptions());
  EXPECT_THROW(parseKernelOptions({"prefill_tma=0", "decode_tma=2"}), Error);
  const KernelOptions parsed =
      parseKernelOptions({"prefill_tma=0", "decode_split_factor=2", "prefill_tma=1"});
  EXPECT_EQ(parsed.prefillTma, true); // the last one wins
  EXPECT_EQ(parsed.decodeSplitFactor, 2);
  // prefill_shape: the whole list is checked when set.
  for (const char *bad : {"big", "128x32", "128x32x32q", "128x32x32s2", "128x64x64,",
                          "128x64x64,128x128x64", "d256=128x64x64,d256=64x32x64",
                          "d256=128x64", "128x64x64,d256=garbage"}) {
    try {
      setKernelOption(options, "prefill_shape", bad);
      ADD_FAILURE() << "prefill_shape=" << bad << " was taken";
    } catch (const Error &error) {
      EXPECT_EQ(std::string(error.what()).rfind("kernel option prefill_shape '", 0), 0u)
          << error.what();
    }
  }
  setKernelOption(options, "prefill_shape", "128x128x64s2,d256=128x64x64,d64=");
  EXPECT_EQ(options.prefillShape, "128x128x64s2,d256=128x64x64,d64=");
}

// kernelOptionsFromEnvironment: each former variable sets its option
// through the same parser, its errors naming the variable.
TEST(KernelOptions, EachVariableMapsToItsOption) {
  std::vector<std::unique_ptr<test::ScopedEnv>> cleared;
  for (const KernelOptionInfo &info : kernelOptionInfos()) {
    // The variable is the name in capitals after PAGEDC_ (the CLI's help
    // says so).
    std::string lower = info.variable;
    for (char &c : lower)
      c = c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c;
    EXPECT_EQ(lower, std::string("pagedc_") + info.name);
    cleared.push_back(std::make_unique<test::ScopedEnv>(info.variable, nullptr));
  }
  EXPECT_EQ(kernelOptionsFromEnvironment(), KernelOptions());
  struct Mapping {
    const char *variable, *value;
    KernelOptions expected;
  };
  auto with = [](auto set) {
    KernelOptions options;
    set(options);
    return options;
  };
  const std::vector<Mapping> mappings = {
      {"PAGEDC_PREFILL_SHAPE", "128x64x64,d256=64x32x64",
       with([](KernelOptions &o) { o.prefillShape = "128x64x64,d256=64x32x64"; })},
      {"PAGEDC_PREFILL_PERSISTENT", "0",
       with([](KernelOptions &o) { o.prefillPersistent = false; })},
      {"PAGEDC_PREFILL_TILE_COUNTER", "0",
       with([](KernelOptions &o) { o.prefillTileCounter = false; })},
      {"PAGEDC_PREFILL_TMA", "0", with([](KernelOptions &o) { o.prefillTma = false; })},
      {"PAGEDC_PREFILL_TMA_RUNS", "0", with([](KernelOptions &o) { o.prefillTmaRuns = false; })},
      {"PAGEDC_PREFILL_PINGPONG", "1", with([](KernelOptions &o) { o.prefillPingPong = true; })},
      {"PAGEDC_DECODE_SPLIT_FACTOR", "4",
       with([](KernelOptions &o) { o.decodeSplitFactor = 4; })},
      {"PAGEDC_DECODE_TMA", "0", with([](KernelOptions &o) { o.decodeTma = false; })},
      {"PAGEDC_DECODE_TMA_RUNS", "0", with([](KernelOptions &o) { o.decodeTmaRuns = false; })},
  };
  for (const Mapping &mapping : mappings) {
    test::ScopedEnv variable(mapping.variable, mapping.value);
    EXPECT_EQ(kernelOptionsFromEnvironment(), mapping.expected) << mapping.variable;
    variable.set(""); // empty: unset
    EXPECT_EQ(kernelOptionsFromEnvironment(), KernelOptions()) << mapping.variable;
    variable.set("2x");
    try {
      kernelOptionsFromEnvironment();
      ADD_FAILURE() << mapping.variable << "=2x was taken";
    } catch (const Error &error) {
      EXPECT_EQ(std::string(error.what()).rfind(std::string(mapping.variable) + " ", 0), 0u)
          << error.what();
    }
  }
  // The CTA count, with its switch; without it, refused naming both variables.
  test::ScopedEnv ctas("PAGEDC_PREFILL_PERSISTENT_CTAS", "3");
  try {
    kernelOptionsFromEnvironment();
    ADD_FAILURE() << "PAGEDC_PREFILL_PERSISTENT_CTAS taken without the switch";
  } catch (const Error &error) {
    EXPECT_NE(std::string(error.what()).find("PAGEDC_PREFILL_PERSISTENT_CTAS is '3' but "
                                             "PAGEDC_PREFILL_PERSISTENT is not 1"),
              std::string::npos)
        << error.what();
  }
  test::ScopedEnv persistent("PAGEDC_PREFILL_PERSISTENT", "1");
  const KernelOptions both = kernelOptionsFromEnvironment();
  EXPECT_EQ(both.prefillPersistent, true);
  EXPECT_EQ(both.prefillPersistentCtas, 3);
  persistent.set("yes");
  try {
    kernelOptionsFromEnvironment();
    ADD_FAILURE() << "PAGEDC_PREFILL_PERSISTENT=yes was taken";
  } catch (const Error &error) {
    EXPECT_NE(std::string(error.what()).find("PAGEDC_PREFILL_PERSISTENT is 'yes'"),
              std::string::npos)
        << error.what();
  }
  // The runtime reads none of them: a plan with every variable set to
  // something else is the default one.
  persistent.set("0");
  ctas.set(nullptr);
  test::ScopedEnv split("PAGEDC_DECODE_SPLIT_FACTOR", "16");
  KernelConfig decode;
  decode.kind = KernelKind::Decode;
  decode.groupSize = 4;
  const AttentionLaunchPlan plan =
      planAttention(decode, callArgs(1, 32, 8, 1), std::vector<unsigned char>(1), 32768, 132);
  split.set(nullptr);
  const AttentionLaunchPlan unset =
      planAttention(decode, callArgs(1, 32, 8, 1), std::vector<unsigned char>(1), 32768, 132);
  EXPECT_EQ(plan.args.num_splits, unset.args.num_splits);
}

TEST(KernelOptions, DecodeSplitFactorParsesOneToSixteen) {
  KernelOptions options;
  EXPECT_EQ(decodeSplitFactor(options), 1);
  setKernelOption(options, "decode_split_factor", "3");
  EXPECT_EQ(decodeSplitFactor(options), 3);
  for (const char *bad : {"0", "17", "2x", "-1", "two"}) {
    try {
      setKernelOption(options, "decode_split_factor", bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error &error) {
      EXPECT_NE(std::string(error.what()).find(fmt::format(
                    "kernel option decode_split_factor is '{}': expected an integer from 1 to 16",
                    bad)),
                std::string::npos)
          << error.what();
    }
  }
  EXPECT_EQ(decodeSplitFactor(options), 3);
  options.decodeSplitFactor = 17; // set directly: refused where it is used
  EXPECT_THROW(decodeSplitFactor(options), Error);
}

TEST(CudaLaunch, DecodeVisibleSpanBoundsWhatRowsSee) {
  // Two batch entries, two heads, q blocks of 16, kv blocks of 128 over
  // 1,000 keys (8 blocks, the last one 104 keys long).
  BlockMask mask;
  mask.batch = 2;
  mask.heads = 2;
  mask.qLength = 1000;
  mask.kvLength = 1000;
  mask.qBlockSize = 16;
  mask.kvBlockSize = 128;
  mask.numQBlocks = 63;
  mask.maxKvBlocks = 8;
  const size_t rows = 2 * 2 * 63;
  mask.kvNumBlocks.assign(rows, 0);
  mask.fullKvNumBlocks.assign(rows, 0);
  mask.kvIndices.assign(rows * 8, 0);
  mask.fullKvIndices.assign(rows * 8, 0);
  auto setRow = [&](int b, int h, int qBlock, std::vector<int32_t> partial,
                    std::vector<int32_t> full) {
    const int64_t row = mask.rowIndex(b, h, qBlock);
    mask.kvNumBlocks[row] = static_cast<int32_t>(partial.size());
    mask.fullKvNumBlocks[row] = static_cast<int32_t>(full.size());
    std::copy(partial.begin(), partial.end(), mask.kvIndices.begin() + row * 8);
    std::copy(full.begin(), full.end(), mask.fullKvIndices.begin() + row * 8);
  };
  // Batch 0 decodes at q 999 (q block 62): head 0 sees blocks 5..6, head 1
  // blocks 4 and 7 (unsorted lists): the span is blocks 4..7 cut at 1,000.
  setRow(0, 0, 62, {6}, {5});
  setRow(0, 1, 62, {7}, {4});
  // Batch 1 at q 500 (q block 31) sees block 3 only; its other rows (not
  // the call's) list everything and must not count.
  setRow(1, 0, 31, {3}, {});
  setRow(1, 1, 30, {0}, {1, 2, 3, 4, 5, 6, 7});
  const int32_t lengths[2] = {1000, 501}, offsets[2] = {999, 500};
  EXPECT_EQ(decodeVisibleSpan(mask, 2, 2, 1, lengths, offsets), 1000 - 4 * 128);
  // Batch 1 alone: one block.
  const int32_t lengths1[2] = {1000, 1000}, offsets1[2] = {0, 500};
  setRow(0, 0, 62, {}, {});
  setRow(0, 1, 62, {}, {});
  EXPECT_EQ(decodeVisibleSpan(mask, 2, 2, 1, lengths1, offsets1), 128);
  // Six tokens from q 500 stay in q block 31; from q 495 they reach back
  // into q block 30, whose row (every block) counts then.
  EXPECT_EQ(decodeVisibleSpan(mask, 2, 2, 6, lengths1, offsets1), 128);
  const int32_t offsets2[2] = {0, 495};
  EXPECT_EQ(decodeVisibleSpan(mask, 2, 2, 6, lengths1, offsets2), 1000);
  // Nothing visible: 0.
  setRow(1, 0, 31, {}, {});
  EXPECT_EQ(decodeVisibleSpan(mask, 2, 2, 1, lengths1, offsets1), 0);

  // The plan follows the span: a 4k window over 32k keys, B 16, Hkv 8,
  // GQA 4, 128-key blocks: splits sized for 33 blocks, not 256.
  KernelConfig config;
  config.kind = KernelKind::Decode;
  config.groupSize = 4;
  PagedcAttentionKernelArgs args = callArgs(16, 32, 8, 1);
  args.kv_num_blocks = test::fakeDevicePointer<int32_t>(0x2000);
  args.kv_indices = test::fakeDevicePointer<int32_t>(0x3000);
  args.q_block_size = 128;
  args.kv_block_size = 128;
  args.mask_batch = args.mask_heads = args.num_q_blocks = 1;
  args.max_kv_blocks = 256;
  AttentionLaunchPlan whole = planAttention(config, args, {0}, 32768, 132, 3);
  AttentionLaunchPlan window = planAttention(config, args, {0}, 32768, 132, 3, 4097);
  EXPECT_GE(int64_t(window.args.num_splits) * window.args.split_size, 4097);
  EXPECT_LT(int64_t(window.args.num_splits - 1) * window.args.split_size, 4097);
  EXPECT_LT(window.args.num_splits, whole.args.num_splits);
  EXPECT_LE(window.args.split_size, 64 * 128);
}

#if __has_include(<cuda.h>)
#include <cuda.h>
#define PAGEDC_HAVE_CUDA_H 1
#endif

// cuLaunchKernelEx takes the runtime's mirror of CUlaunchConfig and
// CUlaunchAttribute (CudaDriver.h): same sizes, same field offsets.
TEST(CudaLaunch, DriverStructsMatchCudaH) {
#ifdef PAGEDC_HAVE_CUDA_H
  EXPECT_EQ(sizeof(cu::LaunchAttribute), sizeof(CUlaunchAttribute));
  EXPECT_EQ(offsetof(cu::LaunchAttribute, value), offsetof(CUlaunchAttribute, value));
  EXPECT_EQ(alignof(cu::LaunchAttribute), alignof(CUlaunchAttribute));
  EXPECT_EQ(sizeof(cu::LaunchConfig), sizeof(CUlaunchConfig));
  EXPECT_EQ(offsetof(cu::LaunchConfig, sharedMemBytes), offsetof(CUlaunchConfig, sharedMemBytes));
  EXPECT_EQ(offsetof(cu::LaunchConfig, stream), offsetof(CUlaunchConfig, hStream));
  EXPECT_EQ(offsetof(cu::LaunchConfig, attrs), offsetof(CUlaunchConfig, attrs));
  EXPECT_EQ(offsetof(cu::LaunchConfig, numAttrs), offsetof(CUlaunchConfig, numAttrs));
  EXPECT_EQ(cu::kLaunchAttributeProgrammaticStreamSerialization,
            int(CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION));
  // Stream capture (CudaDriver::Api::streamBeginCapture, streamIsCapturing).
  EXPECT_EQ(cu::kStreamCaptureModeGlobal, int(CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_EQ(cu::kStreamCaptureModeThreadLocal, int(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  EXPECT_EQ(cu::kStreamCaptureModeRelaxed, int(CU_STREAM_CAPTURE_MODE_RELAXED));
  EXPECT_EQ(cu::kStreamCaptureStatusNone, int(CU_STREAM_CAPTURE_STATUS_NONE));
  EXPECT_EQ(cu::kStreamCaptureStatusActive, int(CU_STREAM_CAPTURE_STATUS_ACTIVE));
  EXPECT_EQ(cu::kStreamCaptureStatusInvalidated, int(CU_STREAM_CAPTURE_STATUS_INVALIDATED));
#else
  GTEST_SKIP() << "no cuda.h (CUDA toolkit) to compare with";
#endif
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
  withLse.lse = test::fakeDevicePointer<float>(0x1000);
  expectError(decode, withLse, "built without lse output");
  PagedcAttentionKernelArgs masked = callArgs(1, 32, 8, 1);
  masked.kv_num_blocks = test::fakeDevicePointer<int32_t>(0x2000);
  masked.kv_indices = test::fakeDevicePointer<int32_t>(0x3000);
  masked.q_block_size = 128;
  masked.kv_block_size = 96;
  masked.mask_batch = masked.mask_heads = masked.num_q_blocks = masked.max_kv_blocks = 1;
  expectError(decode, masked, "kv block size 96 must be a multiple of the kernel's KV tile 64");
  // A kernel built without the block-mask paths would ignore the mask.
  KernelConfig unmasked = decode;
  unmasked.noBlockMask = true;
  masked.kv_block_size = 128;
  EXPECT_NO_THROW(planAttention(decode, masked, {0}, 1024, 132));
  expectError(unmasked, masked, "built for launches without a block mask, and this one binds one");
  EXPECT_NO_THROW(planAttention(unmasked, callArgs(1, 32, 8, 1), {0}, 1024, 132));
  PagedcAttentionKernelArgs noQ = callArgs(1, 32, 8, 1);
  noQ.q = nullptr;
  expectError(decode, noQ, "must all be device pointers");
  // The kernels compute page and row offsets from the page size and head
  // dim: other strides would be read wrong, so they are refused.
  PagedcAttentionKernelArgs paddedRows = callArgs(1, 32, 8, 1);
  paddedRows.v_stride[2] = 136;
  expectError(decode, paddedRows,
              "v_cache has page stride 2048 and row stride 136; the kernels read compact "
              "pages of 16 rows x 128 (strides 2048 and 128)");
  PagedcAttentionKernelArgs otherPages = callArgs(1, 32, 8, 1);
  otherPages.k_stride[1] = 4096;
  expectError(decode, otherPages, "k_cache has page stride 4096 and row stride 128");
  PagedcAttentionKernelArgs oddHeads = callArgs(1, 32, 8, 1);
  oddHeads.k_stride[0] = 2048 * 100 + 4;
  expectError(decode, oddHeads, "k_cache's head stride 204804 must be a multiple of 8");
  PagedcAttentionKernelArgs oneHead = callArgs(1, 4, 1, 1);
  oneHead.k_stride[0] = 3; // never stepped with one KV head
  EXPECT_NO_THROW(planAttention(decode, oneHead, {0}, 1024, 132));
}

TEST(CudaLaunch, BlockMaskBuildDryRun) {
  PagedcBlockMaskKernelArgs args{};
  args.kv_num_blocks = test::fakeDevicePointer<int32_t>(0x1000);
  args.kv_indices = test::fakeDevicePointer<int32_t>(0x2000);
  args.full_kv_num_blocks = test::fakeDevicePointer<int32_t>(0x3000);
  args.full_kv_indices = test::fakeDevicePointer<int32_t>(0x4000);
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
