//===- CudaFloat8Test.cpp - 8-bit float KV caches on the CUDA decode ------===//
//
// flexAttention over f8e4m3 and f8e5m2 caches on a CUDA device (the decode
// kernel, the prefill's mma.sync tiles and its warpgroup tiles), run on the
// SIMT emulator (PAGEDC_CUDA_DRIVER=emu) with every checker on (memcheck,
// racecheck, initcheck, synccheck: a report fails the launch and so the
// case), against the float64 reference computed on the dequantized values
// (code x scale): per-tensor and per-head scales, bf16 and f16 q, prefill
// (45 and 70 query rows), 1- and 3-token decode, split-KV (the split factor
// raised), pages of 1, 16 and 128 slots in shuffled order, GQA 1 and 4, head
// dims 32 to 192 (and D 192 with Dv 128; 64, 128 and 256 on the warpgroup
// prefill), lengths that are not multiples of the page or the tile, mask and
// score mods, fully masked rows, out and lse; attention sinks with 8-bit
// caches (decode with one split and several, 3-token decode, prefill); and
// the refusals (values on the device, missing or bad scales), which leave
// out as it was.
//
//===----------------------------------------------------------------------===//
#include "EmulatorEnvironment.h"
#include "AttentionCheck.h"
#include "SinkReference.h"
#include "TestMods.h"
#include "cpu/Reference.h"

#include "pagedc/Attention.h"
#include "pagedc/CudaAttention.h"
#include "pagedc/CudaDriver.h"
#include "pagedc/Error.h"
#include "pagedc/KVCache.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

