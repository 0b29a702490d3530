//===- GpuTest.cpp - The CUDA execution path, with and without a GPU ------===//
//
// Without a driver (this CI): every CUDA entry point fails with the driver's
// reason; cubin validation, the pack format and the input generator work.
// With a GPU: flexAttention on CUDA (kernels compiled by NVRTC from the
// hand-written causal test mod) matches the CPU backend on a small prefill
// and decode case; otherwise that test skips and says why.
//
//===----------------------------------------------------------------------===//

#include "GpuCheck.h"
#include "Pack.h"

#include "pagedc/Attention.h"
#include "pagedc/CudaAttention.h"
#include "pagedc/CudaLaunch.h"
#include "pagedc/Error.h"
#include "pagedc/KernelCache.h"
#include "pagedc/Nvrtc.h"
#include "support/CudaTestSupport.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include <unistd.h>

using namespace pagedc;
using namespace pagedc::gpu;

namespace {

std::string errorOf(const std::function<void()> &body) {
  try {
    body();
  } catch (const Error &error) {
    return error.what();
  }
  return "(no error)";
}

bool haveDevice(std::string *why) {
  if (!CudaDriver::available(why))
    return false;
  if (CudaDriver::get().deviceCount() < 1) {
    *why = "the driver reports no CUDA device";
    return false;
  }
  return true;
}

TEST(CudaWithoutDriver, EveryEntryPointSaysWhy) {
  std::string reason;
  if (CudaDriver::available(&reason))
    GTEST_SKIP() << "a CUDA driver is present; this test is for machines without one";
  ASSERT_FALSE(reason.empty());
  EXPECT_NE(errorOf([] { cudaUseDevice(0); }).find(reason), std::string::npos);
  EXPECT_NE(errorOf([] { DeviceBuffer buffer(16, 0); }).find(reason), std::string::npos);
  EXPECT_NE(errorOf([] { cudaKVMemory(0); }).find(reason), std::string::npos);
  EXPECT_NE(errorOf([] { CudaTimer timer(0); }).find(reason), std::string::npos);
  KVCacheConfig config;
  config.numPages = 4;
  config.dtype = DType::BF16;
  config.device = Device::cuda(0);
  const std::string cacheError = errorOf([&] { PagedKVCache cache(config); });
  EXPECT_NE(cacheError.find("KV cache memory on cuda:0 is not available: " + reason),
            std::string::npos)
      << cacheError;
  // flexAttention on a CUDA q: the reason before any validation.
  KVCacheConfig hostConfig;
  hostConfig.numPages = 4;
  PagedKVCache cache(hostConfig);
  uint16_t q[64] = {};
  AttentionOptions options;
  options.kvLength = {0};
  const std::string callError = errorOf([&] {
    flexAttention(TensorView(q, DType::BF16, {1, 1, 1, 64}, Device::cuda(0)), cache, nullptr,
                  CompiledMods{}, Bindings{}, options);
  });
  EXPECT_EQ(callError, "CUDA execution is not available: " + reason);
}

TEST(CudaKernels, ConfigChoiceFromModCodeAndBundles) {
  CompiledMods mods;
  std::string reason;
  const std::string noKernels = errorOf([&] { cudaKernelFor(mods, KernelConfig{}, 0); });
  if (CudaDriver::available(&reason))
    EXPECT_NE(noKernels.find("have no CUDA kernels"), std::string::npos) << noKernels;
  else
    EXPECT_EQ(noKernels, reason);
  mods.cuda.modCode = std::string(embeddedTemplate("testing/causal.cuh"));
  KernelConfig decode = chooseCudaAttentionConfig(mods, DType::BF16, 128, 16, 4, 1, true, "sm_90");
  EXPECT_EQ(decode.kind, KernelKind::Decode);
  EXPECT_EQ(decode.groupSize, 4);
  EXPECT_TRUE(decode.returnLse);
  EXPECT_EQ(decode.paramsSize, 1); // empty Params
  // No block mask: a kernel without the block-mask paths; with one, the
  // kernel that takes it.
  EXPECT_TRUE(decode.noBlockMask);
  EXPECT_FALSE(
      chooseCudaAttentionConfig(mods, DType::BF16, 128, 16, 4, 1, true, "sm_90", 64).noBlockMask);
  EXPECT_FALSE(
      chooseCudaAttentionConfig(mods, DType::BF16, 128, 16, 4, 300, true, "sm_90", 128).noBlockMask);
  EXPECT_EQ(chooseCudaAttentionConfig(mods, DType::F16, 64, 1, 1, 3, false, "sm_90").queryTokens,
            3);
  EXPECT_EQ(chooseCudaAttentionConfig(mods, DType::F16, 64, 1, 1, 9, false, "sm_90").kind,
            KernelKind::Prefill);
  // A bundle with only a prefill module: decode-sized calls use prefill;
  // a missing configuration is an error listing what the bundle has.
  auto bundle = std::make_shared<KernelBundle>();
  BundleModule module;
  module.arch = "sm_90";
  module.mods = "causal";
  module.config.kind = KernelKind::Prefill;
  module.config.pageSize = 16;
  module.config.paramsSize = 1;
  bundle->modules.push_back(module);
  mods.cuda.bundle = bundle;
  mods.cuda.bundleLabel = "causal";
  EXPECT_EQ(chooseCudaAttentionConfig(mods, DType::BF16, 128, 16, 4, 1, false, "sm_90").kind,
            KernelKind::Prefill);
  // The bundle's kernels are what they are: the prefill takes block masks.
  EXPECT_FALSE(
      chooseCudaAttentionConfig(mods, DType::BF16, 128, 16, 4, 1, false, "sm_90").noBlockMask);
  // A decode module built for launches without a block mask serves those
  // alone.
  BundleModule unmasked = module;
  unmasked.config.kind = KernelKind::Decode;
  unmasked.config.groupSize = 4;
  unmasked.config.noBlockMask = true;
  bundle->modules.push_back(unmasked);
  EXPECT_EQ(chooseCudaAttentionConfig(mods, DType::BF16, 128, 16, 4, 1, false, "sm_90").kind,
            KernelKind::Decode);
  EXPECT_EQ(chooseCudaAttentionConfig(mods, DType::BF16, 128, 16, 4, 1, false, "sm_90", 64).kind,
            KernelKind::Prefill);
  bundle->modules.pop_back();
  const std::string missing = errorOf(
      [&] { chooseCudaAttentionConfig(mods, DType::BF16, 128, 128, 4, 1, false, "sm_90"); });
  EXPECT_NE(missing.find("page size 128"), std::string::npos) << missing;
  EXPECT_NE(missing.find("prefill bf16 d128 page16"), std::string::npos) << missing;
}

// At head dim 128 on sm_90 prefill takes 128-key warpgroup tiles, but
// 64-key ones under a block mask whose blocks 128 does not divide (a tile
// must not straddle two blocks); a bundle holding both gives the one that
// divides the blocks.
TEST(CudaKernels, PrefillTileFitsTheBlockMask) {
  // The sm_90 tile at `headDim` under mask blocks of each size: (blockM,
  // blockN) where the widest tile divides the blocks, and where it does not.
  auto expectFits = [](int headDim, std::initializer_list<int> blockSizes, int wideN,
                       int narrowM, int narrowN) {
    KernelConfig chosen;
    chosen.kind = KernelKind::Prefill;
    chosen.headDim = headDim;
    chosen.choosePrefillShapeFor("sm_90");
    ASSERT_EQ(chosen.blockM, 128);
    ASSERT_EQ(chosen.blockN, wideN);
    ASSERT_EQ(chosen.warpRows, 64);
    for (int blocks : blockSizes) {
      KernelConfig fitted = chosen;
      fitted.fitPrefillTileToBlocks(blocks);
      const bool divides = blocks % wideN == 0;
      EXPECT_EQ(fitted.blockM, divides ? 128 : narrowM) << headDim << " " << blocks;
      EXPECT_EQ(fitted.blockN, divides ? wideN : narrowN) << headDim << " " << blocks;
      EXPECT_EQ(fitted.warpRows, 64) << headDim << " " << blocks;
    }
  };
  expectFits(128, {0, 128, 256, 64, 192, 32}, 128, 128, 64);
  // Head dim 256: two warpgroups on 64-key tiles, one on 32-key tiles
  // where 64 does not divide the blocks.
  expectFits(256, {0, 64, 128, 192, 32, 96}, 64, 64, 32);
  KernelConfig wide;
  wide.kind = KernelKind::Prefill;
  wide.headDim = 128;
  wide.choosePrefillShapeFor("sm_90");
  // Asked for by name, it still fits: the call could not run it.
  KernelOptions wideTile;
  wideTile.prefillShape = "128x128x64";
  KernelConfig asked;
  asked.kind = KernelKind::Prefill;
  asked.headDim = 64;
  asked.choosePrefillShapeFor("sm_90a", wideTile);
  EXPECT_EQ(asked.blockN, 128);
  asked.fitPrefillTileToBlocks(64);
  EXPECT_EQ(asked.blockN, 64);
  KernelConfig mma = wide;
  mma.choosePrefillShapeFor("sm_80");
  const KernelConfig before = mma;
  mma.fitPrefillTileToBlocks(64);
  EXPECT_EQ(mma, before);

  // From mod code: the 64-key tile is not checked for spills (no compile).
  CompiledMods mods;
  mods.cuda.modCode = std::string(embeddedTemplate("testing/causal.cuh"));
  const KernelConfig chosen =
      chooseCudaAttentionConfig(mods, DType::BF16, 128, 16, 1, 200, false, "sm_90", 64);
  EXPECT_EQ(chosen.kind, KernelKind::Prefill);
  EXPECT_EQ(chosen.blockN, 64);
  EXPECT_EQ(chosen.warpRows, 64);

  // From a bundle with both tiles, the 64-key one first (the order a pack
  // writes them in when a case under 64-key blocks comes first).
  auto bundle = std::make_shared<KernelBundle>();
  for (int blockN : {64, 128}) {
    BundleModule module;
    module.arch = "sm_90a";
    module.mods = "causal";
    module.config = wide;
    module.config.elementType = DType::BF16;
    module.config.pageSize = 16;
    module.config.paramsSize = 1;
    module.config.blockN = blockN;
    bundle->modules.push_back(module);
  }
  mods.cuda.bundle = bundle;
  mods.cuda.bundleLabel = "causal";
  for (int blocks : {0, 128, 64, 32}) {
    const KernelConfig fromBundle =
        chooseCudaAttentionConfig(mods, DType::BF16, 128, 16, 1, 200, false, "sm_90", blocks);
    // 32-key blocks: neither divides them; the first, which the launch refuses.
    EXPECT_EQ(fromBundle.blockN, blocks == 64 || blocks == 32 ? 64 : 128) << blocks;
  }
}

TEST(CubinValidation, AcceptsNvrtcCubinsAndRejectsDamage) {
  std::string why;
  if (!Nvrtc::available(&why))
    GTEST_SKIP() << "NVRTC is not available: " << why;
  KernelConfig config;
  config.kind = KernelKind::BlockMaskBuilder;
  config.paramsSize = 1;
  KernelCache cache("");
  CompileOptions options;
  options.arch = "sm_90";
  auto kernel = cache.getOrCompile(config, embeddedTemplate("testing/causal.cuh"), options);
  EXPECT_EQ(validateCubin(kernel->image, "sm_90", {"pagedc_build_block_mask"}), "");
  EXPECT_NE(validateCubin(kernel->image, "sm_80", {"pagedc_build_block_mask"}), "");
  EXPECT_NE(validateCubin(kernel->image, "sm_90", {"pagedc_prefill"}).find("no symbol"),
            std::string::npos);
  std::string damaged = kernel->image;
  damaged[18] = 62; // EM_X86_64
  EXPECT_NE(validateCubin(damaged, "sm_90", {}).find("EM_CUDA"), std::string::npos);
  EXPECT_EQ(validateCubin("not an elf at all, but long enough to have a header ........... "
                          "...........",
                          "sm_90", {}),
            "not an ELF file");
}

PackCase smallCase() {
  PackCase c;
  c.name = "unit";
  c.mask = "causal";
  c.label = "unit:causal:";
  c.bundle = "bundles/unit";
  c.kind = KernelKind::Decode;
  c.dtype = DType::F16;
  c.batch = 2;
  c.headsQ = 4;
  c.headsKv = 2;
  c.queryLength = 1;
  c.headDim = 64;
  c.maxKvLength = 70;
  c.kvLength = {70, 33};
  c.qOffset = {69, 32};
  c.batchIdx = {1, 0};
  c.numPages = 12;
  c.pageSize = 16;
  c.maxBatch = 2;
  c.reserves = {{1, 16}, {0, 33}, {1, 70}};
  c.scale = 0.125f;
  c.seed = 42;
  c.params.push_back({ParamDecl{"softcap", ScalarKind::F32, std::nullopt},
                      ParamValue::ofF32(2.5f)});
  c.buffers.push_back({BufferDecl{"slopes", DType::F32, {BufferDim{BufferDim::Named, 0, "H"}}},
                       "buf_slopes.npy"});
  return c;
}

TEST(Pack, InputsAreDeterministicNonZeroAndRounded) {
  PackCase c = smallCase();
  CaseInputs first = generateInputs(c), second = generateInputs(c);
  EXPECT_EQ(first.checksum, second.checksum);
  c.seed = 43;
  EXPECT_NE(generateInputs(c).checksum, first.checksum);
  int64_t zeros = 0;
  for (int64_t i = 0; i < first.k.numel(); ++i) {
    const float value = first.k.dataAs<float>()[i];
    zeros += value == 0.0f;
    EXPECT_EQ(value, halfToFloat(first.k16.dataAs<uint16_t>()[i]));
    EXPECT_GE(value, -1.0f);
    EXPECT_LE(value, 1.0f);
  }
  EXPECT_LT(zeros, first.k.numel() / 100);
  PackRandom random(7);
  for (int i = 0; i < 1000; ++i) {
    const int64_t value = random.integer(3, 5);
    EXPECT_GE(value, 3);
    EXPECT_LE(value, 5);
  }
}

TEST(Pack, JsonRoundTrip) {
  const std::string directory =
      (std::filesystem::temp_directory_path() / ("pagedc-pack-test-" + std::to_string(getpid())))
          .string();
  Pack pack;
  pack.directory = directory;
  pack.created = "now";
  PackCase c = smallCase();
  c.inputChecksum = generateInputs(c).checksum;
  c.returnLse = true;
  c.qBlock = c.kvBlock = 64;
  c.maskReadsB = false;
  pack.cases.push_back(c);
  BenchCase b;
  b.name = "decode-x";
  b.keptFraction = 0.25;
  pack.bench.push_back(b);
  pack.write();
  Pack read = Pack::read(directory);
  std::filesystem::remove_all(directory);
  ASSERT_EQ(read.cases.size(), 1u);
  const PackCase &r = read.cases[0];
  EXPECT_EQ(r.name, c.name);
  EXPECT_EQ(r.kind, c.kind);
  EXPECT_EQ(r.dtype, c.dtype);
  EXPECT_EQ(r.kvLength, c.kvLength);
  EXPECT_EQ(r.qOffset, c.qOffset);
  EXPECT_EQ(r.batchIdx, c.batchIdx);
  EXPECT_EQ(r.reserves, c.reserves);
  EXPECT_EQ(r.seed, c.seed);
  EXPECT_EQ(r.inputChecksum, c.inputChecksum);
  EXPECT_TRUE(r.returnLse);
  EXPECT_FALSE(r.maskReadsB);
  ASSERT_EQ(r.params.size(), 1u);
  EXPECT_EQ(r.params[0].value.f32, 2.5f);
  ASSERT_EQ(r.buffers.size(), 1u);
  EXPECT_EQ(r.buffers[0].decl.dims[0].kind, BufferDim::Named);
  EXPECT_EQ(r.buffers[0].decl.dims[0].name, "H");
  ASSERT_EQ(read.bench.size(), 1u);
  EXPECT_EQ(read.bench[0].keptFraction, 0.25);
  EXPECT_NE(errorOf([&] { Pack::read(directory); }).find("pagedc-gpu-prepare"),
            std::string::npos);
}

//===----------------------------------------------------------------------===//
// CUDA vs CPU on a GPU
//===----------------------------------------------------------------------===//

void causalRow(const PagedcModContext *, int32_t, int32_t, int32_t q, int32_t kvBegin,
               int32_t count, uint8_t *out) {
  for (int32_t i = 0; i < count; ++i)
    out[i] = q >= kvBegin + i;
}

/// Runs a causal GQA call on both backends and compares the outputs.
void compareWithCpu(int queryLength) {
  const int batch = 2, headsKv = 2, headsQ = 8, dim = 128, pageSize = 16;
  const std::vector<int32_t> kvLength = {201, 150};
  std::vector<int32_t> qOffset;
  for (int32_t length : kvLength)
    qOffset.push_back(length - queryLength);
  CompiledMods mods;
  mods.maskName = "causal";
  mods.maskRow = causalRow;
  mods.maskDependence.b = mods.maskDependence.h = false;
  mods.cuda.modCode = std::string(embeddedTemplate("testing/causal.cuh"));

  PackRandom random(2024 + queryLength);
  auto fill = [&](std::vector<uint16_t> &values, size_t count, float range) {
    values.resize(count);
    for (uint16_t &value : values)
      value = floatToBF16(random.uniform(-range, range));
  };
  std::vector<uint16_t> q, k, v;
  const int maxKv = 201;
  fill(q, size_t(batch) * headsQ * queryLength * dim, 2.0f);
  fill(k, size_t(batch) * headsKv * maxKv * dim, 1.0f);
  fill(v, size_t(batch) * headsKv * maxKv * dim, 1.0f);

  auto runOn = [&](Device device) {
    KVCacheConfig config;
    config.numPages = 40;
    config.pageSize = pageSize;
    config.maxBatch = batch;
    config.heads = headsKv;
    config.headDim = config.valueHeadDim = dim;
    config.dtype = DType::BF16;
    config.device = device;
    PagedKVCache cache(config);
    for (int step = 1; step <= 13; ++step) // interleaved tables
      for (int b = 0; b < batch; ++b)
        cache.reserve(b, std::min(kvLength[b], step * pageSize));
    const bool onGpu = device.kind == DeviceKind::CUDA;
    std::unique_ptr<DeviceBuffer> kDev, vDev, qDev, outDev;
    void *kData = k.data(), *vData = v.data(), *qData = q.data();
    if (onGpu) {
      kDev = std::make_unique<DeviceBuffer>(k.size() * 2, device.index);
      vDev = std::make_unique<DeviceBuffer>(v.size() * 2, device.index);
      qDev = std::make_unique<DeviceBuffer>(q.size() * 2, device.index);
      kDev->upload(k.data(), k.size() * 2);
      vDev->upload(v.data(), v.size() * 2);
      qDev->upload(q.data(), q.size() * 2);
      kData = kDev->data();
      vData = vDev->data();
      qData = qDev->data();
    }
    const std::vector<int64_t> strides = {int64_t(headsKv) * maxKv * dim, int64_t(maxKv) * dim,
                                          dim, 1};
    for (int b = 0; b < batch; ++b) {
      int32_t slot = b;
      std::vector<int32_t> positions(static_cast<size_t>(kvLength[b]));
      for (int i = 0; i < kvLength[b]; ++i)
        positions[i] = i;
      const std::vector<int64_t> shape = {1, headsKv, kvLength[b], dim};
      cache.assign(TensorView(&slot, DType::I32, {1}),
                   TensorView(positions.data(), DType::I32, {1, kvLength[b]}),
                   TensorView(static_cast<uint16_t *>(kData) + b * strides[0], DType::BF16, shape,
                              strides, device),
                   TensorView(static_cast<uint16_t *>(vData) + b * strides[0], DType::BF16, shape,
                              strides, device));
    }
    std::vector<uint16_t> out(q.size());
    AttentionOptions options;
    options.kvLength = kvLength;
    options.qOffset = qOffset;
    if (onGpu) {
      outDev = std::make_unique<DeviceBuffer>(out.size() * 2, device.index);
      outDev->fill(0xff);
      options.out = TensorView(outDev->data(), DType::BF16, {batch, headsQ, queryLength, dim},
                               device);
    } else {
      options.out = TensorView(out.data(), DType::BF16, {batch, headsQ, queryLength, dim});
    }
    flexAttention(TensorView(qData, DType::BF16, {batch, headsQ, queryLength, dim}, device),
                  cache, nullptr, mods, Bindings{}, options);
    if (onGpu)
      outDev->download(out.data(), out.size() * 2);
    return out;
  };
  const std::vector<uint16_t> cpu = runOn(Device::cpu());
  const std::vector<uint16_t> gpu = runOn(Device::cuda(0));
  double error = 0, norm = 0;
  int64_t nonFinite = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double a = bf16ToFloat(gpu[i]), b = bf16ToFloat(cpu[i]);
    if (!std::isfinite(a)) {
      ++nonFinite;
      continue;
    }
    error += (a - b) * (a - b);
    norm += b * b;
  }
  EXPECT_EQ(nonFinite, 0) << "unwritten (NaN-poisoned) or non-finite outputs";
  EXPECT_GT(norm, 0.0);
  EXPECT_LE(std::sqrt(error / norm), 1e-2);
}

