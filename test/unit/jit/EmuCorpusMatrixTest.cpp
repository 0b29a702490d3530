//===- EmuCorpusMatrixTest.cpp - Every corpus mod, CUDA kernels vs float64 -===//
//
// The correctness matrix of the CUDA kernels, executed on the SIMT emulator
// (PAGEDC_CUDA_DRIVER=emu, set before anything touches the driver) through
// the runtime's CUDA backend with every checker on: every mod of
// examples/*.attn, compiled with its CUDA code, x prefill / decode /
// 3-token decode, each over page sizes 1, 16, 128 (shuffled page tables),
// GQA 1 and 4, bf16 and f16, head dims 64 and 128, lengths off the tile and
// page grid, half of the runs with a block mask, lse on; outputs against the
// float64 reference on fresh random inputs.
//
// Which settings run together: by default a pairwise covering of the four
// settings for each mod and mode (every pair of values of any two settings
// runs at least once: 6 of the 24 combinations at two head dims), a
// different covering for each mode; $PAGEDC_MATRIX_FULL=1 runs every
// combination. Kernel bugs seen so far hang on one setting or on a pair
// (a page size with a head dim, GQA with a dtype); the full product costs
// four times the emulator builds and runs for combinations no pair misses. A checker report fails the
// launch and so the case. ctest also runs the prefill mode with warpgroup
// tiles (PrefillWgmma.cuh, the kernel option prefill_shape=128x64x64 that
// its ctest ENVIRONMENT sets as $PAGEDC_PREFILL_SHAPE; and 128x128x64
// with $PAGEDC_MATRIX_KV_BLOCK=128, mask blocks of 128 keys; 128x64x64 at
// head dim 256 with $PAGEDC_MATRIX_HEAD_DIMS=256, the sm_90 default there)
// and with the 128 x 32 tile of 32 rows per warp, holding the mods' row
// values (128x32x32) and recomputing them per KV tile (128x32x32r).
//
// The entries that vary one kernel option over the corpus (the tiles above)
// set $PAGEDC_MATRIX_PER_CASE=2: each case runs the first two combinations
// of its covering, which differ with the case, and the corpus together must
// still hold every pair of settings' values (checked at the end): every mod
// meets the option, at a third of the emulator builds and runs. The full
// suite's shards of the whole matrix take 3 per mode and case the same way;
// the extended tier's run each case's whole covering.
//
// $PAGEDC_MATRIX_KV_FLOAT8 (f8e4m3, f8e5m2) adds the K/V cache format as a
// fifth setting: 8-bit caches with a scale per KV head, against the
// reference on the dequantized values (the .f8 entries).
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

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

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

/// With $PAGEDC_MATRIX_PER_CASE: the settings' value counts, and the pairs
/// of values (setting a, value, setting b, value) that ran.
std::vector<size_t> gSettingSizes;
std::set<std::tuple<size_t, size_t, size_t, size_t>> gPairsRun;

/// One combination of the matrix's settings, by index into each setting's
/// values.
using Combination = std::vector<size_t>;

/// A pairwise covering of the product of settings of `sizes` values each:
/// combinations such that every pair of values of any two settings appears in
/// one of them. Greedy (each step takes the combination covering the most
/// pairs not yet covered); `rotation` shifts which of the equally good
/// combinations is taken first, so callers get different coverings.
std::vector<Combination> pairwiseCovering(const std::vector<size_t> &sizes, size_t rotation) {
  std::vector<Combination> all{{}};
  for (size_t size : sizes) {
    std::vector<Combination> next;
    for (const Combination &prefix : all)
      for (size_t value = 0; value < size; ++value) {
        next.push_back(prefix);
        next.back().push_back(value);
      }
    all = std::move(next);
  }
  std::rotate(all.begin(), all.begin() + rotation % all.size(), all.end());
  std::set<std::tuple<size_t, size_t, size_t, size_t>> uncovered;
  for (size_t a = 0; a < sizes.size(); ++a)
    for (size_t b = a + 1; b < sizes.size(); ++b)
      for (size_t va = 0; va < sizes[a]; ++va)
        for (size_t vb = 0; vb < sizes[b]; ++vb)
          uncovered.insert({a, va, b, vb});
  auto gain = [&](const Combination &c) {
    size_t count = 0;
    for (size_t a = 0; a < c.size(); ++a)
      for (size_t b = a + 1; b < c.size(); ++b)
        count += uncovered.count({a, c[a], b, c[b]});
    return count;
  };
  std::vector<Combination> chosen;
  while (!uncovered.empty()) {
    const Combination best = *std::max_element(
        all.begin(), all.end(),
        [&](const Combination &x, const Combination &y) { return gain(x) < gain(y); });
    for (size_t a = 0; a < best.size(); ++a)
      for (size_t b = a + 1; b < best.size(); ++b)
        uncovered.erase({a, best[a], b, best[b]});
    chosen.push_back(best);
  }
  if (sizes.size() < 2) // no pairs: every value once
    return all;
  return chosen;
}

