//===- CudaBatchAttentionTest.cpp - BatchAttention's CUDA backend ---------===//
//
// BatchAttention on a CUDA device, run on the SIMT emulator
// (PAGEDC_CUDA_DRIVER=emu) with every checker on (memcheck, racecheck,
// initcheck, synccheck: a report fails the launch and so the case), against
// the float64 reference of the CPU tests (cpu/BatchStep.h): mixed steps
// (decode, speculative verification, chunks of 37 and 300 tokens at the
// end of longer contexts, whole prompts, sequences with no new tokens),
// every cache layout as views of one device allocation that the kernel
// reads in place, shuffled pages of 1, 16, 64 and 128 slots, GQA 1, 4 and
// 8, head dims 64, 96, 128, 192 and 256, bf16 and f16, per-sequence
// document and prefix-LM masks (their data in buffers), fully masked rows,
// lse, split-KV decode; 8-bit float caches (f8e4m3, f8e5m2, as such or u8
// through kv_dtype) against the reference on the dequantized values, and
// each run's own scales; key ranges (kv_start, kv_end) and cascade levels
// (token maps) merged on the device, and the global bytes a cascade reads
// (the emulator's counters); MLA decode (D 576, Dv 512, V a view of the
// latent K cache; templates/MlaDecode.cuh) split and unsplit, with sinks;
// a constant window's keys bounded by plan() with the mask's classifier
// (the keys read, on the counters); and the CUDA path's refusals. The extended
// tier adds a 1000-token chunk and head dim 256 on pages of 128.
//
//===----------------------------------------------------------------------===//
#include "EmulatorEnvironment.h"
#include "BatchStep.h"
#include "DeviceStep.h"
#include "TestMods.h"

#include "cpu/Reference.h"
#include "pagedc/BatchAttention.h"
#include "pagedc/CudaAttention.h"
#include "pagedc/Error.h"
#include "cuda/CudaGraph.h"
#include "pagedc/CudaDriver.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace pagedc;
using testutil::BatchSeq;
using testutil::BatchStep;
using testutil::BatchStepCase;
using testutil::BatchStepCheck;
using test::DeviceStep;

/// `outType`: out's element type (default: q's).
BatchAttentionConfig cudaConfig(const BatchStep &step,
                                std::optional<DType> outType = std::nullopt) {
  BatchAttentionConfig config = step.config();
  config.device = Device::cuda(0);
  config.dtype = step.c.storage;
  config.kvDtype = step.c.kvFloat8;
  config.outDtype = outType;
  return config;
}

/// The GQA-packed kernel's rows per CTA for case `c`
/// (KernelConfig::chooseGroupRowsShape): 8 warps of 32 rows up to head dim
/// 128, of 16 above and over 8-bit caches at 128.
int64_t groupTileRows(const BatchStepCase &c) {
  return c.dim <= 128 && !(c.kvFloat8 && c.dim > 112) ? 256 : 128;
}

/// Runs a step on the emulated device and compares it with the float64
/// reference; also checks that the kernels read the engine's cache in
/// place and that the plan sent sequences of 1 to 8 new tokens to the
/// decode kernel, longer ones with 4 keys read per token or more to the
/// GQA-packed tiles (tokens x group rows) and the others to 64-row prefill
/// tiles. `shape` receives the plan's shape.
BatchStepCheck checkOnDevice(const BatchStepCase &c, BatchPlanShape *shape = nullptr,
                             std::optional<DType> outType = std::nullopt,
                             HostTensor *outCopy = nullptr) {
  BatchStep step(c);
  BatchAttention attention(step.mods, cudaConfig(step, outType));
  step.plan(attention);
  int64_t decodeSequences = 0, prefillTiles = 0, groupTiles = 0;
  const int64_t rows = groupTileRows(c), group = c.qHeads / c.kvHeads;
  for (size_t b = 0; b < c.seqs.size(); ++b) {
    const BatchSeq &s = c.seqs[b];
    // The keys the plan reads: from the tile holding the sequence's first.
    const int64_t keys = s.seqLen - attention.keyBegin(static_cast<int64_t>(b)) / 64 * 64;
    decodeSequences += s.qLen >= 1 && s.qLen <= 8;
    if (s.qLen > 8 && keys >= 4 * s.qLen)
      groupTiles += (s.qLen * group + rows - 1) / rows;
    else if (s.qLen > 8)
      prefillTiles += (s.qLen + 63) / 64;
  }
  const BatchPlanShape planned = attention.planShape();
  EXPECT_EQ(planned.decodeSequences, decodeSequences);
  EXPECT_EQ(planned.prefillTiles, prefillTiles);
  EXPECT_EQ(planned.groupTiles, groupTiles);
  EXPECT_EQ(planned.groupSplits > 0, groupTiles > 0);
  EXPECT_EQ(planned.decodeSplits > 0, decodeSequences > 0);
  if (shape)
    *shape = planned;
  DeviceStep device(step, outType);
  AttentionResult result =
      attention.run(device.qView, device.kView, device.vView, device.bindings, device.options());
  EXPECT_EQ(result.out.data(), device.outView.data());
  if (step.tokens > 0) {
    EXPECT_EQ(attention.kernelCacheAddresses().first, device.kernelK);
    EXPECT_EQ(attention.kernelCacheAddresses().second, device.kernelV);
  }
  auto [out, lse] = device.results();
  BatchStepCheck check = step.compare(out.view(), lse.view(), /*cudaTolerance=*/true);
  EXPECT_EQ(check.rowsPastWritten, 0) << check.describe();
  if (outCopy)
    *outCopy = std::move(out);
  return check;
}

#define EXPECT_STEP_MATCHES(check)                                                                 \
  EXPECT_EQ((check).outViolations + (check).lseViolations + (check).nonFinite, 0)                  \
      << (check).describe()

/// Decode, speculative verification (2, 5, 8 tokens: the decode kernel; 9
/// goes to prefill tiles), a 37-token chunk at the end of a 300-key
/// context, whole prompts (seq_lens == q_len), no new tokens; lengths off
/// the page and tile grids.
std::vector<BatchSeq> mixedStep() {
  return {{1, 150}, {5, 77},  {0, 40}, {37, 300}, {1, 1},
          {61, 61}, {8, 129}, {9, 45}, {2, 33},   {0, 0}};
}

const KVLayout kLayouts[] = {KVLayout::Pagedc, KVLayout::NHD, KVLayout::HND, KVLayout::VLLM};

/// The mixed step in bf16, NHD pages of 16, GQA 4, D 64, a document mask.
BatchStepCase mixedDocumentCase(uint64_t seed) {
  BatchStepCase c;
  c.seqs = mixedStep();
  c.qHeads = 4;
  c.kvHeads = 1;
  c.dim = c.vDim = 64;
  c.pageSize = 16;
  c.layout = KVLayout::NHD;
  c.storage = DType::BF16;
  c.mask = "document";
  c.seed = seed;
  return c;
}

TEST(CudaBatchAttention, MixedStepDocumentMaskNHD) {
  const BatchStepCase c = mixedDocumentCase(3);
  BatchStepCheck check = checkOnDevice(c);
  EXPECT_STEP_MATCHES(check);
}

/// A fixed window over long contexts (the "window" test mask: the 100
/// keys ending at each query, with a block classifier): plan() starts each
/// sequence at its window's 64-key granule, so the decode of 3,000 keys
/// reads 120 of them, and each 64-row tile of a 400-token prompt its own
/// window (from key 0, 64, ..., 256), and the kernels still match the
/// reference;
/// a mask that keeps nothing leaves its sequences empty key ranges, whose
/// rows are 0 with lse -inf.
TEST(CudaBatchAttention, ClassifiedWindowReadsOnlyItsKeys) {
  BatchStepCase c;
  c.seqs = {{1, 3000}, {3, 700}, {37, 300}, {61, 61}, {0, 40}, {12, 530}, {400, 400}};
  c.qHeads = 8;
  c.kvHeads = 2;
  c.dim = c.vDim = 64;
  c.pageSize = 16;
  c.layout = KVLayout::NHD;
  c.storage = DType::BF16;
  c.mask = "window";
  c.score = "softcap";
  c.seed = 61;
  {
    BatchStep step(c);
    BatchAttention attention(step.mods, cudaConfig(step));
    step.plan(attention);
    const int32_t expected[] = {2880, 576, 128, 0, 0, 384, 0};
    for (size_t b = 0; b < c.seqs.size(); ++b)
      EXPECT_EQ(attention.keyBegin(b), expected[b]) << "sequence " << b;
  }
  BatchStepCheck check = checkOnDevice(c);
  EXPECT_STEP_MATCHES(check);
  c.mask = "never";
  c.score = "";
  check = checkOnDevice(c);
  EXPECT_STEP_MATCHES(check);
}

TEST(CudaBatchAttention, MixedStepEveryLayout) {
  uint64_t seed = 20;
  for (KVLayout layout : kLayouts)
    for (int64_t groups : {1, 4}) {
      BatchStepCase c;
      c.seqs = mixedStep();
      c.kvHeads = groups == 1 ? 2 : 1;
      c.qHeads = c.kvHeads * groups;
      c.dim = c.vDim = 64;
      c.pageSize = 16;
      c.layout = layout;
      c.storage = DType::BF16;
      c.mask = "document";
      c.seed = ++seed;
      SCOPED_TRACE(std::string(kvLayoutName(layout)) + " GQA " + std::to_string(groups));
      BatchStepCheck check = checkOnDevice(c);
      EXPECT_STEP_MATCHES(check);
    }
}

TEST(CudaBatchAttention, PageSizesHeadDimsAndMaskedRows) {
  struct Shape {
    int32_t pageSize;
    int64_t qHeads, kvHeads, dim;
    KVLayout layout;
    DType storage;
    const char *mask, *score;
  };
  // "holes" masks every row with (q + h) % 3 == 0 entirely.
  const Shape shapes[] = {
      {1, 2, 2, 128, KVLayout::HND, DType::F16, "holes", "alibi"},
      {64, 4, 1, 64, KVLayout::VLLM, DType::BF16, "causal", "softcap"},
      {16, 4, 1, 256, KVLayout::Pagedc, DType::F16, "causal", ""},
      // Head dims that are not powers of two: tile rows wider than the data.
      {16, 4, 1, 96, KVLayout::NHD, DType::BF16, "holes", "softcap"},
      {1, 2, 2, 192, KVLayout::HND, DType::F16, "causal", "alibi"},
  };
  uint64_t seed = 40;
  for (const Shape &shape : shapes) {
    BatchStepCase c;
    c.seqs = {{1, 70}, {3, 66}, {37, 130}, {0, 9}, {20, 20}};
    c.pageSize = shape.pageSize;
    c.qHeads = shape.qHeads;
    c.kvHeads = shape.kvHeads;
    c.dim = c.vDim = shape.dim;
    c.layout = shape.layout;
    c.storage = shape.storage;
    c.mask = shape.mask;
    c.score = shape.score;
    c.seed = ++seed;
    SCOPED_TRACE("page " + std::to_string(shape.pageSize) + " D " + std::to_string(shape.dim) +
                 " " + kvLayoutName(shape.layout) + " " + dtypeName(shape.storage));
    BatchStepCheck check = checkOnDevice(c);
    EXPECT_STEP_MATCHES(check);
    if (std::string(shape.mask) == "holes") {
      EXPECT_GT(check.maskedRows, 0) << check.describe();
    }
  }
}

