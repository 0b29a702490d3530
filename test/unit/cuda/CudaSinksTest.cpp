//===- CudaSinksTest.cpp - Attention sinks in every CUDA kernel, emulated -===//
//
// Attention sinks (AttentionOptions::sinks, BatchRunOptions::sinks: one
// logit per query head, a key with a zero value) through the runtime's CUDA
// path on the SIMT emulator with every checker on: the decode kernel with
// one split (the sink in its epilogue) and with several (the sink once, in
// the merge), 3-token decode, the mma.sync prefill, the warpgroup prefill
// (sm_90a) and BatchAttention's packed kernels in a mixed step, against the
// float64 reference with the sinks applied in float64 (SinkReference.h):
// f16 and bf16, GQA 1 and 4, batch 2, shuffled pages, lengths off the page
// and tile grids, fully masked rows ("holes"), sinks above every score,
// negligible ones and ones of the scores' size, out and lse compared; the
// packed kernels over 8-bit caches. And a captured step replayed after the
// sinks' values change in place. And flexAttention's kernels with linked
// mods (kernel option link_mods), which pass the Params and rows through
// the link's opaque bytes, and link_mods=first's switch to the inlined
// kernel once its background compile is done.
//
//===----------------------------------------------------------------------===//
#include "EmulatorEnvironment.h"
#include "BatchStep.h"
#include "DeviceStep.h"
#include "SinkReference.h"
#include "TestMods.h"

#include "cpu/Reference.h"
#include "cuda/CudaAttention.h"
#include "cuda/CudaGraph.h"
#include "pagedc/BatchAttention.h"
#include "pagedc/CudaAttention.h"
#include "pagedc/CudaDriver.h"
#include "pagedc/EmulatorBuild.h"
#include "pagedc/KernelCache.h"
#include "pagedc/Error.h"

#include <fmt/format.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace {

using namespace pagedc;
using testutil::BatchSeq;
using testutil::BatchStep;
using testutil::BatchStepCase;

/// Per query head, in turn: far above every score (the row's weights all
/// but vanish; a fully masked row's lse is the sink), negligible, and two
/// of the scores' own size (the sink takes a real share of the row).
std::vector<float> sinkValues(int64_t heads) {
  const float pattern[] = {16.0f, -40.0f, 3.0f, 0.5f};
  std::vector<float> sinks(static_cast<size_t>(heads));
  for (int64_t h = 0; h < heads; ++h)
    sinks[h] = pattern[h % 4];
  return sinks;
}

struct Counts {
  int64_t rows = 0, maskedRows = 0, outViolations = 0, lseViolations = 0, nonFinite = 0;
  double maxOutError = 0, maxLseError = 0;
  bool ok() const { return outViolations == 0 && lseViolations == 0 && nonFinite == 0; }
  std::string describe() const {
    return fmt::format("{} rows ({} fully masked): {} out and {} lse violations, {} not finite; "
                       "max errors out {:.3g}, lse {:.3g}",
                       rows, maskedRows, outViolations, lseViolations, nonFinite, maxOutError,
                       maxLseError);
  }
  /// One row: expected (float64, sinks applied) against actual.
  template <typename Actual>
  void row(const double *expected, double expectedLse, int64_t width, Actual actualAt,
           float actualLse, double range) {
    ++rows;
    for (int64_t d = 0; d < width; ++d) {
      const double actual = actualAt(d);
      if (!std::isfinite(actual)) {
        ++nonFinite;
        continue;
      }
      const double error = std::abs(actual - expected[d]);
      maxOutError = std::max(maxOutError, error);
      // f16 / bf16 probabilities and outputs, ex2.approx (as AttentionCheck).
      outViolations += error > 1e-2 * range + std::ldexp(std::abs(expected[d]), -7);
    }
    if (!std::isfinite(actualLse)) {
      ++nonFinite;
      return;
    }
    const double error = std::abs(actualLse - expectedLse);
    maxLseError = std::max(maxLseError, error);
    lseViolations += error > 1e-2 * std::max(1.0, std::abs(expectedLse));
  }
};