namespace {

using namespace pagedc;

constexpr int64_t kKvHeads = 2;
constexpr int64_t kDocumentLength = 1024;

struct Case {
  DType kvType;
  bool perHead;
  DType qType;
  int64_t headDim, pageSize, qHeads, qLength;
  std::vector<int32_t> lengths;
  std::string mask, score;
  int splitFactor; // 0: the planner's choice
  /// > 0: a block mask of the mask mod with kv blocks of this many keys (q
  /// blocks of 16): tiles no row sees are skipped, and in partial ones the
  /// kv rows no row keeps are zero-filled instead of read.
  int32_t kvBlock = 0;
  /// Attention sinks on the device, one per query head (sinkValues).
  bool sinks = false;
  /// The prefill_shape kernel option ("": the runtime's choice, on the
  /// emulator's sm_90a the warpgroup tiles).
  std::string prefillShape;
  /// > 0: the warpgroup prefill on this many persistent CTAs (each takes
  /// query tiles from the work counter, or in fixed rounds when
  /// `fixedRounds`), so that one CTA's producer converts the codes of
  /// several query tiles' visits.
  int persistentCtas = 0;
  bool fixedRounds = false;
  /// V's head dim (Dv); 0: headDim.
  int64_t valueDim = 0;
  int64_t vDim() const { return valueDim ? valueDim : headDim; }
};

/// Per query head, in turn: far above every score (a fully masked row's
/// lse is the sink), negligible, and two of the scores' own size.
std::vector<float> sinkValues(int64_t heads) {
  const float pattern[] = {16.0f, -40.0f, 3.0f, 0.5f};
  std::vector<float> sinks(static_cast<size_t>(heads));
  for (int64_t h = 0; h < heads; ++h)
    sinks[h] = pattern[h % 4];
  return sinks;
}

std::string label(const Case &c) {
  return fmt::format("{} {} scales, q {}, D {}{}, pages of {}, Hq {}, Lq {}, mods '{}' '{}', "
                     "split factor {}, kv blocks {}{}, prefill shape '{}', persistent CTAs {}{}",
                     dtypeName(c.kvType), c.perHead ? "per-head" : "per-tensor", dtypeName(c.qType),
                     c.headDim, c.valueDim ? fmt::format(" Dv {}", c.valueDim) : "", c.pageSize,
                     c.qHeads, c.qLength, c.mask, c.score, c.splitFactor, c.kvBlock,
                     c.sinks ? ", sinks" : "", c.prefillShape, c.persistentCtas,
                     c.fixedRounds ? " (fixed rounds)" : "");
}

template <typename F> std::string errorOf(F call) {
  try {
    call();
  } catch (const Error &error) {
    return error.what();
  }
  return "(no error)";
}

uint16_t toElement(float value, DType type) {
  return type == DType::BF16 ? floatToBF16(value) : floatToHalf(value);
}
float fromElement(uint16_t bits, DType type) {
  return type == DType::BF16 ? bf16ToFloat(bits) : halfToFloat(bits);
}

/// A CUDA 8-bit cache holding random values for every slot's first
/// lengths[b] positions, its pages taken in shuffled order (a scratch slot
/// takes pages and frees them first, the slots then take pages in turns),
/// and the values dequantized from the codes the rule gives, f64
/// [B, Hkv, max length, D] (V's Dv).
struct Float8Cache {
  std::unique_ptr<PagedKVCache> cache;
  HostTensor k, v;
};

Float8Cache makeCache(const Case &c, std::mt19937 &rng) {
  const int64_t batch = static_cast<int64_t>(c.lengths.size()), dim = c.headDim, vDim = c.vDim();
  int64_t longest = 0, pages = 0;
  for (int32_t n : c.lengths) {
    longest = std::max<int64_t>(longest, n);
    pages += (n + c.pageSize - 1) / c.pageSize;
  }
  KVCacheConfig config;
  config.numPages = pages + 7;
  config.pageSize = c.pageSize;
  config.maxBatch = batch + 1;
  config.heads = kKvHeads;
  config.headDim = dim;
  config.valueHeadDim = vDim;
  config.dtype = c.kvType;
  config.device = Device::cuda(0);
  config.kScale = c.perHead ? std::vector<float>{0.011f, 0.023f} : std::vector<float>{0.013f};
  config.vScale = c.perHead ? std::vector<float>{0.017f, 0.007f} : std::vector<float>{0.019f};
  Float8Cache made;
  made.cache = std::make_unique<PagedKVCache>(config);
  PagedKVCache &cache = *made.cache;
  cache.reserve(batch, std::min<int64_t>(pages + 7, 5) * c.pageSize);
  cache.erase(batch);
  for (int64_t n = c.pageSize; n < longest + c.pageSize; n += c.pageSize)
    for (int64_t b = batch - 1; b >= 0; --b)
      cache.reserve(b, std::min<int64_t>(n, c.lengths[b]));

  made.k = HostTensor(DType::F64, {batch, kKvHeads, longest, dim});
  made.v = HostTensor(DType::F64, {batch, kKvHeads, longest, vDim});
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t n = c.lengths[b];
    HostTensor k(DType::F32, {1, kKvHeads, n, dim}), v(DType::F32, {1, kKvHeads, n, vDim});
    for (HostTensor *t : {&k, &v})
      for (int64_t i = 0; i < t->numel(); ++i)
        t->dataAs<float>()[i] = normal(rng);
    std::vector<int32_t> slot{static_cast<int32_t>(b)}, positions(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      positions[i] = static_cast<int32_t>(i);
    cache.assign(TensorView(slot.data(), DType::I32, {1}),
                 TensorView(positions.data(), DType::I32, {1, n}), k.view(), v.view());
    auto dequantized = [&](float value, float scale) {
      return double(float8ToFloat(floatToFloat8(value / scale, c.kvType), c.kvType)) * scale;
    };
    for (int64_t h = 0; h < kKvHeads; ++h)
      for (int64_t i = 0; i < n; ++i) {
        const int64_t at = (b * kKvHeads + h) * longest + i;
        for (int64_t d = 0; d < dim; ++d)
          made.k.dataAs<double>()[at * dim + d] =
              dequantized(k.dataAs<float>()[(h * n + i) * dim + d], cache.kScale()[h]);
        for (int64_t d = 0; d < vDim; ++d)
          made.v.dataAs<double>()[at * vDim + d] =
              dequantized(v.dataAs<float>()[(h * n + i) * vDim + d], cache.vScale()[h]);
      }
  }
  return made;
}

/// The test mods' declarations, bound on the host (for the reference) and
/// on the device (for the kernels).
struct ModBindings {
  std::vector<int32_t> documents;
  std::vector<float> slopes;
  DeviceBuffer documentsOnDevice, slopesOnDevice;
  Bindings host, device;