/// Long decode contexts with few sequences: the keys are split and the
/// merge launch combines the parts (decode and speculative rows, GQA 4).
TEST(CudaBatchAttention, SplitKvDecodeAndMerge) {
  BatchStepCase c;
  c.seqs = {{1, 1900}, {6, 1337}, {0, 500}, {3, 30}, {40, 900}};
  c.qHeads = 4;
  c.kvHeads = 1;
  c.dim = c.vDim = 128;
  c.pageSize = 16;
  c.layout = KVLayout::HND;
  c.storage = DType::F16;
  c.mask = "document";
  c.score = "softcap";
  c.seed = 77;
  BatchPlanShape shape;
  BatchStepCheck check = checkOnDevice(c, &shape);
  EXPECT_STEP_MATCHES(check);
  EXPECT_GT(shape.decodeSplits, 1);
}

/// 8-bit float caches (f8e4m3, f8e5m2) read by both packed kernels,
/// against the float64 reference on the dequantized values (code x scale):
/// the mixed step with fully masked rows, per-head scales that differ, bf16
/// and f16 q; a u8 cache of vLLM's layout read through kv_dtype with one
/// scale for every head, long decode contexts (split keys and the merge);
/// head dim 256 (the prefill's 32-key tiles) on pages of one slot; head
/// dims 80 and 112 (code rows of 5 and 7 16-byte chunks).
TEST(CudaBatchAttention, Float8CachesMixedStep) {
  struct Float8Case {
    DType kvType, qType;
    KVLayout layout;
    int32_t pageSize;
    int64_t qHeads, kvHeads, dim;
    bool perHead, asU8;
    const char *mask, *score;
    std::vector<BatchSeq> seqs;
  };
  const Float8Case cases[] = {
      {DType::F8E4M3, DType::BF16, KVLayout::NHD, 16, 8, 2, 64, true, false, "holes", "alibi",
       {{1, 150}, {3, 77}, {0, 40}, {37, 300}, {61, 61}, {5, 33}, {1, 17}}},
      {DType::F8E5M2, DType::F16, KVLayout::VLLM, 16, 4, 1, 128, false, true, "causal",
       "softcap", {{1, 1900}, {3, 1337}, {37, 300}, {40, 40}, {0, 9}}},
      {DType::F8E5M2, DType::BF16, KVLayout::Pagedc, 1, 4, 1, 256, true, false, "holes", "",
       {{1, 70}, {3, 66}, {37, 130}, {20, 20}}},
      // Code rows that are not multiples of 64 bytes (5 and 7 chunks of 16).
      {DType::F8E4M3, DType::F16, KVLayout::HND, 128, 8, 2, 80, true, false, "holes", "softcap",
       {{1, 1300}, {3, 77}, {37, 300}, {20, 20}, {0, 9}}},
      {DType::F8E5M2, DType::BF16, KVLayout::NHD, 1, 2, 2, 112, false, false, "causal", "alibi",
       {{1, 150}, {5, 77}, {45, 130}}},
  };
  uint64_t seed = 300;
  for (const Float8Case &f : cases) {
    BatchStepCase c;
    c.seqs = f.seqs;
    c.kvFloat8 = f.kvType;
    c.storage = f.qType;
    c.layout = f.layout;
    c.pageSize = f.pageSize;
    c.qHeads = f.qHeads;
    c.kvHeads = f.kvHeads;
    c.dim = c.vDim = f.dim;
    c.perHeadScale = f.perHead;
    c.asU8 = f.asU8;
    c.mask = f.mask;
    c.score = f.score;
    c.seed = ++seed;
    SCOPED_TRACE(fmt::format("{} q {} {} page {} D {} GQA {}{}", dtypeName(f.kvType),
                             dtypeName(f.qType), kvLayoutName(f.layout), f.pageSize, f.dim,
                             f.qHeads / f.kvHeads, f.asU8 ? " u8" : ""));
    BatchPlanShape shape;
    BatchStepCheck check = checkOnDevice(c, &shape);
    EXPECT_STEP_MATCHES(check);
    if (std::string(f.mask) == "holes") {
      EXPECT_GT(check.maskedRows, 0) << check.describe();
    }
    if (f.seqs[0].seqLen > 1000)
      EXPECT_GT(shape.decodeSplits, 1);
  }
}

/// The kernels read the scales run() is given, each call its own: one
/// BatchAttention run with V's scales doubled gives twice the output (the
/// same codes), and run again with the first scales gives the first
/// result bit for bit.
TEST(CudaBatchAttention, Float8ScalesAreEachRunsOwn) {
  BatchStepCase c = mixedDocumentCase(330);
  c.seqs = {{1, 150}, {5, 77}, {37, 100}};
  c.kvFloat8 = DType::F8E4M3;
  c.qHeads = 8;
  c.kvHeads = 2;
  BatchStep step(c);
  BatchAttention attention(step.mods, cudaConfig(step));
  step.plan(attention);
  DeviceStep device(step);
  auto runWith = [&](const std::vector<float> &vScale) {
    BatchRunOptions options = device.options();
    options.vScale = vScale;
    device.out.fill(0xff);
    device.lse.fill(0xff);
    attention.run(device.qView, device.kView, device.vView, device.bindings, options);
    return device.results();
  };
  std::vector<float> doubled = device.vScale;
  for (float &scale : doubled)
    scale *= 2.0f;
  auto [firstOut, firstLse] = runWith(device.vScale);
  auto [doubledOut, doubledLse] = runWith(doubled);
  auto [againOut, againLse] = runWith(device.vScale);
  EXPECT_STEP_MATCHES(step.compare(firstOut.view(), firstLse.view(), /*cudaTolerance=*/true));
  int64_t changed = 0;
  for (int64_t i = 0; i < step.tokens * c.qHeads * c.vDim; ++i) {
    const double first = cpu::readAsDouble(firstOut.view(), i);
    const double twice = cpu::readAsDouble(doubledOut.view(), i);
    // (A power of two: the rounded output doubles exactly.)
    EXPECT_EQ(twice, 2.0 * first) << i;
    changed += twice != first;
    EXPECT_EQ(cpu::readAsDouble(againOut.view(), i), first) << i;
  }
  EXPECT_GT(changed, 0);
  EXPECT_EQ(std::memcmp(firstLse.data(), doubledLse.data(), step.tokens * c.qHeads * 4), 0);
}

/// An f32 out (BatchAttentionConfig::outDtype): the prefill tiles, the
/// decode CTAs, and the split decode's merge store the f32 values they
/// hold, not values rounded to q's type (some differ from their bf16 or
/// f16 rounding); with a 16-bit cache (bf16 q, split decode at head dim
/// 128) and an 8-bit one (f16 q, head dim 64, fully masked rows).
TEST(CudaBatchAttention, F32Output) {
  BatchStepCase split = mixedDocumentCase(350);
  split.seqs = {{1, 1900}, {6, 1337}, {0, 500}, {3, 30}, {40, 900}};
  split.dim = split.vDim = 128;
  split.layout = KVLayout::HND;
  BatchStepCase float8 = mixedDocumentCase(351);
  float8.kvFloat8 = DType::F8E4M3;
  float8.storage = DType::F16;
  float8.qHeads = 8;
  float8.kvHeads = 2;
  float8.mask = "holes";
  for (const BatchStepCase &c : {split, float8}) {
    SCOPED_TRACE(
        fmt::format("q {} D {}{}", dtypeName(c.storage), c.dim, c.kvFloat8 ? " f8e4m3 cache" : ""));
    BatchPlanShape shape;
    HostTensor out;
    BatchStepCheck check = checkOnDevice(c, &shape, DType::F32, &out);
    EXPECT_STEP_MATCHES(check);
    ASSERT_EQ(out.dtype(), DType::F32);
    int64_t unrounded = 0;
    for (int64_t i = 0; i < out.numel(); ++i) {
      const float value = out.dataAs<float>()[i];
      unrounded += std::isfinite(value) && testutil::roundTo(c.storage, value) != value;
    }
    EXPECT_GT(unrounded, out.numel() / 2);
    if (c.mask == "holes") {
      EXPECT_GT(check.maskedRows, 0) << check.describe();
    } else {
      EXPECT_GT(shape.decodeSplits, 1);
    }
  }
}

/// The 8-bit configuration's refusals, each naming the argument; nothing
/// is written.
TEST(CudaBatchAttention, Float8Refusals) {
  BatchStepCase c = mixedDocumentCase(340);
  c.seqs = {{3, 20}, {1, 9}, {12, 40}};
  c.kvFloat8 = DType::F8E4M3;
  BatchStep step(c);
  auto errorOf = [](auto call) {
    try {
      call();
    } catch (const Error &error) {
      return std::string(error.what());
    }
    return std::string("(no error)");
  };
  auto expectError = [&](auto call, const std::string &needle) {
    const std::string message = errorOf(call);
    EXPECT_NE(message.find(needle), std::string::npos)
        << "message: " << message << "\nexpected: " << needle;
  };
  BatchAttentionConfig config = cudaConfig(step);
  config.kvDtype = DType::BF16;
  expectError([&] { BatchAttention refused(step.mods, config); },
              "kv_dtype must be an 8-bit float type (f8e4m3, f8e5m2) or unset");
  config = cudaConfig(step, DType::F16);
  expectError([&] { BatchAttention refused(step.mods, config); },
              "out_dtype on CUDA must be f32, bf16 (dtype) or unset but is f16");

  BatchAttention float8(step.mods, cudaConfig(step));
  step.plan(float8);
  DeviceStep device(step);
  const Device cuda = Device::cuda(0);
  BatchRunOptions options = device.options();
  // Caches of the other format, of 16-bit values, u8 without kv_dtype.
  TensorView e5m2K(device.kView.data(), DType::F8E5M2, device.kView.shape(),
                   device.kView.strides(), cuda);
  TensorView e5m2V(device.vView.data(), DType::F8E5M2, device.vView.shape(),
                   device.vView.strides(), cuda);
  expectError([&] { float8.run(device.qView, e5m2K, e5m2V, device.bindings, options); },
              "k_cache stores f8e5m2, but the CUDA kernels were built for f8e4m3 caches "
              "(kv_dtype)");
  TensorView u8K(device.kView.data(), DType::U8, device.kView.shape(), device.kView.strides(),
                 cuda);
  TensorView u8V(device.vView.data(), DType::U8, device.vView.shape(), device.vView.strides(),
                 cuda);
  BatchRunOptions noScales = options;
  noScales.kScale.clear();
  noScales.vScale.clear();
  expectError([&] { float8.run(device.qView, u8K, u8V, device.bindings, noScales); },
              "k_cache stores u8, but the CUDA kernels were built for f8e4m3 caches");
  expectError([&] { float8.run(device.qView, device.kView, device.vView, device.bindings,
                               noScales); },
              "an f8e4m3 cache needs k_scale");
  // Slots 8 codes apart: a 16-byte copy holds 16.
  std::vector<int64_t> oddStrides = device.kView.strides();
  oddStrides[1] = 8;
  TensorView oddK(device.kView.data(), DType::F8E4M3, device.kView.shape(), oddStrides, cuda);
  expectError([&] { float8.run(device.qView, oddK, device.vView, device.bindings, options); },
              "k_cache's stride 8 in dimension 1 is not a multiple of 16 elements");
  // A 16-bit BatchAttention given the 8-bit cache.
  BatchStepCase plain = c;
  plain.kvFloat8.reset();
  BatchStep plainStep(plain);
  BatchAttention sixteen(plainStep.mods, cudaConfig(plainStep));
  plainStep.plan(sixteen);
  expectError([&] { sixteen.run(device.qView, device.kView, device.vView, device.bindings,
                                options); },
              "k_cache stores f8e4m3, but the CUDA kernels were built for bf16 caches (dtype; "
              "kv_dtype f8e4m3 or f8e5m2 in the configuration builds them for 8-bit caches)");
  // An f32-out BatchAttention given a bf16 out.
  BatchAttention f32Out(step.mods, cudaConfig(step, DType::F32));
  step.plan(f32Out);
  expectError(
      [&] { f32Out.run(device.qView, device.kView, device.vView, device.bindings, options); },
      "out is bf16 but must be f32 (the configured out_dtype) on CUDA");
  auto [out, lse] = device.results();
  for (int64_t i = 0; i < lse.numel(); ++i)
    EXPECT_TRUE(std::isnan(lse.dataAs<float>()[i])) << i;
}