TEST(PairwiseCovering, CoversEveryPairWithFewerCombinations) {
  const std::vector<size_t> sizes = {3, 2, 2, 2};
  for (size_t rotation : {0, 5, 23}) {
    const std::vector<Combination> chosen = pairwiseCovering(sizes, rotation);
    EXPECT_LE(chosen.size(), 8u) << rotation;
    for (size_t a = 0; a < sizes.size(); ++a)
      for (size_t b = a + 1; b < sizes.size(); ++b)
        for (size_t va = 0; va < sizes[a]; ++va)
          for (size_t vb = 0; vb < sizes[b]; ++vb)
            EXPECT_TRUE(std::any_of(chosen.begin(), chosen.end(), [&](const Combination &c) {
              return c[a] == va && c[b] == vb;
            })) << "rotation " << rotation << ": setting " << a << "=" << va << " with "
                << b << "=" << vb;
  }
  EXPECT_EQ(pairwiseCovering({3}, 0).size(), 3u);
}

struct Variant {
  const Mode *mode;
  int32_t pageSize;
  int gqa;
  pagedc::DType dtype;
  int64_t dim;
  bool withBlockMask;
  Combination combination; // indices into the settings' values
  std::optional<pagedc::DType> kvFloat8;
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
  // warpgroup prefill at head dim 256 and the head dims that are not powers
  // of two run as their own entries.
  std::vector<int64_t> dims;
  const char *dimsText = std::getenv("PAGEDC_MATRIX_HEAD_DIMS");
  for (llvm::StringRef rest = dimsText && *dimsText ? dimsText : "64,128"; !rest.empty();) {
    auto [item, tail] = rest.split(',');
    int64_t dim = 0;
    ASSERT_FALSE(item.trim().getAsInteger(10, dim)) << "PAGEDC_MATRIX_HEAD_DIMS: " << dimsText;
    ASSERT_TRUE(pagedc::isCudaHeadDim(dim)) << "PAGEDC_MATRIX_HEAD_DIMS: " << dim;
    dims.push_back(dim);
    rest = tail;
  }
  // $PAGEDC_MATRIX_KV_FLOAT8 (a comma list of f8e4m3, f8e5m2): K and V in
  // 8-bit float caches of those formats (a fifth setting), scales per KV
  // head; unset, 16-bit caches of q's type.
  std::vector<pagedc::DType> float8Formats;
  if (const char *text = std::getenv("PAGEDC_MATRIX_KV_FLOAT8"); text && *text)
    for (llvm::StringRef rest = text; !rest.empty();) {
      auto [item, tail] = rest.split(',');
      if (item.trim() == "f8e4m3")
        float8Formats.push_back(pagedc::DType::F8E4M3);
      else if (item.trim() == "f8e5m2")
        float8Formats.push_back(pagedc::DType::F8E5M2);
      else
        FAIL() << "PAGEDC_MATRIX_KV_FLOAT8: '" << item.str() << "' is not f8e4m3 or f8e5m2";
      rest = tail;
    }
  const int32_t pageSizes[] = {1, 16, 128};
  const int gqas[] = {1, 4};
  const pagedc::DType dtypes[] = {pagedc::DType::BF16, pagedc::DType::F16};
  const char *fullText = std::getenv("PAGEDC_MATRIX_FULL");
  const bool full = fullText && std::string(fullText) == "1";
  const char *perCaseText = std::getenv("PAGEDC_MATRIX_PER_CASE");
  const size_t perCase = perCaseText && *perCaseText && !full ? std::atoi(perCaseText) : 0;
  if (perCaseText && *perCaseText)
    ASSERT_GT(std::atoi(perCaseText), 0) << "PAGEDC_MATRIX_PER_CASE: " << perCaseText;
  size_t modeIndex = 0;
  for (const Mode &mode : kModes) {
    ++modeIndex;
    if (only && ("," + std::string(only) + ",").find("," + std::string(mode.name) + ",") ==
                    std::string::npos)
      continue;
    std::vector<size_t> sizes = {std::size(pageSizes), std::size(gqas), std::size(dtypes),
                                 dims.size()};
    if (!float8Formats.empty())
      sizes.push_back(float8Formats.size());
    std::vector<Combination> combinations;
    if (full) {
      for (size_t p = 0; p < sizes[0]; ++p)
        for (size_t g = 0; g < sizes[1]; ++g)
          for (size_t t = 0; t < sizes[2]; ++t)
            for (size_t d = 0; d < sizes[3]; ++d)
              for (size_t f = 0; f < (float8Formats.empty() ? 1 : float8Formats.size()); ++f) {
                combinations.push_back({p, g, t, d});
                if (!float8Formats.empty())
                  combinations.back().push_back(f);
              }
    } else {
      // Rotated by the case and the mode: mods and modes cover their pairs
      // with different combinations, so together they reach more of them.
      combinations = pairwiseCovering(sizes, std::hash<std::string>()(c.mask + c.score) +
                                                 modeIndex * 7);
      if (perCase && combinations.size() > perCase)
        combinations.resize(perCase);
    }
    for (const Combination &k : combinations) {
      variants.push_back({&mode, pageSizes[k[0]], gqas[k[1]], dtypes[k[2]], dims[k[3]],
                          mods.hasMask() && ++index % 2 == 0, k,
                          float8Formats.empty() ? std::nullopt
                                                : std::optional(float8Formats[k[4]])});
    }
    if (perCase)
      gSettingSizes = sizes;
  }

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
                                                       kernelOptions, 0, v.kvFloat8);
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
    ASSERT_NO_THROW(pagedc::KernelCache::global().getOrCompileAllModules(batch));
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
    config.kvFloat8 = v.kvFloat8;
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
    const std::string label = fmt::format(
        "{} page {} gqa {} {} d{}{}{}", v.mode->name, v.pageSize, v.gqa, pagedc::dtypeName(v.dtype),
        v.dim, v.kvFloat8 ? fmt::format(" kv {}", pagedc::dtypeName(*v.kvFloat8)) : "",
        v.withBlockMask ? " block mask" : "");
    try {
      pagedc::testutil::AttentionCheckResult result =
          pagedc::testutil::checkPagedAttention(mods, bindings.context(), config);
      ++gRuns;
      gMaskedRows += result.maskedRows;
      for (size_t a = 0; a < v.combination.size(); ++a)
        for (size_t b = a + 1; b < v.combination.size(); ++b)
          gPairsRun.insert({a, v.combination[a], b, v.combination[b]});
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
    // With a few combinations per case, the corpus as a whole must still
    // have run every pair of values of any two settings.
    if (gRuns > 40 && !gSettingSizes.empty())
      for (size_t a = 0; a < gSettingSizes.size(); ++a)
        for (size_t b = a + 1; b < gSettingSizes.size(); ++b)
          for (size_t va = 0; va < gSettingSizes[a]; ++va)
            for (size_t vb = 0; vb < gSettingSizes[b]; ++vb)
              EXPECT_TRUE(gPairsRun.count({a, va, b, vb}))
                  << "PAGEDC_MATRIX_PER_CASE: no case ran setting " << a << " = value " << va
                  << " with setting " << b << " = value " << vb;
  }
};
const auto *const gEnvironment = ::testing::AddGlobalTestEnvironment(new EmulatorEnvironment);

} // namespace