//===--- flexAttention's kernels --------------------------------------------===//

struct FlexCase {
  const char *name;
  int64_t qLength;
  std::vector<int32_t> kvLengths;
  int gqa;
  DType dtype;
  int32_t pageSize;
  int64_t dim;
  const char *mask;
  const char *score;
  KernelOptions options;
};

KernelOptions withSplitFactor(int factor) {
  KernelOptions options;
  options.decodeSplitFactor = factor;
  return options;
}
KernelOptions withPrefillShape(const char *shape) {
  KernelOptions options;
  options.prefillShape = shape;
  return options;
}

HostTensor randomTensor(DType type, std::vector<int64_t> shape, float range, std::mt19937 &rng) {
  HostTensor tensor(type, std::move(shape));
  for (int64_t i = 0; i < tensor.numel(); ++i)
    testutil::storeAs(tensor, i, range * testutil::randomValue(rng));
  return tensor;
}

/// Runs one case through cuda::pagedAttention with device-resident sinks
/// and compares with the float64 reference, sinks applied.
/// `prepare`, when given, adjusts the case's mods before the call (e.g. to
/// a kernel bundle of them).
Counts runFlexCase(const FlexCase &c, uint64_t seed,
                   const std::function<void(CompiledMods &)> &prepare = {}) {
  const Device device = Device::cuda(0);
  const int64_t batch = static_cast<int64_t>(c.kvLengths.size());
  const int64_t kvHeads = c.gqa == 1 ? 4 : 1, qHeads = kvHeads * c.gqa;
  const float range = 2.0f;
  int32_t capacity = 1;
  std::vector<int32_t> qOffsets;
  for (int32_t length : c.kvLengths) {
    capacity = std::max(capacity, length);
    qOffsets.push_back(std::max<int32_t>(0, length - static_cast<int32_t>(c.qLength)));
  }
  std::mt19937 rng(static_cast<uint32_t>(seed));
  HostTensor q = randomTensor(c.dtype, {batch, qHeads, c.qLength, c.dim}, range, rng);
  HostTensor k = randomTensor(c.dtype, {batch, kvHeads, capacity, c.dim}, range, rng);
  HostTensor v = randomTensor(c.dtype, {batch, kvHeads, capacity, c.dim}, range, rng);
  cpu::PagedCache cache =
      cpu::buildPagedCache(k.view(), v.view(), c.kvLengths.data(), c.pageSize, c.dtype, seed);
  CompiledMods mods = testutil::makeTestMods(c.mask, c.score);
  if (prepare)
    prepare(mods);
  testutil::TestBindings bindings(batch, qHeads, capacity + c.qLength, seed);
  const std::vector<float> sinks = sinkValues(qHeads);

  std::vector<std::unique_ptr<DeviceBuffer>> buffers;
  auto upload = [&](const void *data, size_t bytes) {
    buffers.push_back(std::make_unique<DeviceBuffer>(std::max<size_t>(bytes, 4), 0));
    buffers.back()->upload(data, bytes);
    return buffers.back()->data();
  };
  auto uploadView = [&](const TensorView &view) {
    const size_t bytes = static_cast<size_t>(view.numel()) * dtypeSize(view.dtype());
    return TensorView(upload(view.data(), bytes), view.dtype(), view.shape(), view.strides(),
                      device);
  };
  // The mods' buffers (documents, slopes) in device memory.
  PagedcModContext context = *bindings.context();
  std::vector<PagedcBufferRef> refs;
  for (size_t i = 0; i < mods.buffers.size(); ++i) {
    PagedcBufferRef ref = bindings.context()->buffers[i];
    int64_t numel = 1;
    for (size_t d = 0; d < mods.buffers[i].dims.size(); ++d)
      numel *= ref.sizes[d];
    ref.data = upload(ref.data, static_cast<size_t>(std::max<int64_t>(numel, 1)) *
                                    dtypeSize(mods.buffers[i].elementType));
    refs.push_back(ref);
  }
  context.buffers = refs.data();

  DeviceBuffer out(static_cast<size_t>(batch * qHeads * c.qLength * c.dim) * dtypeSize(c.dtype), 0);
  DeviceBuffer lse(static_cast<size_t>(batch * qHeads * c.qLength) * 4, 0);
  out.fill(0xff);
  lse.fill(0xff);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.dim));
  cpu::PagedAttentionArgs args;
  args.q = uploadView(q.view());
  args.kCache = uploadView(cache.kCache.view());
  args.vCache = uploadView(cache.vCache.view());
  args.pageTable = cache.pageTable.data();
  args.pageTableStride = cache.pageTableStride;
  args.pageSize = cache.pageSize;
  args.kvLength = c.kvLengths.data();
  args.qOffset = qOffsets.data();
  args.mods = &mods;
  args.context = &context;
  args.scale = scale;
  args.out = TensorView(out.data(), c.dtype, {batch, qHeads, c.qLength, c.dim}, device);
  args.lse = TensorView(lse.data(), DType::F32, {batch, qHeads, c.qLength}, device);
  args.sinks = TensorView(upload(sinks.data(), sinks.size() * 4), DType::F32, {qHeads}, device);
  cuda::pagedAttention(args, device, nullptr, c.options);
  HostTensor hostOut(c.dtype, {batch, qHeads, c.qLength, c.dim});
  out.download(hostOut.data(), out.size());
  std::vector<float> hostLse(static_cast<size_t>(batch * qHeads * c.qLength));
  lse.download(hostLse.data(), lse.size());

  cpu::ReferenceArgs ref;
  ref.q = q.view();
  ref.k = k.view();
  ref.v = v.view();
  ref.kvLength = c.kvLengths.data();
  ref.qOffset = qOffsets.data();
  ref.mods = &mods;
  ref.context = bindings.context();
  ref.scale = scale;
  cpu::ReferenceResult reference = cpu::referenceAttention(ref);
  Counts counts;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < qHeads; ++h)
      for (int64_t i = 0; i < c.qLength; ++i) {
        const int64_t row = (b * qHeads + h) * c.qLength + i;
        double expectedLse = reference.lse[row];
        counts.maskedRows += std::isinf(expectedLse);
        double *expected = &reference.out[row * c.dim];
        testutil::applySink(sinks[h], expectedLse, expected, c.dim);
        counts.row(
            expected, expectedLse, c.dim,
            [&](int64_t d) { return cpu::readAsDouble(hostOut.view(), row * c.dim + d); },
            hostLse[row], range);
      }
  return counts;
}