/// A step of no tokens launches nothing and writes nothing.
TEST(CudaBatchAttention, EmptyStepAndRefusals) {
  BatchStepCase c;
  c.seqs = {{0, 5}, {0, 0}};
  c.qHeads = 4;
  c.kvHeads = 1;
  c.dim = c.vDim = 64;
  c.storage = DType::BF16;
  c.mask = "document";
  BatchStepCheck empty = checkOnDevice(c);
  EXPECT_EQ(empty.rows, 0);

  c.seqs = {{3, 20}, {1, 9}};
  BatchStep step(c);
  BatchAttention attention(step.mods, cudaConfig(step));
  step.plan(attention);
  DeviceStep device(step);
  auto expectError = [&](auto call, const std::string &needle) {
    try {
      call();
      ADD_FAILURE() << "no error; expected one naming '" << needle << "'";
    } catch (const Error &error) {
      EXPECT_NE(std::string(error.what()).find(needle), std::string::npos)
          << "message: " << error.what() << "\nexpected: " << needle;
    }
  };
  BatchRunOptions options;
  options.out = device.outView;
  options.lse = device.lseView;
  // A q of another dtype, host memory, no out, a strided lse, an f32 out, a
  // cache whose slots are not whole 16-byte chunks apart.
  TensorView f16Q(device.qView.data(), DType::F16, device.qView.shape(), device.qView.strides(),
                  Device::cuda(0));
  expectError([&] { attention.run(f16Q, device.kView, device.vView, device.bindings, options); },
              "q must be bf16 (the configured dtype) on CUDA");
  expectError(
      [&] { attention.run(step.q.view(), device.kView, device.vView, device.bindings, options); },
      "q is on cpu but the call runs on cuda:0");
  BatchRunOptions noOut;
  expectError(
      [&] { attention.run(device.qView, device.kView, device.vView, device.bindings, noOut); },
      "out is required on CUDA");
  BatchRunOptions stridedLse = options;
  stridedLse.lse = TensorView(device.lseView.data(), DType::F32, {4, 4}, {1, 4}, Device::cuda(0));
  expectError(
      [&] { attention.run(device.qView, device.kView, device.vView, device.bindings, stridedLse); },
      "lse must be contiguous on CUDA");
  const std::vector<int64_t> &kShape = device.kView.shape();
  std::vector<int64_t> oddStrides = device.kView.strides();
  oddStrides[1] = 4; // NHD slots 4 elements apart (overlapping, but that is not the point)
  TensorView oddK(device.kView.data(), DType::BF16, kShape, oddStrides, Device::cuda(0));
  expectError([&] { attention.run(device.qView, oddK, device.vView, device.bindings, options); },
              "k_cache's stride 4 in dimension 1 is not a multiple of 8 elements");
  // Nothing was written.
  auto [out, lse] = device.results();
  for (int64_t i = 0; i < lse.numel(); ++i)
    EXPECT_TRUE(std::isnan(lse.dataAs<float>()[i])) << i;
}

/// Runs `attention` (planned) on `device`'s inputs into out [T, Hq, Dv]
/// and lse [T, Hq] of its own, which it returns.
std::pair<DeviceBuffer, DeviceBuffer> runInto(const BatchAttention &attention,
                                              const DeviceStep &device, TensorView &out,
                                              TensorView &lse) {
  const int64_t rows = device.outView.size(0), heads = device.outView.size(1);
  DeviceBuffer outBuffer(device.out.size(), 0), lseBuffer(device.lse.size(), 0);
  outBuffer.fill(0xff);
  lseBuffer.fill(0xff);
  out =
      TensorView(outBuffer.data(), device.outView.dtype(), device.outView.shape(), Device::cuda(0));
  lse = TensorView(lseBuffer.data(), DType::F32, {rows, heads}, Device::cuda(0));
  attention.run(device.qView, device.kView, device.vView, device.bindings,
                device.options(out, lse));
  return {std::move(outBuffer), std::move(lseBuffer)};
}

/// Keys [0, split) and [split, seq_len) of each sequence of the mixed step
/// as two plans (kv_end, kv_start; splits off the page and tile grids,
/// inside the first tile and past a sequence's end), merged on the device:
/// the float64 attention over all keys, through the decode kernel (and its
/// splits) and the prefill tiles.
BatchStepCase mlaCase(int64_t qHeads, std::vector<BatchSeq> seqs, int32_t pageSize,
                      KVLayout layout, DType storage, const char *mask, const char *score,
                      uint64_t seed);

TEST(CudaBatchAttention, KvStartAndKvEndHalvesMergeToTheWhole) {
  for (int variant = 0; variant < 3; ++variant) {
    // Long decode contexts (split keys), GQA 4, HND f16 under a document
    // mask and soft-cap; the mixed step, NHD bf16 under "holes" (every row
    // with (q + h) % 3 == 0 masked); MLA decode (the tail's keys start
    // inside a tile: key 37).
    BatchStepCase c = mixedDocumentCase(120 + variant);
    const bool mla = variant == 2;
    if (mla) {
      c = mlaCase(16, {{1, 300}, {3, 177}, {1, 90}}, 16, KVLayout::NHD, DType::BF16, "causal",
                  "softcap", 122);
    } else if (variant == 0) {
      c.seqs = {{1, 1900}, {6, 1337}, {0, 500}, {3, 30}, {40, 900}};
      c.dim = c.vDim = 128;
      c.layout = KVLayout::HND;
      c.storage = DType::F16;
      c.score = "softcap";
    } else {
      c.qHeads = c.kvHeads = 2;
      c.mask = "holes";
      c.score = "alibi";
    }
    BatchStep step(c);
    std::vector<int32_t> split;
    for (const BatchSeq &s : c.seqs)
      split.push_back(std::min(s.seqLen, s.seqLen % 3 == 0 ? 37 : s.seqLen / 2 + 5));
    const int32_t batch = static_cast<int32_t>(step.batch);
    std::vector<int32_t> qsl = step.queryStartLoc, lens = step.seqLens, table = step.blockTable;
    auto planWith = [&](BatchAttention &attention, bool first) {
      TensorView range(split.data(), DType::I32, {batch});
      attention.plan(TensorView(qsl.data(), DType::I32, {batch + 1}),
                     TensorView(lens.data(), DType::I32, {batch}),
                     TensorView(table.data(), DType::I32, {batch, step.columns}),
                     first ? TensorView() : range, first ? range : TensorView());
    };
    BatchAttention head(step.mods, cudaConfig(step)), tail(step.mods, cudaConfig(step));
    planWith(head, true);
    planWith(tail, false);
    if (variant == 0)
      EXPECT_GT(tail.planShape().decodeSplits, 1);
    EXPECT_EQ(tail.planShape().prefillTiles + tail.planShape().groupTiles > 0, !mla);
    DeviceStep device(step);
    TensorView headOut, headLse, tailOut, tailLse;
    auto headBuffers = runInto(head, device, headOut, headLse);
    auto tailBuffers = runInto(tail, device, tailOut, tailLse);
    mergeState(headOut, headLse, tailOut, tailLse, device.outView, device.lseView);
    auto [out, lse] = device.results();
    BatchStepCheck check = step.compare(out.view(), lse.view(), /*cudaTolerance=*/true);
    EXPECT_STEP_MATCHES(check);
    if (variant == 1)
      EXPECT_GT(check.maskedRows, 0) << check.describe();
  }
}

/// A cascade step on the device: every sequence shares sequence 0's first
/// 100 keys (its six whole pages, each sequence its own copy of the
/// partial seventh). The prefix level packs each group's queries as one
/// entry over the prefix pages (kv_end 100) with each token's own position
/// and sequence index (token maps): a group of 7 tokens goes to the decode
/// kernel, one of 22 (100 keys: more than 4 a token) to the GQA-packed
/// tiles. The suffix level is the flat step
/// from kv_start 100. Merged on the device they match the float64 step,
/// under a document mask whose per-sequence ids (indexed by the token's b)
/// decide which prefix keys each row sees, and ALiBi (its position).
/// `c`: the storage (element types, an 8-bit cache) of the mixed
/// document case.
void checkCascadeLevels(BatchStepCase c) {
  c.seqs = {{1, 150}, {2, 140}, {1, 200}, {3, 133}, {12, 170}, {1, 161}, {9, 300}};
  c.sharedPrefix = 100;
  c.score = "alibi"; // relative positions: each row's own matters
  BatchStep step(c);
  const int32_t prefix = c.sharedPrefix, batch = static_cast<int32_t>(step.batch);
  // Documents: sequence b's first 30 + 9 b positions, then one to its end,
  // so each row sees the prefix keys from its own sequence's cut on.
  for (int64_t b = 0; b < step.batch; ++b)
    for (int64_t position = 0; position < step.maxKv; ++position)
      step.bindings->documents[b * step.maxKv + position] = position < 30 + 9 * b ? 0 : 1;
  // Groups: sequences [0, 4) and [4, 7).
  const std::vector<std::pair<int32_t, int32_t>> groups = {{0, 4}, {4, 7}};
  std::vector<int32_t> groupStart = {0}, groupLens, groupEnd, groupTable, positions, batches;
  for (auto [first, end] : groups) {
    for (int32_t b = first; b < end; ++b)
      for (int32_t i = 0; i < c.seqs[b].qLen; ++i) {
        positions.push_back(c.seqs[b].seqLen - c.seqs[b].qLen + i);
        batches.push_back(b);
      }
    groupStart.push_back(step.queryStartLoc[end]);
    groupLens.push_back(prefix);
    groupEnd.push_back(prefix);
    // Sequence 0's row: the prefix's pages and sequence 0's partial page.
    groupTable.insert(groupTable.end(), step.blockTable.begin(),
                      step.blockTable.begin() + step.columns);
  }
  const int32_t entries = static_cast<int32_t>(groups.size());
  const int64_t tokens = step.tokens;
  BatchAttention prefixLevel(step.mods, cudaConfig(step)), suffixLevel(step.mods, cudaConfig(step));
  prefixLevel.plan(TensorView(groupStart.data(), DType::I32, {entries + 1}),
                   TensorView(groupLens.data(), DType::I32, {entries}),
                   TensorView(groupTable.data(), DType::I32, {entries, step.columns}), TensorView(),
                   TensorView(groupEnd.data(), DType::I32, {entries}),
                   TensorView(positions.data(), DType::I32, {tokens}),
                   TensorView(batches.data(), DType::I32, {tokens}));
  EXPECT_EQ(prefixLevel.planShape().decodeSequences, 1);
  EXPECT_EQ(prefixLevel.planShape().prefillTiles, 0);
  EXPECT_EQ(prefixLevel.planShape().groupTiles, 1);
  std::vector<int32_t> qsl = step.queryStartLoc, lens = step.seqLens, table = step.blockTable;
  std::vector<int32_t> start(static_cast<size_t>(batch), prefix);
  // The suffix level needs no page below kv_start's: -1 there, which the
  // kernels must not read (memcheck) though the first tile covers them.
  for (int32_t b = 0; b < batch; ++b)
    for (int32_t j = 0; j < prefix / c.pageSize; ++j)
      table[b * step.columns + j] = -1;
  suffixLevel.plan(TensorView(qsl.data(), DType::I32, {batch + 1}),
                   TensorView(lens.data(), DType::I32, {batch}),
                   TensorView(table.data(), DType::I32, {batch, step.columns}),
                   TensorView(start.data(), DType::I32, {batch}));
  DeviceStep device(step);
  TensorView prefixOut, prefixLse, suffixOut, suffixLse;
  auto prefixBuffers = runInto(prefixLevel, device, prefixOut, prefixLse);
  auto suffixBuffers = runInto(suffixLevel, device, suffixOut, suffixLse);
  mergeState(prefixOut, prefixLse, suffixOut, suffixLse, device.outView, device.lseView);
  auto [out, lse] = device.results();
  BatchStepCheck check = step.compare(out.view(), lse.view(), /*cudaTolerance=*/true);
  EXPECT_STEP_MATCHES(check);
}