// bindPrefillTensorMaps with a driver (the emulator's in CI): maps encoded
// for pages of 16 rows and more, and a reason, with the maps left off, for
// everything else. Addresses are never dereferenced.
TEST(CudaKernels, PrefillTensorMapsBindOrSayWhy) {
  std::string why;
  if (!CudaDriver::available(&why))
    GTEST_SKIP() << "no CUDA driver: " << why;
  const CudaDriver &driver = CudaDriver::get();
  if (!driver.api().tensorMapEncodeTiled)
    GTEST_SKIP() << "the driver has no cuTensorMapEncodeTiled";
  KernelConfig config;
  config.blockM = 128;
  config.blockN = 64;
  config.warpRows = 64;
  PagedcAttentionKernelArgs args = test::fakeAttentionArgs(1, 4, 2, 100);
  // [Hkv 2, 10 pages, 16 rows, D 128]
  for (int64_t *stride : {args.k_stride, args.v_stride}) {
    stride[0] = 10 * 16 * 128;
    stride[1] = 16 * 128;
    stride[2] = 128;
  }
  auto planFor = [&](const KernelConfig &c, const PagedcAttentionKernelArgs &a) {
    return planAttention(c, a, std::vector<unsigned char>(4), 100, 132);
  };
  auto maps = [](const AttentionLaunchPlan &plan) {
    PagedcWgmmaPrefillArgs result;
    std::memcpy(&result, plan.launches[0].arguments[2].data(), sizeof(result));
    return result;
  };

  // Pages of 16 rows under the 64-key tile: the run maps too (boxes of 4
  // pages), unless prefill_tma_runs=0.
  AttentionLaunchPlan plan = planFor(config, args);
  EXPECT_EQ(bindPrefillTensorMaps(driver, config, plan, 10, 10), "");
  EXPECT_EQ(plan.launches[0].note, "tensor maps, page runs");
  EXPECT_EQ(maps(plan).tensor_maps, 1);
  EXPECT_EQ(maps(plan).run_boxes, 1);
  // The run map is a different map from the per-page one (its box).
  EXPECT_NE(std::memcmp(maps(plan).k_map, maps(plan).k_run_map, sizeof(maps(plan).k_map)), 0);
  KernelOptions noRuns;
  noRuns.prefillTmaRuns = false;
  AttentionLaunchPlan pagesOnly = planFor(config, args);
  EXPECT_EQ(bindPrefillTensorMaps(driver, config, pagesOnly, 10, 10, noRuns), "");
  EXPECT_EQ(pagesOnly.launches[0].note, "tensor maps");
  EXPECT_EQ(maps(pagesOnly).run_boxes, 0);
  // Pages of the tile's 64 rows: one box a tile already, no run maps.
  KernelConfig whole = config;
  whole.pageSize = 64;
  AttentionLaunchPlan wholePlan = planFor(whole, test::fakeAttentionArgs(1, 4, 2, 100, 64));
  EXPECT_EQ(bindPrefillTensorMaps(driver, whole, wholePlan, 10, 10), "");
  EXPECT_EQ(wholePlan.launches[0].note, "tensor maps");
  EXPECT_EQ(maps(wholePlan).run_boxes, 0);

  KernelConfig small = config;
  small.pageSize = 8;
  AttentionLaunchPlan smallPlan = planFor(small, test::fakeAttentionArgs(1, 4, 2, 100, 8));
  EXPECT_EQ(bindPrefillTensorMaps(driver, small, smallPlan, 20, 20), "pages of 8 rows, under 16");
  EXPECT_EQ(smallPlan.launches[0].note, "gather (pages of 8 rows, under 16)");
  EXPECT_EQ(maps(smallPlan).tensor_maps, 0);

  // (Page and row strides are fixed by planAttention; a head stride of
  // 2^39 elements is 2^40 bytes, past what a tensor map takes.)
  PagedcAttentionKernelArgs odd = args;
  odd.v_stride[0] = int64_t(1) << 39;
  AttentionLaunchPlan oddPlan = planFor(config, odd);
  EXPECT_NE(bindPrefillTensorMaps(driver, config, oddPlan, 10, 10).find("v_cache's stride"),
            std::string::npos);
  EXPECT_EQ(maps(oddPlan).tensor_maps, 0);

  KernelConfig wide = config;
  wide.headDim = 256;
  for (int64_t *stride : {args.k_stride, args.v_stride}) {
    stride[0] = 10 * 16 * 256;
    stride[1] = 16 * 256;
    stride[2] = 256;
  }
  AttentionLaunchPlan widePlan = planFor(wide, args);
  EXPECT_EQ(bindPrefillTensorMaps(driver, wide, widePlan, 10, 10),
            "head dim 256 with two consumer warpgroups");
  for (int64_t *stride : {args.k_stride, args.v_stride}) {
    stride[0] = 10 * 16 * 128;
    stride[1] = 16 * 128;
    stride[2] = 128;
  }

  AttentionLaunchPlan noPages = planFor(config, args);
  EXPECT_EQ(bindPrefillTensorMaps(driver, config, noPages, 0, 10), "k_cache has 0 pages");

  KernelConfig mma; // the mma.sync prefill takes no maps
  AttentionLaunchPlan mmaPlan = planFor(mma, args);
  EXPECT_EQ(bindPrefillTensorMaps(driver, mma, mmaPlan, 10, 10), "not the warpgroup prefill");
  EXPECT_EQ(mmaPlan.launches[0].arguments.size(), 2u);
}