  ModBindings(int64_t batch, int64_t qHeads, std::mt19937 &rng) {
    documents.resize(static_cast<size_t>(batch * kDocumentLength));
    for (int64_t b = 0; b < batch; ++b) {
      int32_t document = 0;
      for (int64_t i = 0; i < kDocumentLength; ++i) {
        if (rng() % 37 == 0)
          ++document;
        documents[b * kDocumentLength + i] = document;
      }
    }
    for (int64_t h = 0; h < qHeads; ++h)
      slopes.push_back(std::exp2(-8.0f * float(h + 1) / float(qHeads)));
    documentsOnDevice = DeviceBuffer(documents.size() * 4, 0);
    documentsOnDevice.upload(documents.data(), documents.size() * 4);
    slopesOnDevice = DeviceBuffer(slopes.size() * 4, 0);
    slopesOnDevice.upload(slopes.data(), slopes.size() * 4);
    for (Bindings *bindings : {&host, &device}) {
      bindings->params["softcap"] = ParamValue::ofF32(2.0f);
      bindings->params["window"] = ParamValue::ofI32(37);
      bindings->params["temperature"] = ParamValue::ofF32(1.5f);
    }
    host.buffers["doc"] = TensorView(documents.data(), DType::I32, {batch, kDocumentLength});
    host.buffers["slopes"] = TensorView(slopes.data(), DType::F32, {qHeads});
    device.buffers["doc"] =
        TensorView(documentsOnDevice.data(), DType::I32, {batch, kDocumentLength}, Device::cuda(0));
    device.buffers["slopes"] =
        TensorView(slopesOnDevice.data(), DType::F32, {qHeads}, Device::cuda(0));
  }
};

void checkCase(const Case &c, uint32_t seed) {
  SCOPED_TRACE(label(c));
  std::mt19937 rng(seed);
  Float8Cache made = makeCache(c, rng);
  const int64_t batch = static_cast<int64_t>(c.lengths.size()), dim = c.headDim, vDim = c.vDim();
  const int64_t rows = batch * c.qHeads * c.qLength;

  // q in the kernel's element type; the reference reads the same values.
  std::vector<uint16_t> qBits(static_cast<size_t>(rows * dim));
  HostTensor qValues(DType::F32, {batch, c.qHeads, c.qLength, dim});
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (size_t i = 0; i < qBits.size(); ++i) {
    qBits[i] = toElement(uniform(rng), c.qType);
    qValues.dataAs<float>()[i] = fromElement(qBits[i], c.qType);
  }
  const Device device = Device::cuda(0);
  DeviceBuffer q(qBits.size() * 2, 0), out(size_t(rows * vDim) * 2, 0), lse(size_t(rows) * 4, 0);
  q.upload(qBits.data(), q.size());
  out.fill(0xff); // NaN
  lse.fill(0xff);

  ModBindings bindings(batch, c.qHeads, rng);
  CompiledMods mods = testutil::makeTestMods(c.mask, c.score);
  AttentionOptions options;
  options.kvLength = c.lengths;
  for (int32_t n : c.lengths)
    options.qOffset.push_back(n - static_cast<int32_t>(c.qLength));
  options.out = TensorView(out.data(), c.qType, {batch, c.qHeads, c.qLength, vDim}, device);
  options.lse = TensorView(lse.data(), DType::F32, {batch, c.qHeads, c.qLength}, device);
  if (c.splitFactor)
    options.kernel.decodeSplitFactor = c.splitFactor;
  if (!c.prefillShape.empty())
    options.kernel.prefillShape = c.prefillShape;
  if (c.persistentCtas > 0) {
    options.kernel.prefillPersistent = true;
    options.kernel.prefillPersistentCtas = c.persistentCtas;
    options.kernel.prefillTileCounter = !c.fixedRounds;
  }
  const std::vector<float> sinks = c.sinks ? sinkValues(c.qHeads) : std::vector<float>();
  DeviceBuffer sinksOnDevice(std::max<size_t>(sinks.size(), 1) * 4, 0);
  if (c.sinks) {
    sinksOnDevice.upload(sinks.data(), sinks.size() * 4);
    options.sinks = TensorView(sinksOnDevice.data(), DType::F32, {c.qHeads}, device);
  }
  ResolvedBindings resolved = resolveBindings(mods, bindings.host, Device::cpu());
  BlockMask blockMask;
  if (c.kvBlock > 0) {
    int64_t qEnd = 0, kvEnd = 0;
    for (int64_t b = 0; b < batch; ++b) {
      qEnd = std::max<int64_t>(qEnd, options.qOffset[b] + c.qLength);
      kvEnd = std::max<int64_t>(kvEnd, c.lengths[b]);
    }
    blockMask = testutil::buildDenseBlockMask(mods, &resolved.context(), batch, c.qHeads, qEnd,
                                              kvEnd, 16, c.kvBlock);
  }
  flexAttention(TensorView(q.data(), c.qType, {batch, c.qHeads, c.qLength, dim}, device),
                *made.cache, c.kvBlock > 0 ? &blockMask : nullptr, mods, bindings.device, options);
  std::vector<uint16_t> outBits(static_cast<size_t>(rows * vDim));
  std::vector<float> lseValues(static_cast<size_t>(rows));
  out.download(outBits.data(), out.size());
  lse.download(lseValues.data(), lse.size());

  cpu::ReferenceArgs ref;
  ref.q = qValues.view();
  ref.k = made.k.view();
  ref.v = made.v.view();
  ref.kvLength = options.kvLength.data();
  ref.qOffset = options.qOffset.data();
  ref.mods = &mods;
  ref.context = &resolved.context();
  ref.scale = 1.0 / std::sqrt(double(dim));
  cpu::ReferenceResult expected = cpu::referenceAttention(ref);

  // Out: the kernel's P.V rounds P to the element type and out is stored
  // in it (2^-8 relative for bf16, 2^-11 for f16); lse is f32 throughout.
  const double outTolerance = c.qType == DType::BF16 ? 1.5e-2 : 3e-3;
  double maxOut = 0, maxLse = 0, largest = 0;
  int nonFinite = 0, masked = 0;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < c.qHeads; ++h)
      for (int64_t i = 0; i < c.qLength; ++i) {
        const int64_t row = (b * c.qHeads + h) * c.qLength + i;
        double lseExpected = expected.lseAt(b, h, i);
        std::vector<double> wanted(static_cast<size_t>(vDim));
        for (int64_t d = 0; d < vDim; ++d)
          wanted[d] = expected.outAt(b, h, i, d);
        masked += std::isinf(lseExpected);
        if (c.sinks)
          testutil::applySink(sinks[h], lseExpected, wanted.data(), vDim);
        if (std::isinf(lseExpected))
          nonFinite += !(std::isinf(lseValues[row]) && lseValues[row] < 0);
        else
          maxLse = std::max(maxLse, std::abs(lseValues[row] - lseExpected));
        for (int64_t d = 0; d < vDim; ++d) {
          const double value = fromElement(outBits[row * vDim + d], c.qType);
          const double want = wanted[d];
          if (!std::isfinite(value))
            ++nonFinite;
          maxOut = std::max(maxOut, std::abs(value - want) / std::max(1.0, std::abs(want)));
          largest = std::max(largest, std::abs(want));
        }
      }
  EXPECT_EQ(nonFinite, 0);
  EXPECT_LE(maxOut, outTolerance);
  EXPECT_LE(maxLse, 2e-3);
  EXPECT_GT(largest, 0.05); // the outputs are not all near zero
  if (c.mask == "holes") {
    EXPECT_GT(masked, 0); // fully masked rows (with sinks: whose lse is the sink alone)
  }
  std::printf("[ fp8 ] %s: out error %.2e, lse error %.2e\n", label(c).c_str(), maxOut, maxLse);
}