void expectFlexCases(const std::vector<FlexCase> &cases,
                     const std::function<void(CompiledMods &)> &prepare = {}) {
  uint64_t seed = 500;
  for (const FlexCase &c : cases) {
    const std::string label =
        fmt::format("{}: q {} kv [{}, {}] gqa {} {} page {} d {} mask '{}' score '{}'", c.name,
                    c.qLength, c.kvLengths[0], c.kvLengths[1], c.gqa, dtypeName(c.dtype),
                    c.pageSize, c.dim, c.mask, c.score);
    try {
      const Counts counts = runFlexCase(c, ++seed, prepare);
      EXPECT_TRUE(counts.ok()) << label << ": " << counts.describe();
      if (std::string(c.mask) == "holes") {
        EXPECT_GT(counts.maskedRows, 0) << label;
      }
    } catch (const Error &error) {
      ADD_FAILURE() << label << ": " << error.what();
    }
  }
}

/// One split: the decode kernel's epilogue folds the sink in.
TEST(CudaSinks, DecodeOneSplit) {
  expectFlexCases({
      {"decode", 1, {45, 83}, 4, DType::BF16, 16, 64, "holes", "", withSplitFactor(1)},
      {"decode", 1, {77, 30}, 1, DType::F16, 1, 128, "holes", "softcap", withSplitFactor(1)},
  });
}

