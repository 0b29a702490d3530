//===- EmuCorpusMatrixTest.cpp - Every corpus mod, CUDA kernels vs float64 -===//
//
// The correctness matrix of the CUDA kernels, executed on the SIMT emulator
// (PAGEDC_CUDA_DRIVER=emu, set before anything touches the driver) through
// the runtime's CUDA backend with every checker on: every mod of
// examples/*.attn, compiled with its CUDA code, x prefill / decode /
// 3-token decode x page sizes 1, 16, 128 (shuffled page tables) x GQA 1 and
// 4 x bf16 and f16 x head dims 64 and 128, lengths off the tile and page
// grid, half of the runs with a block mask, lse on; outputs against the
// float64 reference on fresh random inputs. A checker report fails the
// launch and so the case. ctest also runs the prefill mode with warpgroup
// tiles (PrefillWgmma.cuh, the kernel option prefill_shape=128x64x64 that
// its ctest ENVIRONMENT sets as $PAGEDC_PREFILL_SHAPE; and 128x128x64
// with $PAGEDC_MATRIX_KV_BLOCK=128, mask blocks of 128 keys; 128x64x64 at
// head dim 256 with $PAGEDC_MATRIX_HEAD_DIMS=256, the sm_90 default there)
// and with the 128 x 32 tile of 32 rows per warp, holding the mods' row
// values (128x32x32) and recomputing them per KV tile (128x32x32r).
//
// Each case first builds all its kernels in parallel (the kernel cache's
// emulator builds), then runs; ctest runs the matrix in shards.
//
//===----------------------------------------------------------------------===//

#include "AttentionCheck.h"
#include "CorpusSupport.h"
#include "JIT/CompileSource.h"

#include "pagedc/CudaAttention.h"
#include "pagedc/KernelCache.h"
#include "pagedc/Error.h"
#include "pagedc/KernelOptions.h"

#include <fmt/format.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