TEST(CudaFloat8, DecodeMatchesFloat64OnDequantizedValues) {
  const Case cases[] = {
      // Split-KV (factor 4) over long contexts, GQA 4, per-head scales.
      {DType::F8E4M3, true, DType::BF16, 128, 16, 8, 1, {1100, 17, 900}, "causal", "softcap", 4},
      {DType::F8E5M2, false, DType::BF16, 128, 16, 8, 1, {129, 64, 77}, "causal", "softcap", 0},
      // Pages of one slot, 3-token decode, GQA 1, a sliding window.
      {DType::F8E4M3, false, DType::F16, 64, 1, 2, 3, {45, 161, 50}, "sliding", "", 0},
      {DType::F8E5M2, true, DType::BF16, 128, 1, 8, 1, {70, 133}, "document", "alibi", 2},
      // Pages of 128 slots, lengths under and over one page.
      {DType::F8E5M2, true, DType::F16, 64, 128, 2, 3, {1000, 129, 5}, "", "", 3},
      {DType::F8E4M3, true, DType::BF16, 128, 128, 8, 3, {700, 200}, "causal", "", 4},
      // Block masks: a sliding window's partial blocks (rows outside it
      // zero-filled, not read) and skipped ones, split-KV.
      {DType::F8E5M2, true, DType::BF16, 128, 16, 8, 1, {500, 301}, "sliding", "", 2, 64},
      {DType::F8E4M3, false, DType::F16, 64, 1, 2, 3, {260, 97}, "sliding", "softcap", 0, 128},
  };
  uint32_t seed = 7;
  for (const Case &c : cases)
    checkCase(c, seed++);
}

