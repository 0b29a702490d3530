//===- EmuHeadDimTest.cpp - CUDA kernels at every head dim, on the emulator -===//
//
// The CUDA kernels at head dims that are multiples of 16 from 32 to 256,
// and value head dims (Dv) other than D (192 / 128, 64 / 160), executed on
// the SIMT emulator (PAGEDC_CUDA_DRIVER=emu) with every checker on, through
// the runtime's CUDA path: prefill, split-KV decode and 3-token
// decode, against the float64 reference (out and lse) on fresh random
// inputs: batch 2 with lengths off the page and tile grid, GQA 1 and 4,
// page sizes 1, 16 and 128, bf16 and f16, the causal mask, a mask that
// leaves rows fully masked, score mods, block masks. Head dims that are not
// powers of two have tiles of rows wider than their data (KernelCommon.cuh,
// kTileHeadDim) and partial copy trips, which the memory and
// initialisation checkers watch.
//
// By default each head dim of 32, 48, 64, 80, 96, 112, 128, 160, 192, 256
// (and the two Dv pairs) runs four variants that together take every value
// of every setting; $PAGEDC_MATRIX_FULL=1 runs the product of the settings
// (36 variants a head dim) and adds the other multiples of 16 and two more
// Dv pairs.
//
//===----------------------------------------------------------------------===//

#include "EmulatorEnvironment.h"
#include "AttentionCheck.h"
#include "TestMods.h"

#include "pagedc/CudaAttention.h"
#include "pagedc/CudaDriver.h"
#include "pagedc/Error.h"
#include "pagedc/KernelSource.h"

#include <fmt/format.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace {

using namespace pagedc;

struct Mode {
  const char *name;
  int64_t qLength;
  std::vector<int32_t> kvLengths;
  /// Decode splits the runtime's model is asked to multiply (the kernel
  /// option decode_split_factor), so that long sequences take several.
  int splitFactor;
};

const Mode kPrefill{"prefill", 37, {45, 83}, 1};
const Mode kSplitDecode{"split-decode", 1, {333, 701}, 8};
const Mode kTokenDecode{"3-token-decode", 3, {29, 150}, 1};

struct Variant {
  const Mode *mode;
  int32_t pageSize;
  int gqa;
  DType dtype;
  const char *mask;
  const char *score;
  bool withBlockMask;
};

bool fullMatrix() {
  const char *fullText = std::getenv("PAGEDC_MATRIX_FULL");
  return fullText && std::string(fullText) == "1";
}

std::vector<Variant> variants() {
  if (!fullMatrix())
    return {
        {&kPrefill, 16, 4, DType::BF16, "causal", "", false},
        {&kPrefill, 1, 1, DType::F16, "holes", "softcap", true},
        {&kSplitDecode, 128, 4, DType::BF16, "holes", "alibi", false},
        {&kTokenDecode, 16, 1, DType::F16, "causal", "alibi", true},
    };
  std::vector<Variant> all;
  int index = 0;
  for (const Mode *mode : {&kPrefill, &kSplitDecode, &kTokenDecode})
    for (int32_t pageSize : {1, 16, 128})
      for (int gqa : {1, 4})
        for (DType dtype : {DType::BF16, DType::F16}) {
          ++index;
          all.push_back({mode, pageSize, gqa, dtype, index % 2 ? "holes" : "causal",
                         index % 3 == 0 ? "softcap" : index % 3 == 1 ? "alibi" : "",
                         index % 4 < 2});
        }
  return all;
}

struct Dims {
  int64_t dim;
  int64_t vDim;
  /// Run only with PAGEDC_MATRIX_FULL=1.
  bool fullOnly = false;
};

class EmuHeadDimTest : public ::testing::TestWithParam<Dims> {};

TEST_P(EmuHeadDimTest, KernelsMatchFloat64Reference) {
  const Dims dims = GetParam();
  if (dims.fullOnly && !fullMatrix())
    GTEST_SKIP() << "with PAGEDC_MATRIX_FULL=1 only";
  int64_t masked = 0;
  int variantIndex = 0;
  for (const Variant &v : variants()) {
    ++variantIndex;
    CompiledMods mods = testutil::makeTestMods(v.mask, v.score);
    testutil::AttentionConfig config;
    config.device = Device::cuda(0);
    config.batch = static_cast<int64_t>(v.mode->kvLengths.size());
    config.kvHeads = v.gqa == 1 ? 2 : 1;
    config.qHeads = config.kvHeads * v.gqa;
    config.qLength = v.mode->qLength;
    config.kvLengths = v.mode->kvLengths;
    config.qOffsetAtEnd = true;
    config.dim = dims.dim;
    config.vDim = dims.vDim;
    config.pageSize = v.pageSize;
    config.storage = v.dtype;
    config.withLse = true;
    config.withBlockMask = v.withBlockMask;
    config.qBlockSize = 32;
    config.kvBlockSize = 64;
    config.range = 2.0f;
    config.seed = static_cast<uint64_t>(dims.dim * 1000 + dims.vDim * 10 + variantIndex);
    int32_t positions = static_cast<int32_t>(v.mode->qLength);
    for (int32_t length : v.mode->kvLengths)
      positions = std::max(positions, length);
    testutil::TestBindings bindings(config.batch, config.qHeads, positions, config.seed);
    const std::string label =
        fmt::format("d{} dv{} {} page {} gqa {} {} mask '{}' score '{}'{}", dims.dim, dims.vDim,
                    v.mode->name, v.pageSize, v.gqa, dtypeName(v.dtype), v.mask, v.score,
                    v.withBlockMask ? " block mask" : "");
    // The checks' CUDA calls take the kernel options of the environment.
    ::setenv("PAGEDC_DECODE_SPLIT_FACTOR", std::to_string(v.mode->splitFactor).c_str(), 1);
    try {
      testutil::AttentionCheckResult result =
          testutil::checkPagedAttention(mods, bindings.context(), config);
      masked += result.maskedRows;
      EXPECT_TRUE(result.ok()) << label << ": " << result.describe();
      EXPECT_EQ(result.nonFinite, 0) << label;
    } catch (const Error &error) {
      ADD_FAILURE() << label << ": " << error.what();
    }
    ::unsetenv("PAGEDC_DECODE_SPLIT_FACTOR");
  }
  EXPECT_GT(masked, 0) << "no variant had a fully masked row";
}