/// Several splits: the partials leave the sink out; the merge adds it once.
TEST(CudaSinks, DecodeSplitsAndMerge) {
  expectFlexCases({
      {"split-decode", 1, {333, 701}, 4, DType::F16, 16, 64, "holes", "alibi", withSplitFactor(8)},
      {"split-decode", 1, {701, 333}, 1, DType::BF16, 128, 128, "holes", "", withSplitFactor(8)},
  });
}

/// Three query tokens per sequence (speculative decoding), one split.
TEST(CudaSinks, ThreeTokenDecode) {
  const KernelOptions oneSplit = withSplitFactor(1);
  expectFlexCases({
      {"3-token-decode", 3, {29, 150}, 4, DType::BF16, 16, 64, "holes", "alibi", oneSplit},
      {"3-token-decode", 3, {150, 29}, 1, DType::F16, 1, 64, "holes", "", oneSplit},
  });
}

/// The mma.sync prefill (64 x 64 tiles, 16 rows a warp).
TEST(CudaSinks, MmaPrefill) {
  const KernelOptions mma = withPrefillShape("64x64x16");
  expectFlexCases({
      {"mma-prefill", 37, {45, 83}, 4, DType::BF16, 16, 64, "holes", "alibi", mma},
      {"mma-prefill", 37, {83, 45}, 1, DType::F16, 1, 96, "holes", "softcap", mma},
  });
}

/// The warpgroup prefill (sm_90a, the emulator's target): 128 x 64 tiles.
TEST(CudaSinks, WarpgroupPrefill) {
  const KernelOptions warpgroup = withPrefillShape("128x64x64");
  expectFlexCases({
      {"wgmma-prefill", 150, {300, 170}, 4, DType::F16, 16, 128, "holes", "", warpgroup},
      {"wgmma-prefill", 150, {170, 300}, 1, DType::BF16, 16, 64, "holes", "alibi", warpgroup},
  });
}

/// Linked mods: the kernels calling the mods through linkedModHooks (the
/// launch pads the Params to the kernel's room), decode split and merged
/// and the mma.sync prefill.
TEST(CudaSinks, LinkedMods) {
  KernelOptions linked = withSplitFactor(8);
  linked.linkMods = ModLinking::Linked;
  KernelOptions linkedPrefill = withPrefillShape("64x64x16");
  linkedPrefill.linkMods = ModLinking::Linked;
  const size_t loadedBefore = cudaLoadedKernelConfigs().size();
  expectFlexCases({
      {"linked-decode", 1, {333, 701}, 4, DType::F16, 16, 64, "holes", "alibi", linked},
      {"linked-prefill", 37, {45, 83}, 4, DType::BF16, 16, 64, "holes", "softcap", linkedPrefill},
  });
  const std::vector<KernelConfig> loaded = cudaLoadedKernelConfigs();
  ASSERT_EQ(loaded.size(), loadedBefore + 2);
  EXPECT_TRUE(loaded[loadedBefore].linkedMods && loaded[loadedBefore + 1].linkedMods);
  EXPECT_EQ(loaded[loadedBefore].paramsSize % 64, 0); // the Params' room
}