TEST(CudaBatchAttention, CascadeLevelsMergeToTheFlatStep) {
  checkCascadeLevels(mixedDocumentCase(140));
}

/// A cascade whose prefix level's groups (9 to 70 tokens) go to the
/// GQA-packed tiles: each group one entry over the shared prefix (a length
/// off the page grid) with token maps, the suffix level the flat step from
/// kv_start, merged on the device and compared with the float64 flat step
/// (out and lse). `groups`: [first, end) ranges of sequences; the plan must
/// make `tiles` GQA-packed tiles of `splits` splits and nothing else. A
/// document mask gives sequence b's prefix keys from 20 + 37 b on, and
/// sequence 1's rows none of them (their prefix part is empty: lse -inf).
void checkGroupCascade(BatchStepCase c, const std::vector<std::pair<int32_t, int32_t>> &groups,
                       int64_t tiles, int64_t splits) {
  SCOPED_TRACE(fmt::format("Hq {} Hkv {} D {} page {} prefix {} mask {}", c.qHeads, c.kvHeads,
                           c.dim, c.pageSize, c.sharedPrefix, c.mask));
  BatchStep step(c);
  const int32_t prefix = c.sharedPrefix, batch = static_cast<int32_t>(step.batch);
  if (c.mask == "document")
    for (int64_t b = 0; b < step.batch; ++b)
      for (int64_t position = 0; position < step.maxKv; ++position)
        step.bindings->documents[b * step.maxKv + position] =
            b == 1 ? (position < prefix ? 0 : 2) : (position < 20 + 37 * b ? 0 : 1);
  std::vector<int32_t> groupStart = {0}, groupLens, groupTable, positions, batches;
  for (auto [first, end] : groups) {
    for (int32_t b = first; b < end; ++b)
      for (int32_t i = 0; i < c.seqs[b].qLen; ++i) {
        positions.push_back(c.seqs[b].seqLen - c.seqs[b].qLen + i);
        batches.push_back(b);
      }
    groupStart.push_back(step.queryStartLoc[end]);
    groupLens.push_back(prefix);
    groupTable.insert(groupTable.end(), step.blockTable.begin(),
                      step.blockTable.begin() + step.columns);
  }
  const int32_t entries = static_cast<int32_t>(groups.size());
  const int64_t tokens = step.tokens;
  BatchAttention prefixLevel(step.mods, cudaConfig(step)), suffixLevel(step.mods, cudaConfig(step));
  prefixLevel.plan(TensorView(groupStart.data(), DType::I32, {entries + 1}),
                   TensorView(groupLens.data(), DType::I32, {entries}),
                   TensorView(groupTable.data(), DType::I32, {entries, step.columns}), TensorView(),
                   TensorView(groupLens.data(), DType::I32, {entries}),
                   TensorView(positions.data(), DType::I32, {tokens}),
                   TensorView(batches.data(), DType::I32, {tokens}));
  const BatchPlanShape shape = prefixLevel.planShape();
  EXPECT_EQ(shape.decodeSequences + shape.prefillTiles, 0);
  EXPECT_EQ(shape.groupTiles, tiles);
  EXPECT_EQ(shape.groupSplits, splits);
  std::vector<int32_t> qsl = step.queryStartLoc, lens = step.seqLens, table = step.blockTable;
  std::vector<int32_t> start(static_cast<size_t>(batch), prefix);
  for (int32_t b = 0; b < batch; ++b)
    for (int32_t j = 0; j < prefix / c.pageSize; ++j)
      table[b * step.columns + j] = -1;
  suffixLevel.plan(TensorView(qsl.data(), DType::I32, {batch + 1}),
                   TensorView(lens.data(), DType::I32, {batch}),
                   TensorView(table.data(), DType::I32, {batch, step.columns}),
                   TensorView(start.data(), DType::I32, {batch}));
  DeviceStep device(step);
  TensorView prefixOut, prefixLse, suffixOut, suffixLse;
  auto prefixBuffers = runInto(prefixLevel, device, prefixOut, prefixLse);
  auto suffixBuffers = runInto(suffixLevel, device, suffixOut, suffixLse);
  if (c.mask == "document") {
    // Sequence 1's rows see no prefix key: their prefix part is empty.
    std::vector<float> lse(static_cast<size_t>(tokens * c.qHeads));
    prefixBuffers.second.download(lse.data(), lse.size() * 4);
    for (int64_t row = step.queryStartLoc[1]; row < step.queryStartLoc[2]; ++row)
      EXPECT_EQ(lse[row * c.qHeads], -std::numeric_limits<float>::infinity()) << row;
  }
  mergeState(prefixOut, prefixLse, suffixOut, suffixLse, device.outView, device.lseView);
  auto [out, lse] = device.results();
  BatchStepCheck check = step.compare(out.view(), lse.view(), /*cudaTolerance=*/true);
  EXPECT_STEP_MATCHES(check);
  if (c.mask == "holes")
    EXPECT_GT(check.maskedRows, 0) << check.describe();
}

/// GQA 4, D 64, pages of 16, a 300-key prefix under a document mask: groups
/// of 9 tokens (36 rows, one tile) and 70 (280 rows, two tiles of 256, the
/// second's 24 rows in both row blocks of its first warp), unsplit (300
/// keys make one split of at least 256).
TEST(CudaBatchAttention, GroupCascadeGqa4DocumentMask) {
  BatchStepCase c = mixedDocumentCase(180);
  c.qHeads = 8;
  c.kvHeads = 2;
  c.sharedPrefix = 300;
  c.seqs = {{2, 310}, {3, 330}, {4, 304}, {64, 420}, {6, 345}};
  c.score = "alibi";
  checkGroupCascade(c, {{0, 3}, {3, 5}}, 3, 1);
}

/// GQA 8, D 128, shuffled pages of 128, a 700-key prefix (5.5 pages) under
/// a causal mask with fully masked rows ("holes"): groups of 33 tokens (264
/// rows, two tiles of 256) and 64 (512 rows, two), split in two over the
/// prefix.
TEST(CudaBatchAttention, GroupCascadeGqa8SplitPagesOf128) {
  BatchStepCase c = mixedDocumentCase(181);
  c.qHeads = 8;
  c.kvHeads = 1;
  c.dim = c.vDim = 128;
  c.pageSize = 128;
  c.layout = KVLayout::HND;
  c.storage = DType::F16;
  c.mask = "holes";
  c.sharedPrefix = 700;
  c.seqs = {{30, 760}, {3, 705}, {64, 801}};
  checkGroupCascade(c, {{0, 2}, {2, 3}}, 4, 2);
}

/// GQA 1, D 64, pages of 16, a 530-key prefix under a causal mask: one
/// group of 40 tokens (40 rows of a 256-row tile), split in two.
TEST(CudaBatchAttention, GroupCascadeGqa1CausalSplit) {
  BatchStepCase c = mixedDocumentCase(182);
  c.qHeads = c.kvHeads = 2;
  c.mask = "causal";
  c.sharedPrefix = 530;
  c.seqs = {{1, 531}, {17, 600}, {22, 560}};
  checkGroupCascade(c, {{0, 3}}, 1, 2);
}

/// GQA 4 at head dim 192 (the 128-row tiles of 16 rows a warp), f16 HND
/// pages of 16, a 530-key prefix under "holes" (fully masked rows): one
/// group of 40 tokens (160 rows, two tiles of 128), split in two.
TEST(CudaBatchAttention, GroupCascadeGqa4HeadDim192Tiles128) {
  BatchStepCase c = mixedDocumentCase(183);
  c.qHeads = 8;
  c.kvHeads = 2;
  c.dim = c.vDim = 192;
  c.layout = KVLayout::HND;
  c.storage = DType::F16;
  c.mask = "holes";
  c.sharedPrefix = 530;
  c.seqs = {{1, 531}, {17, 600}, {22, 560}};
  checkGroupCascade(c, {{0, 3}}, 2, 2);
}

/// The cascade over an 8-bit cache: the suffix level's first tiles hold
/// keys below kv_start on pages of -1, whose codes (like 16-bit rows) must
/// be neither copied nor kept, in the prefill tiles as in the decode CTAs.
TEST(CudaBatchAttention, CascadeLevelsOverAFloat8Cache) {
  BatchStepCase c = mixedDocumentCase(145);
  c.kvFloat8 = DType::F8E5M2;
  checkCascadeLevels(c);
}