// bindDecodeTensorMaps: the decode plan carries its maps off (zeros) until
// bound; code for sm_90 and later (and the emulator's) with head dims of
// 128 and more and pages of 16 rows and more gets them, anything else a
// reason and the gather.
TEST(CudaKernels, DecodeTensorMapsBindOrSayWhy) {
  std::string why;
  if (!CudaDriver::available(&why))
    GTEST_SKIP() << "no CUDA driver: " << why;
  const CudaDriver &driver = CudaDriver::get();
  if (!driver.api().tensorMapEncodeTiled)
    GTEST_SKIP() << "the driver has no cuTensorMapEncodeTiled";
  KernelConfig config;
  config.kind = KernelKind::Decode;
  config.groupSize = 4;
  config.queryTokens = 1;
  // Compact [Hkv 2, pages, 16 rows, D 128] caches (fakeAttentionArgs); the
  // maps take 70 pages.
  PagedcAttentionKernelArgs args = test::fakeAttentionArgs(1, 8, 2, 1);
  auto planFor = [&](const KernelConfig &c, const PagedcAttentionKernelArgs &a) {
    return planAttention(c, a, std::vector<unsigned char>(4), 1000, 132);
  };
  auto maps = [](const AttentionLaunchPlan &plan) {
    PagedcDecodeMapArgs result;
    EXPECT_EQ(plan.launches[0].arguments.size(), 3u);
    EXPECT_EQ(plan.launches[0].arguments[2].size(), sizeof(result));
    std::memcpy(&result, plan.launches[0].arguments[2].data(), sizeof(result));
    return result;
  };

  AttentionLaunchPlan plan = planFor(config, args);
  EXPECT_EQ(plan.launches[0].kernel, "pagedc_decode");
  EXPECT_EQ(plan.launches[0].note, "gather (tensor maps not bound)");
  EXPECT_EQ(maps(plan).tensor_maps, 0);
  EXPECT_EQ(bindDecodeTensorMaps(driver, config, "sm_90", plan, 70, 70), "");
  EXPECT_EQ(plan.launches[0].note, "tensor maps, page runs");
  EXPECT_EQ(maps(plan).tensor_maps, 1);
  EXPECT_EQ(maps(plan).run_boxes, 1);
  // Encoded: the maps are no longer zeros, and a run map is not a page map.
  const PagedcDecodeMapArgs bound = maps(plan);
  bool kSet = false, vSet = false, runSet = false;
  for (int i = 0; i < 16; ++i) {
    kSet = kSet || bound.k_map[i] != 0;
    vSet = vSet || bound.v_map[i] != 0;
    runSet = runSet || bound.k_run_map[i] != 0;
  }
  EXPECT_TRUE(kSet && vSet && runSet);
  EXPECT_NE(std::memcmp(bound.k_map, bound.k_run_map, sizeof(bound.k_map)), 0);
  KernelOptions noRuns;
  noRuns.decodeTmaRuns = false;
  AttentionLaunchPlan pagesOnly = planFor(config, args);
  EXPECT_EQ(bindDecodeTensorMaps(driver, config, "sm_90", pagesOnly, 70, 70, noRuns), "");
  EXPECT_EQ(pagesOnly.launches[0].note, "tensor maps");
  EXPECT_EQ(maps(pagesOnly).run_boxes, 0);

  AttentionLaunchPlan ampere = planFor(config, args);
  EXPECT_EQ(bindDecodeTensorMaps(driver, config, "sm_80", ampere, 70, 70),
            "sm_80 has no bulk tensor copy");
  EXPECT_EQ(ampere.launches[0].note, "gather (sm_80 has no bulk tensor copy)");
  EXPECT_EQ(maps(ampere).tensor_maps, 0);

  KernelConfig small = config;
  small.pageSize = 8;
  AttentionLaunchPlan smallPlan = planFor(small, test::fakeAttentionArgs(1, 8, 2, 1, 8));
  EXPECT_EQ(bindDecodeTensorMaps(driver, small, "sm_90", smallPlan, 140, 140),
            "pages of 8 rows, under 16");
  EXPECT_EQ(maps(smallPlan).tensor_maps, 0);

  KernelConfig narrow = config;
  narrow.headDim = 64;
  AttentionLaunchPlan narrowPlan = planFor(narrow, test::fakeAttentionArgs(1, 8, 2, 1, 16, 64));
  EXPECT_EQ(bindDecodeTensorMaps(driver, narrow, "sm_90", narrowPlan, 70, 70),
            "head dim 64, under 128");
  EXPECT_EQ(maps(narrowPlan).tensor_maps, 0);

  AttentionLaunchPlan noPages = planFor(config, args);
  EXPECT_EQ(bindDecodeTensorMaps(driver, config, "sm_90", noPages, 70, 0), "v_cache has 0 pages");
  EXPECT_EQ(maps(noPages).tensor_maps, 0);

  KernelConfig prefill; // not the decode kernel
  AttentionLaunchPlan prefillPlan = planFor(prefill, args);
  EXPECT_EQ(bindDecodeTensorMaps(driver, prefill, "sm_90", prefillPlan, 70, 70),
            "not the decode kernel");
}