/// link_mods=first: a shape's first variant runs its inlined kernel (its
/// linked kernel would wait for the shape's kernel unit, as long a
/// compile), and the shape's unit is built after it; a later variant runs
/// the linked kernel while its inlined one compiles in the background,
/// then that, and the calls after it load nothing more.
TEST(CudaSinks, LinkedModsFirstThenInlined) {
  KernelOptions first = withSplitFactor(2);
  first.linkMods = ModLinking::LinkedFirst;
  auto kernelsNow = [] { return cudaLoadedKernelConfigs(); };
  const size_t before = kernelsNow().size();
  const FlexCase shapeFirst{"linked-first-1", 1, {150, 37}, 4, DType::BF16, 16, 64, "holes",
                            "softcap", first};
  expectFlexCases({shapeFirst});
  std::vector<KernelConfig> loaded = kernelsNow();
  ASSERT_EQ(loaded.size(), before + 1);
  EXPECT_FALSE(loaded.back().linkedMods);
  EXPECT_EQ(loaded.back().kind, KernelKind::Decode);
  cudaWaitForBackgroundCompiles();
  expectFlexCases({shapeFirst});
  EXPECT_EQ(kernelsNow().size(), before + 1);

  const FlexCase later{"linked-first-2", 1, {150, 37}, 4, DType::BF16, 16, 64, "holes", "alibi",
                       first};
  expectFlexCases({later});
  loaded = kernelsNow();
  ASSERT_EQ(loaded.size(), before + 2);
  const KernelConfig linked = loaded.back();
  EXPECT_TRUE(linked.linkedMods);
  // Once the background compile is done, the next call takes the inlined
  // kernel. (Waiting for it, not for a wall-clock bound: on a loaded
  // machine the compile may take longer than any bound a test would pick.)
  cudaWaitForBackgroundCompiles();
  expectFlexCases({later});
  loaded = kernelsNow();
  ASSERT_EQ(loaded.size(), before + 3)
      << "the call after the background compile did not take the inlined kernel";
  EXPECT_FALSE(loaded.back().linkedMods);
  EXPECT_EQ(loaded.back().kind, KernelKind::Decode);
  // The Params as packed, not the linked kernel's room for them.
  EXPECT_EQ(linkedParamsCapacity(loaded.back().paramsSize), linked.paramsSize);
  EXPECT_NE(loaded.back().paramsSize, linked.paramsSize);
  expectFlexCases({later});
  EXPECT_EQ(kernelsNow().size(), before + 3);
}

/// A bundle holds the kernels it was built with: one whose decode module
/// links its mods serves link_mods=first calls as it is, with nothing
/// compiled in the background, call after call.
TEST(CudaSinks, LinkedBundleUnderLinkedFirst) {
  KernelOptions first = withSplitFactor(2);
  first.linkMods = ModLinking::LinkedFirst;
  const FlexCase c{"linked-bundle", 1, {150, 37}, 4, DType::F16, 16, 64, "holes", "softcap",
                   first};
  std::shared_ptr<KernelBundle> bundle; // one for both calls
  auto toBundle = [&](CompiledMods &mods) {
    mods.cuda.bundleLabel = "holes+softcap";
    if (bundle) {
      mods.cuda.bundle = bundle;
      return;
    }
    KernelOptions linked = first;
    linked.linkMods = ModLinking::Linked;
    const std::string arch(kEmulatorArch);
    const KernelConfig config =
        chooseCudaAttentionConfig(mods, c.dtype, 64, c.pageSize, c.gqa, 1, true, arch, 0, linked);
    ASSERT_TRUE(config.linkedMods);
    ASSERT_EQ(config.kind, KernelKind::Decode);
    const auto compiled = KernelCache::global().getOrCompile(config, mods.cuda.modCode,
                                                             cudaCompileOptions(config, arch));
    BundleModule module;
    module.arch = arch;
    module.mods = mods.cuda.bundleLabel;
    module.config = config;
    module.kernelNames = compiled->kernelNames;
    module.image = compiled->image;
    bundle = std::make_shared<KernelBundle>();
    bundle->modules.push_back(module);
    mods.cuda.bundle = bundle;
  };
  const size_t before = cudaLoadedKernelConfigs().size();
  expectFlexCases({c}, toBundle);
  cudaWaitForBackgroundCompiles();
  expectFlexCases({c}, toBundle);
  const std::vector<KernelConfig> loaded = cudaLoadedKernelConfigs();
  ASSERT_EQ(loaded.size(), before + 1);
  EXPECT_TRUE(loaded.back().linkedMods);
}