/// A prefix level captured into a CUDA graph after a plan without token
/// maps, replayed after a plan of the same shape with them: the replay
/// takes the later plan's maps (plan() uploads maps for every plan, the
/// flat step's when none are given), so the merged cascade still matches
/// the float64 flat step.
TEST(CudaBatchAttention, CapturedPrefixLevelTakesALaterPlansTokenMaps) {
  BatchStepCase c = mixedDocumentCase(170);
  c.seqs = {{1, 150}, {2, 140}, {3, 200}};
  c.sharedPrefix = 100;
  c.score = "alibi";
  BatchStep step(c);
  const int32_t prefix = c.sharedPrefix, batch = static_cast<int32_t>(step.batch);
  for (int64_t b = 0; b < step.batch; ++b)
    for (int64_t position = 0; position < step.maxKv; ++position)
      step.bindings->documents[b * step.maxKv + position] = position < 30 + 9 * b ? 0 : 1;
  std::vector<int32_t> groupStart = {0, static_cast<int32_t>(step.tokens)}, groupLen = {prefix};
  std::vector<int32_t> groupTable(step.blockTable.begin(), step.blockTable.begin() + step.columns);
  std::vector<int32_t> positions, batches;
  for (int32_t b = 0; b < batch; ++b)
    for (int32_t i = 0; i < c.seqs[b].qLen; ++i) {
      positions.push_back(c.seqs[b].seqLen - c.seqs[b].qLen + i);
      batches.push_back(b);
    }
  const int64_t tokens = step.tokens;
  BatchAttention prefixLevel(step.mods, cudaConfig(step)), suffixLevel(step.mods, cudaConfig(step));
  auto planPrefix = [&](bool maps) {
    prefixLevel.plan(TensorView(groupStart.data(), DType::I32, {2}),
                     TensorView(groupLen.data(), DType::I32, {1}),
                     TensorView(groupTable.data(), DType::I32, {1, step.columns}), TensorView(),
                     TensorView(),
                     maps ? TensorView(positions.data(), DType::I32, {tokens}) : TensorView(),
                     maps ? TensorView(batches.data(), DType::I32, {tokens}) : TensorView());
  };
  planPrefix(false);
  const BatchPlanShape captured = prefixLevel.planShape();
  std::vector<int32_t> qsl = step.queryStartLoc, lens = step.seqLens, table = step.blockTable;
  std::vector<int32_t> start(static_cast<size_t>(batch), prefix);
  suffixLevel.plan(TensorView(qsl.data(), DType::I32, {batch + 1}),
                   TensorView(lens.data(), DType::I32, {batch}),
                   TensorView(table.data(), DType::I32, {batch, step.columns}),
                   TensorView(start.data(), DType::I32, {batch}));
  DeviceStep device(step);
  const CudaDriver &driver = CudaDriver::get();
  cu::Stream stream = nullptr;
  driver.check(driver.api().streamCreate(&stream, 0), "cuStreamCreate");
  DeviceBuffer prefixOut(device.out.size(), 0), prefixLse(device.lse.size(), 0);
  BatchRunOptions options;
  options.out =
      TensorView(prefixOut.data(), device.outView.dtype(), device.outView.shape(), Device::cuda(0));
  options.lse = TensorView(prefixLse.data(), DType::F32, device.lseView.shape(), Device::cuda(0));
  options.stream = stream;
  CudaGraphExec graph = captureGraph(driver, stream, [&] {
    prefixLevel.run(device.qView, device.kView, device.vView, device.bindings, options);
  });
  planPrefix(true);
  ASSERT_EQ(prefixLevel.planShape().decodeSplits, captured.decodeSplits);
  ASSERT_EQ(prefixLevel.planShape().decodeSequences, captured.decodeSequences);
  graph.launch(stream);
  BatchRunOptions suffixOptions;
  suffixOptions.out = device.outView;
  suffixOptions.lse = device.lseView;
  suffixOptions.stream = stream;
  suffixLevel.run(device.qView, device.kView, device.vView, device.bindings, suffixOptions);
  MergeStateOptions mergeOptions;
  mergeOptions.stream = stream;
  mergeStateInPlace(device.outView, device.lseView, options.out, options.lse, mergeOptions);
  driver.check(driver.api().streamSynchronize(stream), "cuStreamSynchronize");
  driver.check(driver.api().streamDestroy(stream), "cuStreamDestroy");
  auto [out, lse] = device.results();
  EXPECT_STEP_MATCHES(step.compare(out.view(), lse.view(), /*cudaTolerance=*/true));
}

/// The bytes the attention kernels' cp.async copies read from global
/// memory (K/V rows and q; zero-filled rows excluded), from the emulator's
/// counter lines of the launches that `run` makes; on the system's driver
/// (PAGEDC_TEST_CUDA_DRIVER=system), which has no such counters, it runs
/// `run` and returns -1, and the callers check the results alone.
int64_t attentionCopyBytes(const std::function<void()> &run) {
  if (!pagedc::test::onEmulator()) {
    run();
    return -1;
  }
  const std::string path = ::testing::TempDir() + "cascade-counters.jsonl";
  std::remove(path.c_str());
  ::setenv("PAGEDC_EMU_COUNTERS", path.c_str(), 1);
  run();
  ::unsetenv("PAGEDC_EMU_COUNTERS");
  std::ifstream in(path);
  int64_t bytes = 0;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json launch = nlohmann::json::parse(line);
    const std::string kernel = launch.at("kernel");
    if (kernel == "pagedc_decode" || kernel == "pagedc_prefill" || kernel == "pagedc_prefill_group")
      bytes += launch.at("counters").at("cp_async_bytes").get<int64_t>();
  }
  std::remove(path.c_str());
  return bytes;
}

/// A step of GQA 2 (Hq 4, Hkv 2), D 64, bf16, NHD pages of 16: the
/// counted steps' (their bytes are worked out by hand).
BatchStepCase countedCase(std::vector<BatchSeq> seqs, const char *mask, uint64_t seed) {
  BatchStepCase c;
  c.seqs = std::move(seqs);
  c.qHeads = 4;
  c.kvHeads = 2;
  c.dim = c.vDim = 64;
  c.pageSize = 16;
  c.layout = KVLayout::NHD;
  c.storage = DType::BF16;
  c.mask = mask;
  c.seed = seed;
  return c;
}

/// Compares the out and lse a runInto() wrote with the step's float64
/// reference.
BatchStepCheck checkRunInto(const BatchStep &step,
                            const std::pair<DeviceBuffer, DeviceBuffer> &buffers,
                            const TensorView &out, const TensorView &lse) {
  HostTensor hostOut(out.dtype(), out.shape()), hostLse(DType::F32, lse.shape());
  buffers.first.download(hostOut.data(), buffers.first.size());
  buffers.second.download(hostLse.data(), buffers.second.size());
  return step.compare(hostOut.view(), hostLse.view(), /*cudaTolerance=*/true);
}

/// The acceptance check of cascade, at CI size: 8 decoding sequences
/// sharing a 500-key prefix (GQA 2, D 64, bf16; the suffixes start inside
/// a 64-key tile, whose rows below kv_start must not be read). The emulator's counters
/// show the flat step reading every sequence's prefix (8 times the
/// prefix's K/V per KV head) and the cascade reading it once per KV head
/// (the prefix level's one entry of 8 tokens, on the decode kernel) plus
/// each sequence's own keys from kv_start; q is read once per KV split.
/// Both match float64.
TEST(CudaBatchAttention, CascadeReadsTheSharedPrefixOncePerKvHead) {
  const int32_t prefix = 500, sequences = 8;
  std::vector<BatchSeq> seqs;
  for (int32_t b = 0; b < sequences; ++b)
    seqs.push_back({1, prefix + 13 + 11 * b});
  BatchStepCase c = countedCase(std::move(seqs), "causal", 160);
  c.sharedPrefix = prefix;
  BatchStep step(c);
  const int64_t rowBytes = c.kvHeads * (c.dim + c.vDim) * 2; // K and V of a key
  const int64_t qBytes = step.tokens * c.qHeads * c.dim * 2;
  int64_t suffixKeys = 0;
  for (const BatchSeq &s : c.seqs)
    suffixKeys += s.seqLen - prefix;
  DeviceStep device(step);

  BatchAttention flat(step.mods, cudaConfig(step));
  step.plan(flat);
  TensorView flatOut, flatLse;
  std::pair<DeviceBuffer, DeviceBuffer> flatBuffers;
  const int64_t flatBytes =
      attentionCopyBytes([&] { flatBuffers = runInto(flat, device, flatOut, flatLse); });
  const bool counted = flatBytes >= 0;
  if (counted)
    EXPECT_EQ(flatBytes,
              (sequences * prefix + suffixKeys) * rowBytes + flat.planShape().decodeSplits * qBytes);

  std::vector<int32_t> groupStart = {0, static_cast<int32_t>(step.tokens)}, groupLen = {prefix};
  std::vector<int32_t> groupTable(step.blockTable.begin(), step.blockTable.begin() + step.columns);
  std::vector<int32_t> positions, batches;
  for (int32_t b = 0; b < sequences; ++b) {
    positions.push_back(c.seqs[b].seqLen - 1);
    batches.push_back(b);
  }
  BatchAttention prefixLevel(step.mods, cudaConfig(step)), suffixLevel(step.mods, cudaConfig(step));
  prefixLevel.plan(TensorView(groupStart.data(), DType::I32, {2}),
                   TensorView(groupLen.data(), DType::I32, {1}),
                   TensorView(groupTable.data(), DType::I32, {1, step.columns}), TensorView(),
                   TensorView(), TensorView(positions.data(), DType::I32, {sequences}),
                   TensorView(batches.data(), DType::I32, {sequences}));
  std::vector<int32_t> qsl = step.queryStartLoc, lens = step.seqLens, table = step.blockTable;
  std::vector<int32_t> start(sequences, prefix);
  suffixLevel.plan(TensorView(qsl.data(), DType::I32, {sequences + 1}),
                   TensorView(lens.data(), DType::I32, {sequences}),
                   TensorView(table.data(), DType::I32, {sequences, step.columns}),
                   TensorView(start.data(), DType::I32, {sequences}));
  EXPECT_EQ(prefixLevel.planShape().decodeSequences, 1);
  TensorView prefixOut, prefixLse, suffixOut, suffixLse;
  std::pair<DeviceBuffer, DeviceBuffer> prefixBuffers, suffixBuffers;
  const int64_t prefixBytes = attentionCopyBytes(
      [&] { prefixBuffers = runInto(prefixLevel, device, prefixOut, prefixLse); });
  const int64_t suffixBytes = attentionCopyBytes(
      [&] { suffixBuffers = runInto(suffixLevel, device, suffixOut, suffixLse); });
  if (counted) {
    EXPECT_EQ(prefixBytes, prefix * rowBytes + prefixLevel.planShape().decodeSplits * qBytes);
    EXPECT_EQ(suffixBytes, suffixKeys * rowBytes + suffixLevel.planShape().decodeSplits * qBytes);
    // The prefix's share: 8 times in the flat step, once in the cascade.
    const int64_t flatPrefix =
        flatBytes - suffixKeys * rowBytes - flat.planShape().decodeSplits * qBytes;
    EXPECT_EQ(flatPrefix, sequences * prefix * rowBytes);
    std::printf("cascade bytes: flat %lld, cascade %lld (prefix level %lld, suffix level %lld)\n",
                static_cast<long long>(flatBytes), static_cast<long long>(prefixBytes + suffixBytes),
                static_cast<long long>(prefixBytes), static_cast<long long>(suffixBytes));
  }

  EXPECT_STEP_MATCHES(checkRunInto(step, flatBuffers, flatOut, flatLse));
  mergeState(prefixOut, prefixLse, suffixOut, suffixLse, device.outView, device.lseView);
  auto [out, lse] = device.results();
  EXPECT_STEP_MATCHES(step.compare(out.view(), lse.view(), /*cudaTolerance=*/true));
}

/// Decodes under the "window" test mask (the 100 keys ending at each
/// query): the emulator's counters show the kernels reading each
/// sequence's keys from its window's 64-key granule (plan()'s keyBegin), not
/// its whole context (3,000, 1,200 and 700 keys; 90 start at key 0), and
/// q once per KV split; the step matches float64.
TEST(CudaBatchAttention, ClassifiedWindowDecodeReadsItsWindowOnly) {
  const BatchStepCase c = countedCase({{1, 3000}, {1, 1200}, {1, 90}, {2, 700}}, "window", 170);
  BatchStep step(c);
  DeviceStep device(step);
  BatchAttention attention(step.mods, cudaConfig(step));
  step.plan(attention);
  const int64_t rowBytes = c.kvHeads * (c.dim + c.vDim) * 2; // K and V of a key
  const int64_t qBytes = step.tokens * c.qHeads * c.dim * 2;
  int64_t keys = 0, context = 0;
  for (size_t b = 0; b < c.seqs.size(); ++b) {
    keys += c.seqs[b].seqLen - attention.keyBegin(static_cast<int64_t>(b));
    context += c.seqs[b].seqLen;
  }
  EXPECT_EQ(keys, (3000 - 2880) + (1200 - 1088) + 90 + (700 - 576));
  TensorView out, lse;
  std::pair<DeviceBuffer, DeviceBuffer> buffers;
  const int64_t bytes = attentionCopyBytes([&] { buffers = runInto(attention, device, out, lse); });
  if (bytes >= 0) {
    EXPECT_EQ(bytes, keys * rowBytes + attention.planShape().decodeSplits * qBytes);
    std::printf("window decode bytes: %lld for %lld keys of %lld\n",
                static_cast<long long>(bytes), static_cast<long long>(keys),
                static_cast<long long>(context));
  }
  EXPECT_STEP_MATCHES(checkRunInto(step, buffers, out, lse));
}