namespace {

using namespace corpus;

struct Mode {
  const char *name;
  int64_t qLength;
  std::vector<int32_t> kvLengths;
  bool atEnd;
};

// Lengths off the 64-row tiles and the pages; the decode lengths make the
// launch plan split the 400-key sequence (split-KV + merge).
const Mode kModes[] = {
    {"prefill", 77, {77, 61}, false},
    {"decode", 1, {150, 37, 400}, true},
    {"speculative", 3, {45, 131}, true},
};

class EmuCorpusMatrixTest : public ::testing::TestWithParam<CorpusCase> {};

int64_t gRuns = 0, gMaskedRows = 0;

struct Variant {
  const Mode *mode;
  int32_t pageSize;
  int gqa;
  pagedc::DType dtype;
  int64_t dim;
  bool withBlockMask;
};

TEST_P(EmuCorpusMatrixTest, CudaKernelsOnEmulatorMatchFloat64Reference) {
  const CorpusCase &c = GetParam();
  std::string diagnostics;
  llvm::raw_string_ostream diagnosticStream(diagnostics);
  pagedc::jit::SourceCompileOptions options;
  options.withCuda = true;
  const std::string source = readFile(c.file);
  auto compiled = pagedc::jit::compileModsFromSource(c.file, source, c.mask, c.score, options,
                                                     diagnosticStream);
  ASSERT_TRUE(bool(compiled)) << llvm::toString(compiled.takeError()) << "\n" << diagnostics;
  const pagedc::CompiledMods &mods = *compiled;

  std::vector<Variant> variants;
  int index = 0;
  // $PAGEDC_MATRIX_MODES (a comma list of mode names) runs only those: the
  // warpgroup prefill entry runs the prefill mode alone.
  const char *only = std::getenv("PAGEDC_MATRIX_MODES");
  // $PAGEDC_MATRIX_HEAD_DIMS (a comma list; 64 and 128 unless set): the
  // warpgroup prefill at head dim 256 runs as its own entry.
  std::vector<int64_t> dims;
  const char *dimsText = std::getenv("PAGEDC_MATRIX_HEAD_DIMS");
  for (llvm::StringRef rest = dimsText && *dimsText ? dimsText : "64,128"; !rest.empty();) {
    auto [item, tail] = rest.split(',');
    int64_t dim = 0;
    ASSERT_FALSE(item.trim().getAsInteger(10, dim)) << "PAGEDC_MATRIX_HEAD_DIMS: " << dimsText;
    ASSERT_TRUE(dim == 64 || dim == 128 || dim == 256) << "PAGEDC_MATRIX_HEAD_DIMS: " << dim;
    dims.push_back(dim);
    rest = tail;
  }
  for (const Mode &mode : kModes)
    if (!only || ("," + std::string(only) + ",").find("," + std::string(mode.name) + ",") !=
                     std::string::npos)
    for (int32_t pageSize : {1, 16, 128})
      for (int gqa : {1, 4})
        for (pagedc::DType dtype : {pagedc::DType::BF16, pagedc::DType::F16})
          for (int64_t dim : dims)
            variants.push_back(
                {&mode, pageSize, gqa, dtype, dim, mods.hasMask() && ++index % 2 == 0});

  // The block masks' KV block size: $PAGEDC_MATRIX_KV_BLOCK (64 unless set;
  // 128 lets 128-key tiles run under them).
  const char *kvBlockText = std::getenv("PAGEDC_MATRIX_KV_BLOCK");
  const int kvBlockSize = kvBlockText && *kvBlockText ? std::atoi(kvBlockText) : 64;
  ASSERT_GT(kvBlockSize, 0) << "PAGEDC_MATRIX_KV_BLOCK";
  // Build every kernel of the case first, a few at a time in parallel.
  const std::string arch = pagedc::cudaDeviceInfo(0).arch();
  ASSERT_EQ(arch, "emu");
  std::vector<pagedc::KernelCache::Request> requests;
  // The kernel options of the ctest ENVIRONMENT ($PAGEDC_PREFILL_SHAPE), as
  // the checks' CUDA calls take them (AttentionCheck.cpp, runOnCuda).
  const pagedc::KernelOptions kernelOptions = pagedc::kernelOptionsFromEnvironment();
  for (const Variant &v : variants) {
    pagedc::KernelCache::Request request;
    request.config = pagedc::chooseCudaAttentionConfig(mods, v.dtype, static_cast<int>(v.dim),
                                                       v.pageSize, v.gqa,
                                                       static_cast<int>(v.mode->qLength),
                                                       /*returnLse=*/true, arch,
                                                       v.withBlockMask ? kvBlockSize : 0,
                                                       kernelOptions);
    request.modCode = mods.cuda.modCode;
    request.options.arch = arch;
    if (std::none_of(requests.begin(), requests.end(), [&](const auto &r) {
          return r.config == request.config;
        }))
      requests.push_back(request);
  }
  const size_t parallel = std::max(1u, std::thread::hardware_concurrency());
  for (size_t begin = 0; begin < requests.size(); begin += parallel) {
    std::vector<pagedc::KernelCache::Request> batch(
        requests.begin() + begin, requests.begin() + std::min(requests.size(), begin + parallel));
    ASSERT_NO_THROW(pagedc::KernelCache::global().getOrCompileAll(batch));
  }

  uint64_t seed = std::hash<std::string>()(caseName({c, 0}));
  int variantIndex = 0;
  for (const Variant &v : variants) {
    ++variantIndex;
    pagedc::testutil::AttentionConfig config;
    config.device = pagedc::Device::cuda(0);
    config.batch = static_cast<int64_t>(v.mode->kvLengths.size());
    config.kvHeads = v.gqa == 1 ? 2 : 1;
    config.qHeads = config.kvHeads * v.gqa;
    config.qLength = v.mode->qLength;
    config.kvLengths = v.mode->kvLengths;
    config.qOffsetAtEnd = v.mode->atEnd;
    config.dim = config.vDim = v.dim;
    config.pageSize = v.pageSize;
    config.storage = v.dtype;
    config.withLse = true;
    config.withBlockMask = v.withBlockMask;
    config.qBlockSize = 32;
    config.kvBlockSize = kvBlockSize;
    config.range = 2.0f;
    config.seed = seed + variantIndex;

    int32_t positions = static_cast<int32_t>(v.mode->qLength);
    for (int32_t length : v.mode->kvLengths)
      positions = std::max(positions, length);
    std::mt19937 random(static_cast<uint32_t>(config.seed));
    RandomBindings bindings(mods, {config.batch, config.qHeads, positions}, random);
    if (!bindings.complete())
      return;
    const std::string label = fmt::format("{} page {} gqa {} {} d{}{}", v.mode->name, v.pageSize,
                                          v.gqa, pagedc::dtypeName(v.dtype), v.dim,
                                          v.withBlockMask ? " block mask" : "");
    try {
      pagedc::testutil::AttentionCheckResult result =
          pagedc::testutil::checkPagedAttention(mods, bindings.context(), config);
      ++gRuns;
      gMaskedRows += result.maskedRows;
      EXPECT_TRUE(result.ok()) << label << ": " << result.describe();
      EXPECT_EQ(result.nonFinite, 0) << label;
    } catch (const pagedc::Error &error) {
      ADD_FAILURE() << label << ": " << error.what();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Corpus, EmuCorpusMatrixTest, ::testing::ValuesIn(corpusCases()),
                         caseName);

/// Runs on the emulator's driver, with a kernel cache of its own unless the
/// caller chose one; the whole matrix must have seen a fully masked row.
class EmulatorEnvironment : public ::testing::Environment {
public:
  void SetUp() override {
    ::setenv("PAGEDC_CUDA_DRIVER", "emu", 1);
    ::setenv("PAGEDC_EMU_QUIET", "1", 0);
  }
  void TearDown() override {
    if (gRuns > 40)
      EXPECT_GT(gMaskedRows, 0) << "no run produced a fully masked row";
  }
};
const auto *const gEnvironment = ::testing::AddGlobalTestEnvironment(new EmulatorEnvironment);

} // namespace