//===--- BatchAttention's packed kernels ------------------------------------===//

BatchAttentionConfig cudaConfig(const BatchStep &step) {
  BatchAttentionConfig config = step.config();
  config.device = Device::cuda(0);
  config.dtype = step.c.storage;
  config.kvDtype = step.c.kvFloat8;
  return config;
}

/// out [T', Hq, Dv] and lse [T', Hq] (host) against the step's float64
/// reference with `sinks` applied (as BatchStep::compare, sinks added).
Counts compareStep(const BatchStep &step, const TensorView &out, const TensorView &lse,
                   const std::vector<float> &sinks) {
  const BatchStepCase &c = step.c;
  Counts counts;
  for (int64_t b = 0; b < step.batch; ++b) {
    const int64_t qLen = c.seqs[b].qLen;
    if (qLen == 0)
      continue;
    Bindings one = step.bindings->bindings;
    one.buffers["doc"] =
        TensorView(const_cast<int32_t *>(step.bindings->documents.data()) + b * step.maxKv,
                   DType::I32, {1, step.maxKv});
    ResolvedBindings resolved = resolveBindings(step.mods, one, Device::cpu());
    auto rows = [&](const HostTensor &t, int64_t heads, int64_t length, int64_t width) {
      return TensorView(const_cast<double *>(t.dataAs<double>()) + b * heads * length * width,
                        DType::F64, {1, heads, &t == &step.q4 ? qLen : length, width},
                        {heads * length * width, length * width, width, 1}, Device::cpu());
    };
    cpu::ReferenceArgs ref;
    ref.q = rows(step.q4, c.qHeads, step.maxQ, c.dim);
    ref.k = rows(step.k4, c.kvHeads, step.maxKv, c.dim);
    ref.v = rows(step.v4, c.kvHeads, step.maxKv, c.vDim);
    ref.kvLength = &step.kvLength[b];
    ref.qOffset = &step.qOffset[b];
    ref.mods = &step.mods;
    ref.context = &resolved.context();
    ref.scale = 1.0 / std::sqrt(static_cast<double>(c.dim));
    cpu::ReferenceResult reference = cpu::referenceAttention(ref);
    for (int64_t i = 0; i < qLen; ++i)
      for (int64_t h = 0; h < c.qHeads; ++h) {
        const int64_t row = step.queryStartLoc[b] + i;
        double expectedLse = reference.lseAt(0, h, i);
        counts.maskedRows += std::isinf(expectedLse);
        double *expected = &reference.out[(h * qLen + i) * c.vDim];
        testutil::applySink(sinks[h], expectedLse, expected, c.vDim);
        counts.row(
            expected, expectedLse, c.vDim,
            [&](int64_t d) {
              return cpu::readAsDouble(out,
                                       row * out.stride(0) + h * out.stride(1) + d * out.stride(2));
            },
            lse.dataAs<float>()[row * lse.stride(0) + h * lse.stride(1)], 1.0);
      }
  }
  return counts;
}

/// A step's tensors on the device (DeviceStep) and the sinks.
struct SinkDeviceStep : test::DeviceStep {
  DeviceBuffer sinks;
  TensorView sinksView;

  SinkDeviceStep(BatchStep &step, const std::vector<float> &sinkValues) : DeviceStep(step) {
    sinks = DeviceBuffer(sinkValues.size() * 4, 0);
    sinks.upload(sinkValues.data(), sinkValues.size() * 4);
    sinksView = TensorView(sinks.data(), DType::F32, {step.c.qHeads}, Device::cuda(0));
  }
};