/// Whole prompts and a chunk after its context under a causal mask, on
/// the 64-row prefill tiles: with the mask's classifier each tile reads
/// the keys up to its last row's (ends 64, 128, ..., the sequence's last
/// tile to its end), without it every key of its sequence. The emulator's
/// counters differ by exactly the keys left out (776 of 3,324, for each
/// of the 4 query heads' CTAs); both match float64.
TEST(CudaBatchAttention, ClassifiedPrefillTilesReadTheKeysTheirRowsSee) {
  const BatchStepCase c = countedCase({{300, 300}, {200, 456}}, "causal", 171);
  BatchStep step(c);
  DeviceStep device(step);
  CompiledMods unclassified = step.mods;
  unclassified.maskBlockClass = nullptr;
  BatchAttention bounded(step.mods, cudaConfig(step)), whole(unclassified, cudaConfig(step));
  step.plan(bounded);
  step.plan(whole);
  EXPECT_EQ(bounded.planShape().prefillTiles, 9);
  TensorView out[2], lse[2];
  std::pair<DeviceBuffer, DeviceBuffer> buffers[2];
  const int64_t boundedBytes =
      attentionCopyBytes([&] { buffers[0] = runInto(bounded, device, out[0], lse[0]); });
  const int64_t wholeBytes =
      attentionCopyBytes([&] { buffers[1] = runInto(whole, device, out[1], lse[1]); });
  if (boundedBytes >= 0) {
    const int64_t keyBytes = c.qHeads * (c.dim + c.vDim) * 2; // a key for each head's CTA
    const int64_t boundedKeys = (64 + 128 + 192 + 256 + 300) + (320 + 384 + 448 + 456);
    EXPECT_EQ(wholeBytes - boundedBytes, (5 * 300 + 4 * 456 - boundedKeys) * keyBytes);
    std::printf("prefill tile bytes: %lld with the classifier, %lld without\n",
                static_cast<long long>(boundedBytes), static_cast<long long>(wholeBytes));
  }
  for (int i = 0; i < 2; ++i)
    EXPECT_STEP_MATCHES(checkRunInto(step, buffers[i], out[i], lse[i]));
}

/// The acceptance line's prefix level at CI size under GQA 4 (Hq 8, Hkv 2,
/// D 64): 64 and then 96 decoding sequences sharing a 600-key prefix, each
/// group one entry of 64 or 96 tokens, which goes to the GQA-packed tiles
/// (256 rows: 64 tokens x 4 query heads). The emulator's cp_async_bytes of
/// the launch are the prefix's K/V exactly once per KV head and row tile
/// (once for 64 tokens, twice for 96; 128-row tiles read it twice and
/// three times, the per-query-head tiles 4 and 8 times), plus q once per
/// split (two: the prefix is split over CTAs); the 64-token cascade,
/// merged with its suffix level, matches float64.
TEST(CudaBatchAttention, GroupPrefixLevelReadsThePrefixOncePerKvHeadAndRowTile) {
  for (const int32_t sequences : {64, 96}) {
    BatchStepCase c = mixedDocumentCase(190 + sequences);
    const int32_t prefix = 600;
    c.seqs.clear();
    for (int32_t b = 0; b < sequences; ++b)
      c.seqs.push_back({1, prefix + 1 + (7 * b) % 90});
    c.qHeads = 8;
    c.kvHeads = 2;
    c.mask = "causal";
    c.sharedPrefix = prefix;
    BatchStep step(c);
    const int64_t rowBytes = c.kvHeads * (c.dim + c.vDim) * 2;
    const int64_t qBytes = step.tokens * c.qHeads * c.dim * 2;
    std::vector<int32_t> groupStart = {0, sequences}, groupLen = {prefix};
    std::vector<int32_t> groupTable(step.blockTable.begin(),
                                    step.blockTable.begin() + step.columns);
    std::vector<int32_t> positions, batches;
    for (int32_t b = 0; b < sequences; ++b) {
      positions.push_back(c.seqs[b].seqLen - 1);
      batches.push_back(b);
    }
    BatchAttention prefixLevel(step.mods, cudaConfig(step));
    prefixLevel.plan(TensorView(groupStart.data(), DType::I32, {2}),
                     TensorView(groupLen.data(), DType::I32, {1}),
                     TensorView(groupTable.data(), DType::I32, {1, step.columns}), TensorView(),
                     TensorView(), TensorView(positions.data(), DType::I32, {sequences}),
                     TensorView(batches.data(), DType::I32, {sequences}));
    const BatchPlanShape shape = prefixLevel.planShape();
    const int64_t rowTiles = (sequences * 4 + 255) / 256;
    EXPECT_EQ(shape.groupTiles, rowTiles);
    EXPECT_EQ(shape.groupSplits, 2);
    DeviceStep device(step);
    TensorView prefixOut, prefixLse;
    std::pair<DeviceBuffer, DeviceBuffer> prefixBuffers;
    const int64_t bytes = attentionCopyBytes(
        [&] { prefixBuffers = runInto(prefixLevel, device, prefixOut, prefixLse); });
    if (bytes >= 0) {
      EXPECT_EQ(bytes, rowTiles * prefix * rowBytes + shape.groupSplits * qBytes) << sequences;
      std::printf("GQA-packed prefix level of %d tokens: %lld bytes (prefix K/V %lld per read, "
                  "%lld tiles, %lld splits)\n",
                  sequences, static_cast<long long>(bytes),
                  static_cast<long long>(prefix * rowBytes), static_cast<long long>(rowTiles),
                  static_cast<long long>(shape.groupSplits));
    }
    if (sequences != 64)
      continue;
    std::vector<int32_t> qsl = step.queryStartLoc, lens = step.seqLens, table = step.blockTable;
    std::vector<int32_t> start(static_cast<size_t>(sequences), prefix);
    BatchAttention suffixLevel(step.mods, cudaConfig(step));
    suffixLevel.plan(TensorView(qsl.data(), DType::I32, {sequences + 1}),
                     TensorView(lens.data(), DType::I32, {sequences}),
                     TensorView(table.data(), DType::I32, {sequences, step.columns}),
                     TensorView(start.data(), DType::I32, {sequences}));
    TensorView suffixOut, suffixLse;
    auto suffixBuffers = runInto(suffixLevel, device, suffixOut, suffixLse);
    mergeState(prefixOut, prefixLse, suffixOut, suffixLse, device.outView, device.lseView);
    auto [out, lse] = device.results();
    EXPECT_STEP_MATCHES(step.compare(out.view(), lse.view(), /*cudaTolerance=*/true));
  }
}

/// A mixed step captured once into a CUDA graph (the emulated driver's
/// stream capture) and replayed for 10 steps whose metadata contents change
/// through plan(): the sequences in another order, new page tables, new
/// inputs in the same buffers. Each replay matches float64. The graph holds
/// the launches' shapes, so each step's plan must have the captured shape
/// (planShape(); the same sequences reordered do).
TEST(CudaBatchAttention, CapturedStepReplaysWithNewMetadata) {
  const BatchStepCase c = mixedDocumentCase(90);
  BatchStep first(c);
  BatchAttention attention(first.mods, cudaConfig(first));
  first.plan(attention);
  const BatchPlanShape captured = attention.planShape();
  DeviceStep device(first);
  const CudaDriver &driver = CudaDriver::get();
  ASSERT_TRUE(cudaGraphsAvailable(driver));
  cu::Stream stream = nullptr;
  driver.check(driver.api().streamCreate(&stream, 0), "cuStreamCreate");
  BatchRunOptions options;
  options.out = device.outView;
  options.lse = device.lseView;
  options.stream = stream;
  CudaGraphExec graph = captureGraph(driver, stream, [&] {
    attention.run(device.qView, device.kView, device.vView, device.bindings, options);
  });
  // Captured, not run: out is still NaN.
  EXPECT_TRUE(std::isnan(device.results().second.dataAs<float>()[0]));

  std::mt19937 rng(11);
  for (int replay = 0; replay < 10; ++replay) {
    BatchStepCase next = c;
    next.seed = 200 + replay;
    std::shuffle(next.seqs.begin(), next.seqs.end(), rng);
    BatchStep step(next);
    step.plan(attention);
    const BatchPlanShape shape = attention.planShape();
    ASSERT_EQ(shape.prefillTiles, captured.prefillTiles) << replay;
    ASSERT_EQ(shape.decodeSequences, captured.decodeSequences) << replay;
    ASSERT_EQ(shape.decodeSplits, captured.decodeSplits) << replay;
    ASSERT_EQ(shape.groupTiles, captured.groupTiles) << replay;
    ASSERT_EQ(shape.groupSplits, captured.groupSplits) << replay;
    device.reload(step);
    graph.launch(stream);
    driver.check(driver.api().streamSynchronize(stream), "cuStreamSynchronize");
    auto [out, lse] = device.results();
    BatchStepCheck check = step.compare(out.view(), lse.view(), /*cudaTolerance=*/true);
    SCOPED_TRACE("replay " + std::to_string(replay));
    EXPECT_STEP_MATCHES(check);
  }

  // A seeded violation: plan() uploads with cuMemcpyHtoD, which a run()
  // must never do; inside a capture the emulated driver refuses it, names
  // the call and invalidates the capture.
  try {
    captureGraph(driver, stream, [&] { first.plan(attention); });
    ADD_FAILURE() << "an upload inside a capture was not refused";
  } catch (const Error &error) {
    EXPECT_NE(std::string(error.what()).find("cuMemcpyHtoD"), std::string::npos) << error.what();
  }
  EXPECT_EQ(streamCaptureStatus(driver, stream), cu::kStreamCaptureStatusNone);
  driver.check(driver.api().streamDestroy(stream), "cuStreamDestroy");
}

/// The compositions a fixed-grid graph replays: decode (1), speculative
/// (2-8), chunks (9-80 new tokens at the end of longer contexts), whole
/// prompts (q_len == seq_len) and sequences with no new tokens, in changing
/// numbers, none a multiple of the page or tile size; the first is the
/// captured step. Contexts up to 520 keys: past 512, the limits give a
/// fixed split count of 2, so the merge launch runs too.
std::vector<std::vector<BatchSeq>> fixedGridSteps() {
  return {
      {{1, 150}, {5, 77}, {0, 40}, {37, 300}, {61, 61}, {8, 129}},
      {{1, 519}},
      {{80, 80}, {45, 520}},
      {{0, 33}, {0, 0}},
      {{1, 1}, {2, 17}, {3, 250}, {4, 4}, {5, 99}, {6, 401}, {7, 64}, {8, 511}},
      {{9, 45}, {1, 70}, {0, 12}},
      {{33, 490}, {17, 17}, {1, 300}, {2, 2}},
      {{1, 200}, {1, 505}, {1, 31}, {1, 129}, {1, 257}, {1, 64}},
      {{70, 130}, {0, 260}, {3, 3}},
      {{12, 512}, {1, 513}, {0, 9}, {8, 8}, {40, 40}},
      {{2, 480}, {9, 9}, {0, 1}, {1, 2}, {79, 199}, {5, 6}},
  };
}