std::string dimsName(const ::testing::TestParamInfo<Dims> &info) {
  return info.param.dim == info.param.vDim
             ? fmt::format("d{}", info.param.dim)
             : fmt::format("d{}_dv{}", info.param.dim, info.param.vDim);
}

INSTANTIATE_TEST_SUITE_P(HeadDims, EmuHeadDimTest,
                         ::testing::Values(Dims{32, 32}, Dims{48, 48}, Dims{64, 64}, Dims{80, 80},
                                           Dims{96, 96}, Dims{112, 112}, Dims{128, 128},
                                           Dims{160, 160}, Dims{192, 192}, Dims{256, 256},
                                           Dims{192, 128}, Dims{64, 160},
                                           Dims{144, 144, true}, Dims{176, 176, true},
                                           Dims{208, 208, true}, Dims{224, 224, true},
                                           Dims{240, 240, true}, Dims{128, 64, true},
                                           Dims{32, 256, true}),
                         dimsName);

/// A head dim the kernels do not take is an error that lists those they do.
TEST(EmuHeadDimErrors, UnsupportedHeadDimNamesTheSupportedOnes) {
  for (int64_t dim : {16, 40, 72, 264}) {
    CompiledMods mods = testutil::makeTestMods("causal", "");
    testutil::AttentionConfig config;
    config.device = Device::cuda(0);
    config.dim = config.vDim = dim;
    config.storage = DType::BF16;
    testutil::TestBindings bindings(config.batch, config.qHeads, 64, 1);
    try {
      testutil::checkPagedAttention(mods, bindings.context(), config);
      ADD_FAILURE() << "head dim " << dim << " ran";
    } catch (const Error &error) {
      const std::string what = error.what();
      EXPECT_NE(what.find(std::to_string(dim)), std::string::npos) << what;
      EXPECT_NE(what.find("multiples of 16 from 32 to 256"), std::string::npos) << what;
    }
  }
}

/// flexAttention at MLA's widths (D 576, Dv 512) is refused with a pointer
/// to BatchAttention, which runs MLA decode.
TEST(EmuHeadDimErrors, MlaWidthsPointToTheBatchCall) {
  CompiledMods mods = testutil::makeTestMods("causal", "");
  testutil::AttentionConfig config;
  config.device = Device::cuda(0);
  config.kvHeads = 1;
  config.dim = 576;
  config.vDim = 512;
  config.qLength = 1;
  config.storage = DType::BF16;
  testutil::TestBindings bindings(config.batch, config.qHeads, 64, 1);
  try {
    testutil::checkPagedAttention(mods, bindings.context(), config);
    ADD_FAILURE() << "head dim 576 ran";
  } catch (const Error &error) {
    const std::string what = error.what();
    EXPECT_NE(what.find("not 576; MLA decode (head dim 576, the values the latent rows' first "
                        "512 columns) runs through BatchAttention"),
              std::string::npos)
        << what;
  }
}

/// The warpgroup prefill keeps its head dims; KernelConfig names the
/// mma.sync tiles for the others, and an sm_90 target picks them there.
TEST(EmuHeadDimErrors, WarpgroupTilesTakeTheirOwnHeadDims) {
  KernelConfig config;
  config.headDim = 96;
  config.blockM = 128;
  config.blockN = 64;
  config.warpRows = 64;
  try {
    config.validate();
    ADD_FAILURE() << "warpgroup tiles at head dim 96 validated";
  } catch (const Error &error) {
    EXPECT_NE(std::string(error.what()).find("64, 128 and 256"), std::string::npos)
        << error.what();
  }
  for (int dim : {32, 80, 96, 112, 160, 192}) {
    KernelConfig chosen;
    chosen.headDim = dim;
    chosen.choosePrefillShapeFor("sm_90");
    EXPECT_NE(chosen.warpRows, 64) << dim;
    EXPECT_FALSE(chosen.needsSm90a()) << dim;
    EXPECT_NO_THROW(chosen.validate()) << dim;
  }
  for (int dim : {64, 128, 256}) {
    KernelConfig chosen;
    chosen.headDim = dim;
    chosen.choosePrefillShapeFor("sm_90");
    EXPECT_EQ(chosen.warpRows, 64) << dim;
  }
}

} // namespace