/// A mixed step: decode, speculative rows (3, 8 tokens: the decode
/// kernel), a 37-token chunk and a whole prompt (prefill tiles), a
/// sequence with no new tokens; lengths off the page and tile grids.
BatchStepCase mixedCase(int64_t qHeads, int64_t kvHeads, DType storage, int32_t pageSize,
                        uint64_t seed) {
  BatchStepCase c;
  c.seqs = {{1, 150}, {3, 77}, {0, 40}, {37, 300}, {8, 129}, {61, 61}, {1, 9}};
  c.qHeads = qHeads;
  c.kvHeads = kvHeads;
  c.dim = c.vDim = 64;
  c.pageSize = pageSize;
  c.layout = KVLayout::NHD;
  c.storage = storage;
  c.mask = "holes";
  c.score = "alibi";
  c.seed = seed;
  return c;
}

Counts runStep(const BatchStepCase &c, BatchPlanShape *shape = nullptr) {
  BatchStep step(c);
  BatchAttention attention(step.mods, cudaConfig(step));
  step.plan(attention);
  if (shape)
    *shape = attention.planShape();
  const std::vector<float> sinks = sinkValues(c.qHeads);
  SinkDeviceStep device(step, sinks);
  BatchRunOptions options;
  options.out = device.outView;
  options.lse = device.lseView;
  options.sinks = device.sinksView;
  options.kScale = step.kScale;
  options.vScale = step.vScale;
  attention.run(device.qView, device.kView, device.vView, device.bindings, options);
  auto [out, lse] = device.results();
  return compareStep(step, out.view(), lse.view(), sinks);
}

/// The packed prefill tiles and decode CTAs of a mixed step, GQA 1 and 4,
/// f16 and bf16, pages of 1 and 16 slots.
TEST(CudaSinks, BatchAttentionMixedStep) {
  uint64_t seed = 600;
  for (const auto &[qHeads, kvHeads, storage, pageSize] :
       {std::tuple{int64_t(4), int64_t(1), DType::BF16, 16},
        std::tuple{int64_t(4), int64_t(4), DType::F16, 1}}) {
    SCOPED_TRACE(
        fmt::format("Hq {} Hkv {} {} page {}", qHeads, kvHeads, dtypeName(storage), pageSize));
    const Counts counts = runStep(mixedCase(qHeads, kvHeads, storage, pageSize, ++seed));
    EXPECT_TRUE(counts.ok()) << counts.describe();
    EXPECT_GT(counts.maskedRows, 0);
  }
}

/// Long decode contexts: the packed decode's splits and their merge.
TEST(CudaSinks, BatchAttentionSplitDecode) {
  BatchStepCase c = mixedCase(4, 1, DType::F16, 16, 650);
  c.seqs = {{1, 1900}, {6, 1337}, {0, 500}, {3, 30}, {40, 900}};
  BatchPlanShape shape;
  const Counts counts = runStep(c, &shape);
  EXPECT_TRUE(counts.ok()) << counts.describe();
  EXPECT_GT(counts.maskedRows, 0);
  EXPECT_GT(shape.decodeSplits, 1);
}

/// An 8-bit cache (f8e4m3 with bf16 q, f8e5m2 with f16 q, per-head
/// scales): the packed prefill tiles, the GQA-packed tiles, the decode
/// CTAs and, over long contexts, the split decode's and GQA-packed tiles'
/// merges fold the sinks into rows of dequantized values.
TEST(CudaSinks, BatchAttentionFloat8Cache) {
  uint64_t seed = 680;
  for (const auto &[kvType, storage, splits] : {std::tuple{DType::F8E4M3, DType::BF16, false},
                                                std::tuple{DType::F8E5M2, DType::F16, true}}) {
    BatchStepCase c = mixedCase(8, 2, storage, 16, ++seed);
    c.kvFloat8 = kvType;
    if (splits)
      c.seqs = {{1, 1900}, {6, 1337}, {0, 500}, {3, 30}, {40, 900}};
    SCOPED_TRACE(fmt::format("{} q {}", dtypeName(kvType), dtypeName(storage)));
    BatchPlanShape shape;
    const Counts counts = runStep(c, &shape);
    EXPECT_TRUE(counts.ok()) << counts.describe();
    EXPECT_GT(counts.maskedRows, 0);
    EXPECT_GT(shape.prefillTiles + shape.groupTiles, 0);
    EXPECT_EQ(shape.decodeSplits > 1, splits);
    // (40 tokens over 900 keys: the GQA-packed tiles, split, the sinks
    // joining in their merge.)
    EXPECT_EQ(shape.groupSplits > 1, splits);
  }
}