/// One set of device buffers (addresses fixed, as a captured graph holds
/// them) sized for every step of fixedGridSteps(): each step's q, its NHD
/// cache (whose page and slot strides do not depend on the page count)
/// and its document ids are copied in at the start, the documents row by
/// row into [maxSeqs, maxKeys], the buffer's shape at capture.
struct FixedGridFrame {
  DeviceBuffer q, cache, out, lse, doc, slopes;
  TensorView qView, kView, vView, outView, lseView;
  Bindings bindings;
  int64_t docColumns = 0;

  FixedGridFrame(const std::vector<std::unique_ptr<BatchStep>> &steps) {
    const Device device = Device::cuda(0);
    const BatchStepCase &c = steps.front()->c;
    int64_t rows = 1, pages = 1, seqs = 1;
    size_t qBytes = 0, kBytes = 0;
    for (const auto &step : steps) {
      EXPECT_EQ(step->c.layout, KVLayout::NHD);
      rows = std::max(rows, step->q.shape()[0]);
      pages = std::max(pages, step->cache->k.shape()[0]);
      seqs = std::max(seqs, step->batch);
      docColumns = std::max(docColumns, step->maxKv);
      qBytes = std::max(qBytes, DeviceStep::bytesOf(step->q));
      kBytes = std::max(kBytes, DeviceStep::bytesOf(step->cache->k));
    }
    q = DeviceBuffer(qBytes, 0);
    qView = TensorView(q.data(), c.storage, {rows, c.qHeads, c.dim}, device);
    cache = DeviceBuffer(2 * kBytes, 0);
    auto *base = static_cast<char *>(cache.data());
    const int64_t element = dtypeSize(c.storage);
    kView = TensorView(base, c.storage, {pages, c.pageSize, c.kvHeads, c.dim}, device);
    vView = TensorView(base + kBytes, c.storage, {pages, c.pageSize, c.kvHeads, c.vDim}, device);
    EXPECT_LE(pages * c.pageSize * c.kvHeads * c.dim * element, static_cast<int64_t>(kBytes));
    out = DeviceBuffer(static_cast<size_t>(rows * c.qHeads * c.vDim * element), 0);
    outView = TensorView(out.data(), c.storage, {rows, c.qHeads, c.vDim}, device);
    lse = DeviceBuffer(static_cast<size_t>(rows * c.qHeads) * 4, 0);
    lseView = TensorView(lse.data(), DType::F32, {rows, c.qHeads}, device);
    doc = DeviceBuffer(static_cast<size_t>(seqs * docColumns) * 4, 0);
    slopes = DeviceBuffer(static_cast<size_t>(c.qHeads) * 4, 0);
    bindings = steps.front()->bindings->bindings;
    bindings.buffers["doc"] = TensorView(doc.data(), DType::I32, {seqs, docColumns}, device);
    bindings.buffers["slopes"] = TensorView(slopes.data(), DType::F32, {c.qHeads}, device);
  }

  /// `step`'s inputs into the frame; out and lse back to NaN.
  void load(const BatchStep &step) {
    q.upload(step.q.data(), DeviceStep::bytesOf(step.q));
    const size_t kBytes = DeviceStep::bytesOf(step.cache->k);
    cache.upload(step.cache->k.data(), kBytes);
    cache.upload(step.cache->v.data(), DeviceStep::bytesOf(step.cache->v), cache.size() / 2);
    const std::vector<int32_t> &documents = step.bindings->documents;
    for (int64_t b = 0; b < step.batch; ++b)
      doc.upload(documents.data() + b * step.maxKv, static_cast<size_t>(step.maxKv) * 4,
                 static_cast<size_t>(b * docColumns) * 4);
    slopes.upload(step.bindings->slopes.data(), slopes.size());
    out.fill(0xff);
    lse.fill(0xff);
  }

  /// out and lse, downloaded.
  std::pair<HostTensor, HostTensor> results() const {
    HostTensor hostOut(outView.dtype(), outView.shape());
    out.download(hostOut.data(), out.size());
    HostTensor hostLse(DType::F32, lseView.shape());
    lse.download(hostLse.data(), lse.size());
    return {std::move(hostOut), std::move(hostLse)};
  }
};

/// A fixed grid (BatchAttentionConfig::fixedGrid): one run() captured into
/// a graph, then ten steps of other compositions (see fixedGridSteps), each
/// planned and replayed through the captured graph, each against the
/// float64 reference (out and lse, rows past the step untouched). Every
/// plan has the same planShape(); without the fixed grid the graph keeps
/// the captured step's grids and the replays miss or misplace work.
TEST(CudaBatchAttention, FixedGridGraphReplaysStepsOfAnyComposition) {
  std::vector<std::unique_ptr<BatchStep>> steps;
  uint64_t seed = 700;
  for (const std::vector<BatchSeq> &seqs : fixedGridSteps()) {
    BatchStepCase c = mixedDocumentCase(seed++);
    c.seqs = seqs;
    steps.push_back(std::make_unique<BatchStep>(c));
  }
  BatchAttentionConfig config = cudaConfig(*steps.front());
  config.fixedGrid = true;
  config.maxNumSeqs = 8;
  config.maxNumTokens = 160;
  config.maxBlocksPerSeq = 34; // 544 keys
  BatchAttention attention(steps.front()->mods, config);
  FixedGridFrame frame(steps);
  steps.front()->plan(attention);
  const BatchPlanShape captured = attention.planShape();
  // The limits' grids: 160 / 64 whole tiles + one partial tile per
  // prefill sequence (at most 160 / 9), every sequence, two splits.
  EXPECT_EQ(captured.prefillTiles, 2 + 8);
  EXPECT_EQ(captured.decodeSequences, 8);
  EXPECT_EQ(captured.decodeSplits, 2);
  frame.load(*steps.front());

  const CudaDriver &driver = CudaDriver::get();
  ASSERT_TRUE(cudaGraphsAvailable(driver));
  cu::Stream stream = nullptr;
  driver.check(driver.api().streamCreate(&stream, 0), "cuStreamCreate");
  BatchRunOptions options;
  options.out = frame.outView;
  options.lse = frame.lseView;
  options.stream = stream;
  CudaGraphExec graph = captureGraph(driver, stream, [&] {
    attention.run(frame.qView, frame.kView, frame.vView, frame.bindings, options);
  });
  for (size_t i = 0; i < steps.size(); ++i) {
    SCOPED_TRACE("step " + std::to_string(i));
    const BatchStep &step = *steps[i];
    if (i > 0)
      step.plan(attention);
    const BatchPlanShape shape = attention.planShape();
    EXPECT_EQ(shape.prefillTiles, captured.prefillTiles);
    EXPECT_EQ(shape.decodeSequences, captured.decodeSequences);
    EXPECT_EQ(shape.decodeSplits, captured.decodeSplits);
    frame.load(step);
    graph.launch(stream);
    driver.check(driver.api().streamSynchronize(stream), "cuStreamSynchronize");
    auto [out, lse] = frame.results();
    BatchStepCheck check = step.compare(out.view(), lse.view(), /*cudaTolerance=*/true);
    EXPECT_STEP_MATCHES(check);
    EXPECT_EQ(check.rowsPastWritten, 0) << check.describe();
  }

  // A graph captured on a step with no new tokens holds the same launches
  // (their CTAs all exit) and replays the first step's work.
  const BatchStep &empty = *steps[3];
  ASSERT_EQ(empty.tokens, 0);
  empty.plan(attention);
  frame.load(empty);
  CudaGraphExec emptyGraph = captureGraph(driver, stream, [&] {
    attention.run(frame.qView, frame.kView, frame.vView, frame.bindings, options);
  });
  steps.front()->plan(attention);
  frame.load(*steps.front());
  emptyGraph.launch(stream);
  driver.check(driver.api().streamSynchronize(stream), "cuStreamSynchronize");
  auto [out, lse] = frame.results();
  BatchStepCheck check = steps.front()->compare(out.view(), lse.view(), /*cudaTolerance=*/true);
  EXPECT_STEP_MATCHES(check);
  driver.check(driver.api().streamDestroy(stream), "cuStreamDestroy");
}

/// An 8-bit cache's pair of scales first seen inside a capture: run()
/// would have to copy it to the device, which a capture forbids, so it
/// throws pagedc::Error saying what to do (the driver's bare copy error
/// otherwise) and the stream is left capturing nothing. uploadScales()
/// copies the pair before the capture; the captured run() then copies
/// nothing and the replay matches float64. Scales of the wrong count, and
/// uploadScales() on a 16-bit configuration, are refused by name.
TEST(CudaBatchAttention, Float8ScalesFirstSeenInsideACapture) {
  BatchStepCase c = mixedDocumentCase(360);
  c.seqs = {{3, 40}, {1, 70}, {20, 33}};
  c.kvFloat8 = DType::F8E5M2;
  c.qHeads = 4;
  c.kvHeads = 2;
  BatchStep step(c);
  BatchAttention attention(step.mods, cudaConfig(step));
  step.plan(attention);
  DeviceStep device(step);
  const CudaDriver &driver = CudaDriver::get();
  ASSERT_TRUE(cudaGraphsAvailable(driver));
  cu::Stream stream = nullptr;
  driver.check(driver.api().streamCreate(&stream, 0), "cuStreamCreate");
  BatchRunOptions options = device.options();
  options.stream = stream;
  auto capture = [&] {
    return captureGraph(driver, stream, [&] {
      attention.run(device.qView, device.kView, device.vView, device.bindings, options);
    });
  };
  try {
    capture();
    ADD_FAILURE() << "a new pair of scales inside a capture was not refused";
  } catch (const Error &error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("k_scale and v_scale"), std::string::npos) << message;
    EXPECT_NE(message.find("uploadScales()"), std::string::npos) << message;
  }
  EXPECT_EQ(streamCaptureStatus(driver, stream), cu::kStreamCaptureStatusNone);

  EXPECT_THROW(attention.uploadScales({1.0f, 2.0f, 3.0f}, device.vScale), Error);
  attention.uploadScales(device.kScale, device.vScale);
  CudaGraphExec graph = capture();
  graph.launch(stream);
  driver.check(driver.api().streamSynchronize(stream), "cuStreamSynchronize");
  auto [out, lse] = device.results();
  BatchStepCheck check = step.compare(out.view(), lse.view(), /*cudaTolerance=*/true);
  EXPECT_STEP_MATCHES(check);
  driver.check(driver.api().streamDestroy(stream), "cuStreamDestroy");

  BatchStepCase plain = c;
  plain.kvFloat8.reset();
  BatchStep plainStep(plain);
  BatchAttention sixteen(plainStep.mods, cudaConfig(plainStep));
  try {
    sixteen.uploadScales({1.0f}, {1.0f});
    ADD_FAILURE() << "uploadScales on a 16-bit configuration was not refused";
  } catch (const Error &error) {
    EXPECT_NE(std::string(error.what()).find("kv_dtype unset"), std::string::npos)
        << error.what();
  }
}