TEST(CudaFloat8, PrefillMatchesFloat64OnDequantizedValues) {
  // The prefill's mma.sync tiles: q rows not a multiple of the tile, keys
  // not a multiple of the page, chunks at the end of a longer context.
  const std::string mma = "64x64x16";
  const Case cases[] = {
      {DType::F8E4M3, true, DType::BF16, 128, 16, 8, 45, {45, 161, 70}, "causal", "softcap", 0, 0,
       false, mma},
      {DType::F8E5M2, false, DType::F16, 64, 1, 2, 70, {70, 99}, "sliding", "", 0, 0, false, mma},
      {DType::F8E5M2, true, DType::BF16, 64, 128, 8, 45, {300, 45}, "document", "alibi", 0, 0,
       false, mma},
      {DType::F8E4M3, false, DType::F16, 128, 128, 2, 70, {200, 129}, "", "", 0, 0, false, mma},
      {DType::F8E5M2, true, DType::BF16, 128, 16, 8, 70, {300, 70}, "sliding", "", 0, 64, false,
       mma},
  };
  uint32_t seed = 70;
  for (const Case &c : cases)
    checkCase(c, seed++);
}

/// Head dims whose code rows are not multiples of 64 bytes (a row's 16-code
/// chunks do not fill the copier's threads, the tile rows are wider than
/// the data) and K rows wider than V's (D 192, Dv 128): decode, 3-token
/// decode, split-KV and the prefill, fully masked rows ("holes").
TEST(CudaFloat8, HeadDimsNotMultiplesOf64AndNarrowerValues) {
  const Case cases[] = {
      {DType::F8E4M3, true, DType::BF16, 80, 16, 8, 1, {300, 77, 161}, "causal", "softcap", 3},
      {DType::F8E5M2, false, DType::F16, 96, 1, 2, 3, {45, 130}, "holes", "", 0},
      {DType::F8E4M3, true, DType::BF16, 112, 128, 8, 45, {300, 45}, "document", "alibi", 0},
      {DType::F8E5M2, true, DType::BF16, 192, 16, 8, 1, {1100, 70}, "holes", "", 4, 0, false, "", 0,
       false, 128},
      {DType::F8E4M3, false, DType::F16, 192, 1, 2, 70, {70, 99}, "sliding", "", 0, 0, false, "", 0,
       false, 128},
      {DType::F8E5M2, true, DType::F16, 80, 128, 2, 45, {45, 200}, "holes", "softcap", 0},
      // Two code chunks a row: more threads than the tile's rows need.
      {DType::F8E4M3, true, DType::BF16, 32, 16, 8, 45, {45, 100}, "causal", "", 0},
  };
  uint32_t seed = 110;
  for (const Case &c : cases)
    checkCase(c, seed++);
}

/// The warpgroup prefill (sm_90a; the runtime's tiles on an H100, asked
/// for here since the emulator's target is not one): the producer loads
/// codes into registers and converts them into the wgmma's swizzled 16-bit
/// tiles. The tiles the runtime takes: 128 x 128 at D 64 and 128, 128 x 64
/// at D 256 (batches of 2 rows a thread), and 64 x 32 (one consumer
/// warpgroup, its spill fallback at D 256: batches of 4 rows); rows whose
/// keys are all masked ("holes").
TEST(CudaFloat8, WarpgroupPrefillMatchesFloat64OnDequantizedValues) {
  const std::string wide = "128x128x64", d256 = "128x64x64", narrow = "64x32x64";
  const Case cases[] = {
      {DType::F8E4M3, true, DType::BF16, 128, 16, 8, 70, {200, 70}, "causal", "softcap", 0, 0,
       false, wide},
      {DType::F8E5M2, false, DType::F16, 128, 128, 2, 45, {300, 45}, "document", "alibi", 0, 0,
       false, wide},
      {DType::F8E5M2, true, DType::F16, 64, 16, 8, 70, {161, 90}, "holes", "", 0, 0, false, wide},
      {DType::F8E4M3, false, DType::BF16, 64, 128, 2, 45, {129, 200}, "causal", "", 0, 0, false,
       wide},
      {DType::F8E4M3, true, DType::F16, 256, 16, 8, 45, {99, 45}, "causal", "alibi", 0, 0, false,
       d256},
      {DType::F8E5M2, false, DType::BF16, 256, 128, 2, 70, {150, 70}, "holes", "softcap", 0, 0,
       false, d256},
      {DType::F8E4M3, true, DType::BF16, 256, 16, 2, 45, {77, 130}, "document", "", 0, 0, false,
       narrow},
      // Persistent CTAs: 3 CTAs take the 16 query tiles (GQA 4: the KV
      // head, and so the K scale, changes between a CTA's tiles), from the
      // work counter and in fixed rounds.
      {DType::F8E5M2, true, DType::BF16, 128, 16, 8, 70, {200, 90}, "causal", "softcap", 0, 0,
       false, wide, 3},
      {DType::F8E4M3, true, DType::F16, 256, 16, 8, 70, {150, 70}, "causal", "", 0, 0, false,
       d256, 3, true},
  };
  uint32_t seed = 80;
  for (const Case &c : cases)
    checkCase(c, seed++);
}