/// A step captured into a CUDA graph reads the sinks where they are at
/// replay: new values written into the same tensor take effect.
TEST(CudaSinks, CapturedStepReadsSinksInPlace) {
  const BatchStepCase c = mixedCase(4, 1, DType::BF16, 16, 700);
  BatchStep step(c);
  BatchAttention attention(step.mods, cudaConfig(step));
  step.plan(attention);
  std::vector<float> sinks = sinkValues(c.qHeads);
  SinkDeviceStep device(step, sinks);
  const CudaDriver &driver = CudaDriver::get();
  ASSERT_TRUE(cudaGraphsAvailable(driver));
  cu::Stream stream = nullptr;
  driver.check(driver.api().streamCreate(&stream, 0), "cuStreamCreate");
  BatchRunOptions options;
  options.out = device.outView;
  options.lse = device.lseView;
  options.sinks = device.sinksView;
  options.stream = stream;
  CudaGraphExec graph = captureGraph(driver, stream, [&] {
    attention.run(device.qView, device.kView, device.vView, device.bindings, options);
  });
  for (int replay = 0; replay < 2; ++replay) {
    // The second replay: the heads' sinks rotated, in place.
    if (replay == 1) {
      std::rotate(sinks.begin(), sinks.begin() + 1, sinks.end());
      device.sinks.upload(sinks.data(), sinks.size() * 4);
    }
    device.out.fill(0xff);
    device.lse.fill(0xff);
    graph.launch(stream);
    driver.check(driver.api().streamSynchronize(stream), "cuStreamSynchronize");
    auto [out, lse] = device.results();
    const Counts counts = compareStep(step, out.view(), lse.view(), sinks);
    EXPECT_TRUE(counts.ok()) << "replay " << replay << ": " << counts.describe();
  }
  driver.check(driver.api().streamDestroy(stream), "cuStreamDestroy");
}

/// Sinks the kernels cannot read in place are refused before any launch.
TEST(CudaSinks, Refusals) {
  const BatchStepCase c = mixedCase(4, 1, DType::BF16, 16, 710);
  BatchStep step(c);
  BatchAttention attention(step.mods, cudaConfig(step));
  step.plan(attention);
  const std::vector<float> sinks = sinkValues(c.qHeads);
  SinkDeviceStep device(step, sinks);
  std::vector<float> hostSinks = sinks;
  const struct {
    TensorView sinks;
    const char *message;
  } refusals[] = {
      {TensorView(device.sinks.data(), DType::F32, {2}, Device::cuda(0)), "must be [Hq] = [4]"},
      {TensorView(device.sinks.data(), DType::BF16, {4}, Device::cuda(0)), "but must be f32"},
      {TensorView(hostSinks.data(), DType::F32, {4}), "is on cpu but the call runs on"},
  };
  for (const auto &refusal : refusals) {
    BatchRunOptions options;
    options.out = device.outView;
    options.lse = device.lseView;
    options.sinks = refusal.sinks;
    try {
      attention.run(device.qView, device.kView, device.vView, device.bindings, options);
      ADD_FAILURE() << "sinks not refused: " << refusal.message;
    } catch (const Error &error) {
      EXPECT_NE(std::string(error.what()).find(refusal.message), std::string::npos) << error.what();
    }
  }
}

} // namespace