/// A prefix-LM mask (kv < prefix[b] or causal) whose per-sequence prefix
/// ends the kernels read from a buffer by the row's sequence: each ends
/// among its sequence's new tokens, so rows before it see later keys and
/// rows after it are causal, at a different place in every sequence. GQA 8
/// (the decode kernel's 8 heads x 8 speculative tokens fill its 64 rows),
/// shuffled pages of 128 (a 64-key tile is half a page), a 300-token chunk
/// at the end of a 421-key context, whole prompts (seq_len == q_len) and
/// sequences with no new tokens; D 64, bf16, NHD.
TEST(CudaBatchAttention, PrefixLmMaskGqa8PagesOf128) {
  BatchStepCase c;
  c.seqs = {{1, 150}, {8, 77}, {0, 40}, {300, 421}, {1, 1}, {61, 61}, {3, 260}, {0, 0}};
  c.qHeads = 8;
  c.kvHeads = 1;
  c.dim = c.vDim = 64;
  c.pageSize = 128;
  c.layout = KVLayout::NHD;
  c.storage = DType::BF16;
  c.mask = "prefix_lm";
  c.seed = 180;
  BatchStepCheck check = checkOnDevice(c);
  EXPECT_STEP_MATCHES(check);
}

// Issue 44's costly cases, which the extended tier's entry runs
// (unit.cuda-batch-attention-test.extended; the default entry filters
// them out).

/// A 1000-token chunk at the end of a 1337-key context beside a 300-token
/// one at the end of 700 keys, with decode and speculative rows around
/// them: GQA 8, shuffled pages of 128, D 128, f16, HND, the prefix-LM mask
/// and ALiBi (each row's own position counts).
/// MLA decode (templates/MlaDecode.cuh): one latent KV head of 576
/// columns whose first 512 are the values, v_cache a view of k_cache
/// (checkOnDevice checks the kernel was given K's address for both), the
/// caller's scale 1 / sqrt(192); Hq 16 and 32, 1- and 3-token steps,
/// contexts of 70 to 300 keys off the page grid, pages of 1, 16 and 64
/// shuffled, bf16 and f16, causal + soft-capping and holes (fully masked
/// rows) + ALiBi, sinks, and long contexts split and merged.
BatchStepCase mlaCase(int64_t qHeads, std::vector<BatchSeq> seqs, int32_t pageSize,
                      KVLayout layout, DType storage, const char *mask, const char *score,
                      uint64_t seed) {
  BatchStepCase c;
  c.seqs = std::move(seqs);
  c.qHeads = qHeads;
  c.kvHeads = 1;
  c.dim = 576;
  c.vDim = 512;
  c.valuesInKeys = true;
  c.scale = 1.0f / std::sqrt(192.0f);
  c.pageSize = pageSize;
  c.layout = layout;
  c.storage = storage;
  c.mask = mask;
  c.score = score;
  c.seed = seed;
  return c;
}

TEST(CudaBatchAttention, MlaDecodeFromTheLatentCache) {
  struct Variant {
    int64_t qHeads;
    std::vector<BatchSeq> seqs;
    int32_t pageSize;
    KVLayout layout;
    DType storage;
    const char *mask, *score;
    bool sinks, split;
  };
  const Variant variants[] = {
      {16, {{1, 70}, {3, 150}, {0, 12}, {1, 300}}, 16, KVLayout::NHD, DType::BF16, "causal",
       "softcap", false, false},
      {32, {{3, 95}, {1, 211}}, 1, KVLayout::Pagedc, DType::F16, "holes", "alibi", true, false},
      {16, {{1, 1000}, {3, 777}}, 64, KVLayout::HND, DType::BF16, "holes", "softcap", true, true},
  };
  uint64_t seed = 500;
  for (const Variant &v : variants) {
    BatchStepCase c =
        mlaCase(v.qHeads, v.seqs, v.pageSize, v.layout, v.storage, v.mask, v.score, ++seed);
    c.sinks = v.sinks;
    SCOPED_TRACE(fmt::format("Hq {} page {} {} {} {} + {}{}", v.qHeads, v.pageSize,
                             kvLayoutName(v.layout), dtypeName(v.storage), v.mask, v.score,
                             v.sinks ? ", sinks" : ""));
    BatchPlanShape shape;
    BatchStepCheck check = checkOnDevice(c, &shape);
    EXPECT_STEP_MATCHES(check);
    EXPECT_EQ(shape.decodeSplits > 1, v.split);
    if (std::string(v.mask) == "holes") {
      EXPECT_GT(check.maskedRows, 0) << check.describe();
    }
  }
}

/// The MLA grid covers the group's 8 tokens, but only the chunks of rows a
/// step's entries have do work: the split plan counts those. 40 decodes of
/// 4096 keys at Hq 16 are one working CTA each with 1 token, four with 8:
/// the 1-token step's working CTAs, splits included, fit one wave of the
/// device (one 124 KB CTA per SM), where counting the grid's empty chunks
/// planned as for the 8-token step (plan only: nothing runs).
TEST(CudaBatchAttention, MlaDecodeSplitsCountTheCtasThatWork) {
  const int32_t batch = 40, keys = 4096, pages = keys / 16;
  BatchAttentionConfig config;
  config.numQHeads = 16;
  config.numKVHeads = 1;
  config.headDim = 576;
  config.valueHeadDim = 512;
  config.pageSize = 16;
  config.layout = KVLayout::NHD;
  config.maxNumSeqs = batch;
  config.maxNumTokens = 8 * batch;
  config.maxBlocksPerSeq = pages;
  config.device = Device::cuda(0);
  config.dtype = DType::BF16;
  BatchAttention attention(testutil::makeTestMods("causal", ""), config);
  std::vector<int32_t> lens(batch, keys), table(static_cast<size_t>(batch * pages));
  std::iota(table.begin(), table.end(), 0);
  auto splitsWith = [&](int32_t tokens) {
    std::vector<int32_t> qsl(batch + 1);
    for (int32_t b = 0; b <= batch; ++b)
      qsl[b] = b * tokens;
    attention.plan(TensorView(qsl.data(), DType::I32, {batch + 1}),
                   TensorView(lens.data(), DType::I32, {batch}),
                   TensorView(table.data(), DType::I32, {batch, pages}));
    return attention.planShape().decodeSplits;
  };
  const int64_t one = splitsWith(1), eight = splitsWith(8);
  const int sms = cudaDeviceInfo(0).multiprocessors;
  EXPECT_LE(one * batch, sms) << "1-token splits " << one << " on " << sms << " SMs";
  EXPECT_NE(one, eight) << "1-token and 8-token splits " << one;
}

/// MLA decode's refusals on CUDA, each naming what the kernel takes;
/// nothing is written and the previous plan stays.
TEST(CudaBatchAttention, MlaDecodeRefusals) {
  BatchStepCase c = mlaCase(16, {{1, 40}, {2, 17}}, 16, KVLayout::NHD, DType::BF16, "causal", "",
                            520);
  BatchStep step(c);
  auto expectError = [&](auto call, const std::string &needle) {
    try {
      call();
      ADD_FAILURE() << "no error; expected one naming '" << needle << "'";
    } catch (const Error &error) {
      EXPECT_NE(std::string(error.what()).find(needle), std::string::npos)
          << "message: " << error.what() << "\nexpected: " << needle;
    }
  };
  const std::string takes = "the MLA decode kernel (head_dim 576) takes value_head_dim 512, "
                            "num_kv_heads 1 and 16-bit latent caches";
  BatchAttentionConfig config = cudaConfig(step);
  config.valueHeadDim = 448;
  expectError([&] { BatchAttention refused(step.mods, config); },
              "value_head_dim 448 on CUDA: " + takes);
  config = cudaConfig(step);
  config.numKVHeads = 2;
  config.numQHeads = 32;
  expectError([&] { BatchAttention refused(step.mods, config); },
              "num_kv_heads 2 on CUDA: " + takes);
  config = cudaConfig(step);
  config.kvDtype = DType::F8E4M3;
  expectError([&] { BatchAttention refused(step.mods, config); },
              "kv_dtype f8e4m3 on CUDA: " + takes);

  config = cudaConfig(step);
  config.maxNumTokens = 16;
  BatchAttention attention(step.mods, config);
  step.plan(attention);
  // A 9-token sequence (prefill): refused, the plan stays.
  std::vector<int32_t> qsl = {0, 9}, lens = {30};
  std::vector<int32_t> table(static_cast<size_t>(step.columns), 0);
  expectError(
      [&] {
        attention.plan(TensorView(qsl.data(), DType::I32, {2}),
                       TensorView(lens.data(), DType::I32, {1}),
                       TensorView(table.data(), DType::I32, {1, step.columns}));
      },
      "sequence 0 has 9 new tokens; MLA decode on CUDA (head_dim 576) takes at most 8");
  EXPECT_EQ(attention.numTokens(), step.tokens);
  DeviceStep device(step);
  // V in memory of its own, and V a view of K starting 64 columns in.
  DeviceBuffer separate(device.cache.size(), 0);
  TensorView ownV(separate.data(), DType::BF16, device.vView.shape(), device.vView.strides(),
                  Device::cuda(0));
  const std::string alias = "v_cache must be a view of k_cache on CUDA at head_dim 576";
  expectError(
      [&] { attention.run(device.qView, device.kView, ownV, device.bindings, device.options()); },
      alias);
  TensorView shifted(static_cast<char *>(device.kView.data()) + 128, DType::BF16,
                     device.vView.shape(), device.vView.strides(), Device::cuda(0));
  expectError(
      [&] {
        attention.run(device.qView, device.kView, shifted, device.bindings, device.options());
      },
      alias);
  auto [out, lse] = device.results();
  for (int64_t i = 0; i < lse.numel(); ++i)
    EXPECT_TRUE(std::isnan(lse.dataAs<float>()[i])) << i;
}

TEST(CudaBatchAttentionExtended, ChunksOf1000And300AtTheEndOfLongerContexts) {
  BatchStepCase c;
  c.seqs = {{1, 900}, {1000, 1337}, {5, 333}, {300, 700}, {0, 90}, {45, 45}};
  c.qHeads = 8;
  c.kvHeads = 1;
  c.dim = c.vDim = 128;
  c.pageSize = 128;
  c.layout = KVLayout::HND;
  c.storage = DType::F16;
  c.mask = "prefix_lm";
  c.score = "alibi";
  c.seed = 181;
  BatchStepCheck check = checkOnDevice(c);
  EXPECT_STEP_MATCHES(check);
}

/// Head dim 256 on shuffled pages of 128 (vLLM's one-tensor layout, bf16),
/// GQA 8: a 300-token chunk at the end of a 700-key context, long decode
/// contexts (split keys and the merge), a whole prompt and a sequence with
/// no new tokens, under "holes" (every row with (q + h) % 3 == 0 fully
/// masked; the tiles above head dim 128 recompute their mod rows) and
/// soft-capping.
TEST(CudaBatchAttentionExtended, HeadDim256OnPagesOf128) {
  BatchStepCase c;
  c.seqs = {{1, 1300}, {300, 700}, {4, 1100}, {0, 129}, {70, 70}};
  c.qHeads = 8;
  c.kvHeads = 1;
  c.dim = c.vDim = 256;
  c.pageSize = 128;
  c.layout = KVLayout::VLLM;
  c.storage = DType::BF16;
  c.mask = "holes";
  c.score = "softcap";
  c.seed = 182;
  BatchPlanShape shape;
  BatchStepCheck check = checkOnDevice(c, &shape);
  EXPECT_STEP_MATCHES(check);
  EXPECT_GT(check.maskedRows, 0) << check.describe();
  EXPECT_GT(shape.decodeSplits, 1);
}

} // namespace