TEST(CudaVsCpu, CausalGqaDecodeAndPrefill) {
  std::string why;
  if (!haveDevice(&why))
    GTEST_SKIP() << "no CUDA device: " << why;
  compareWithCpu(1);
  compareWithCpu(77);
}

// The warpgroup prefill (causal, bf16, D 128, 128 x 64 tiles, shuffled
// 16-row pages, 200 query rows: not a multiple of the tile) against a float64
// reference, `runs` enqueues of one launch object. out's rows lie
// `outRowStride` elements apart, starting `outOffset` elements into the
// buffer; every element outside the rows must keep its NaN poison.
void checkWarpgroupPrefill(bool persistent, int64_t outRowStride, int64_t outOffset, int runs) {
  const int batch = 2, headsQ = 4, headsKv = 2, dim = 128, pageSize = 16, length = 200;
  KernelOptions options;
  options.prefillShape = "128x64x64";
  options.prefillPersistent = persistent;
  if (persistent)
    options.prefillPersistentCtas = 3;
  const int pagesPerSequence = (length + pageSize - 1) / pageSize, pages = batch * pagesPerSequence;
  CompiledMods mods;
  mods.maskName = "causal";
  mods.maskRow = causalRow;
  mods.maskDependence.b = mods.maskDependence.h = false;
  mods.cuda.modCode = std::string(embeddedTemplate("testing/causal.cuh"));
  const KernelConfig config =
      chooseCudaAttentionConfig(mods, DType::BF16, dim, pageSize, headsQ / headsKv, length,
                                false, cudaDeviceInfo(0).arch(), 0, options);
  ASSERT_EQ(config.warpRows, 64) << "not the warpgroup prefill";
  std::shared_ptr<const CudaKernel> kernel = cudaKernelFor(mods, config, 0);

  PackRandom random(31);
  auto values = [&](size_t count) {
    std::vector<uint16_t> result(count);
    for (uint16_t &value : result)
      value = floatToBF16(random.uniform(-1.5f, 1.5f));
    return result;
  };
  const std::vector<uint16_t> q = values(size_t(batch) * headsQ * length * dim);
  const std::vector<uint16_t> k = values(size_t(headsKv) * pages * pageSize * dim);
  const std::vector<uint16_t> v = values(k.size());
  // Sequence b's logical page p is physical page table[b * pagesPerSequence + p]: shuffled.
  std::vector<int32_t> ints(static_cast<size_t>(pages));
  for (int i = 0; i < pages; ++i)
    ints[i] = i;
  for (int i = pages - 1; i > 0; --i)
    std::swap(ints[i], ints[static_cast<int>(random.uniform(0.0f, 1.0f) * (i + 1)) % (i + 1)]);
  const std::vector<int32_t> table = ints;
  ints.insert(ints.end(), {length, length, 0, 0}); // kv_len, q_offset
  const size_t outElements = size_t(outOffset) + size_t(batch) * headsQ * length * outRowStride;
  DeviceBuffer qDev(q.size() * 2, 0), kDev(k.size() * 2, 0), vDev(v.size() * 2, 0),
      outDev(outElements * 2, 0), intsDev(ints.size() * 4, 0);
  qDev.upload(q.data(), qDev.size());
  kDev.upload(k.data(), kDev.size());
  vDev.upload(v.data(), vDev.size());
  intsDev.upload(ints.data(), intsDev.size());

  PagedcAttentionKernelArgs args{};
  args.q = qDev.data();
  args.k_cache = kDev.data();
  args.v_cache = vDev.data();
  args.out = static_cast<uint16_t *>(outDev.data()) + outOffset;
  args.page_table = static_cast<const int32_t *>(intsDev.data());
  args.kv_len = args.page_table + pages;
  args.q_offset = args.kv_len + batch;
  const int64_t qStrides[3] = {int64_t(headsQ) * length * dim, int64_t(length) * dim, dim};
  const int64_t outStrides[3] = {int64_t(headsQ) * length * outRowStride,
                                 int64_t(length) * outRowStride, outRowStride};
  const int64_t kvStrides[3] = {int64_t(pages) * pageSize * dim, int64_t(pageSize) * dim, dim};
  for (int d = 0; d < 3; ++d) {
    args.q_stride[d] = qStrides[d];
    args.out_stride[d] = outStrides[d];
    args.k_stride[d] = args.v_stride[d] = kvStrides[d];
  }
  args.page_table_stride = pagesPerSequence;
  args.batch = batch;
  args.heads_q = headsQ;
  args.heads_kv = headsKv;
  args.q_len = length;
  args.scale = 1.0f / std::sqrt(float(dim));
  args.mask_batch = args.mask_heads = 1;
  PagedcModContext noContext{nullptr, nullptr};
  CudaAttentionLaunch launch(
      kernel, args,
      ParamsLayout::forDeclarations(mods.params, mods.buffers)
          .pack(mods.params, mods.buffers, noContext),
      length, -1, options);
  const std::string note = launch.applyLaunchOptions(pages, pages, /*visitsGrow=*/true);
  if (persistent)
    EXPECT_NE(note.find("persistent (3 CTAs), tile counter"), std::string::npos) << note;
  else
    EXPECT_EQ(note.find("persistent"), std::string::npos) << note;

  // The float64 reference.
  std::vector<double> reference(q.size());
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < headsQ; ++h)
      for (int i = 0; i < length; ++i) {
        const uint16_t *qRow = &q[((size_t(b) * headsQ + h) * length + i) * dim];
        std::vector<double> scores(size_t(i) + 1);
        double top = -INFINITY, sum = 0;
        auto row = [&](const std::vector<uint16_t> &cache, int j) {
          const int page = table[size_t(b) * pagesPerSequence + j / pageSize];
          return &cache[((size_t(h / (headsQ / headsKv)) * pages + page) * pageSize +
                         j % pageSize) *
                        dim];
        };
        for (int j = 0; j <= i; ++j) {
          const uint16_t *kRow = row(k, j);
          double dot = 0;
          for (int d = 0; d < dim; ++d)
            dot += double(bf16ToFloat(qRow[d])) * bf16ToFloat(kRow[d]);
          scores[j] = dot * args.scale;
          top = std::max(top, scores[j]);
        }
        double *outRow = &reference[((size_t(b) * headsQ + h) * length + i) * dim];
        for (int j = 0; j <= i; ++j) {
          const double weight = std::exp(scores[j] - top);
          sum += weight;
          const uint16_t *vRow = row(v, j);
          for (int d = 0; d < dim; ++d)
            outRow[d] += weight * bf16ToFloat(vRow[d]);
        }
        for (int d = 0; d < dim; ++d)
          outRow[d] /= sum;
      }

  const CudaDriver &driver = cudaUseDevice(0);
  for (int run = 0; run < runs; ++run) {
    outDev.fill(0xff); // NaN: a tile left out stays NaN
    launch.enqueue(nullptr);
    driver.check(driver.api().ctxSynchronize(), "cuCtxSynchronize");
    std::vector<uint16_t> out(outElements);
    outDev.download(out.data(), out.size() * 2);
    double error = 0, norm = 0;
    int64_t nonFinite = 0, written = 0;
    for (size_t e = 0; e < out.size(); ++e) {
      const bool inRow = e >= size_t(outOffset) && (e - outOffset) % outRowStride < size_t(dim);
      if (!inRow) {
        written += out[e] != 0xffff;
        continue;
      }
      const size_t i = (e - outOffset) / outRowStride * dim + (e - outOffset) % outRowStride;
      const double a = bf16ToFloat(out[e]);
      if (!std::isfinite(a)) {
        ++nonFinite;
        continue;
      }
      error += (a - reference[i]) * (a - reference[i]);
      norm += reference[i] * reference[i];
    }
    EXPECT_EQ(nonFinite, 0) << "launch " << run << ": tiles left out (NaN-poisoned)";
    EXPECT_EQ(written, 0) << "launch " << run << ": elements written outside out's rows";
    EXPECT_LE(std::sqrt(error / norm), 1e-2) << "launch " << run;
  }
}

// Persistent CTAs taking their query tiles from a work counter: one launch
// object enqueued three times (as `pagedc-gpu bench` does) must compute
// every tile each time, so each launch has to leave the counter at zero
// for the next.
TEST(CudaVsCpu, PersistentPrefillRelaunchedTakesEveryTile) {
  std::string why;
  if (!haveDevice(&why))
    GTEST_SKIP() << "no CUDA device: " << why;
  checkWarpgroupPrefill(true, 128, 0, 3);
}

// The epilogue stages O through shared memory and stores 16-byte chunks
// where out's rows are 16-byte aligned (rows 136 elements apart here), and
// stores pairs from the accumulators where they are not (the runtime asks
// only 4 bytes: rows 130 elements apart, 2 elements into the buffer).
TEST(CudaVsCpu, WarpgroupPrefillStoresPaddedAndUnalignedOut) {
  std::string why;
  if (!haveDevice(&why))
    GTEST_SKIP() << "no CUDA device: " << why;
  checkWarpgroupPrefill(false, 128, 0, 1);
  checkWarpgroupPrefill(false, 136, 0, 1);
  checkWarpgroupPrefill(false, 130, 2, 1);
}

} // namespace