/// Attention sinks with 8-bit caches: the decode kernel's epilogue (one
/// split) and its merge (several), 3-token decode, and the prefill's
/// mma.sync tiles fold each head's sink into rows of dequantized values;
/// fully masked rows ("holes") give out 0 and lse the sink.
TEST(CudaFloat8, SinksWithFloat8Caches) {
  const Case cases[] = {
      {DType::F8E4M3, true, DType::BF16, 64, 16, 8, 1, {45, 83}, "holes", "", 1, 0, true},
      {DType::F8E5M2, false, DType::F16, 128, 16, 8, 3, {700, 333}, "holes", "alibi", 4, 0, true},
      {DType::F8E5M2, true, DType::BF16, 64, 1, 8, 45, {45, 161}, "holes", "softcap", 0, 0, true,
       "64x64x16"},
      {DType::F8E4M3, false, DType::F16, 128, 16, 8, 45, {45, 161}, "holes", "", 0, 0, true,
       "128x128x64"},
  };
  uint32_t seed = 90;
  for (const Case &c : cases)
    checkCase(c, seed++);
}

TEST(CudaFloat8, RefusalsNameTheProblem) {
  Case c{DType::F8E4M3, true, DType::BF16, 64, 16, 2, 9, {40}, "causal", "", 0};
  std::mt19937 rng(3);
  Float8Cache made = makeCache(c, rng);
  const Device device = Device::cuda(0);
  DeviceBuffer q(size_t(2 * 9 * 64) * 2, 0);
  std::vector<uint16_t> zeros(q.size() / 2, floatToBF16(0.25f));
  q.upload(zeros.data(), q.size());

  // Values on the device: an 8-bit cache quantizes host values.
  std::vector<int32_t> slot{0}, positions{0};
  const std::string onDevice = errorOf([&] {
    made.cache->assign(TensorView(slot.data(), DType::I32, {1}),
                       TensorView(positions.data(), DType::I32, {1, 1}),
                       TensorView(q.data(), DType::BF16, {1, 2, 1, 64}, device),
                       TensorView(q.data(), DType::BF16, {1, 2, 1, 64}, device));
  });
  EXPECT_NE(onDevice.find("takes values in host memory"), std::string::npos) << onDevice;

  // Scales: missing, zero, negative, not finite.
  KVCacheConfig config;
  config.numPages = 4;
  config.heads = 2;
  config.dtype = DType::F8E5M2;
  config.device = device;
  auto withScales = [&](std::vector<float> k, std::vector<float> v) {
    KVCacheConfig given = config;
    given.kScale = std::move(k);
    given.vScale = std::move(v);
    return errorOf([&] { PagedKVCache cache(given); });
  };
  EXPECT_NE(withScales({}, {1.0f}).find("an f8e5m2 cache needs k_scale"), std::string::npos);
  EXPECT_NE(withScales({1.0f}, {0.0f}).find("v_scale[0] = 0 must be finite and greater than 0"),
            std::string::npos);
  EXPECT_NE(withScales({1.0f, -2.0f}, {1.0f}).find("k_scale[1] = -2"), std::string::npos);
  EXPECT_NE(withScales({INFINITY}, {1.0f}).find("k_scale[0] = inf"), std::string::npos);
  EXPECT_NE(withScales({1.0f}, {NAN}).find("v_scale[0] = nan"), std::string::npos);
}

} // namespace
