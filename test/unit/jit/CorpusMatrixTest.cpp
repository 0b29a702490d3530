//===- CorpusMatrixTest.cpp - Every corpus mod, CPU vs float64 ------------===//
//
// The correctness matrix of the CPU backend: every mod of examples/*.attn,
// compiled through the real front end, pipeline and JIT, runs paged
// attention for prefill, decode and speculative decode, page sizes 1, 16 and
// 128 with shuffled page tables, lengths that are not multiples of the block
// or page size, GQA ratios 1 and 4, with and without lse, and is compared
// with the float64 reference on fresh random inputs and bindings. Mask mods
// also check the runtime's createBlockMask (which uses the JIT's block
// classifier) against element-wise evaluation of the reference.
//
//===----------------------------------------------------------------------===//

#include "AttentionCheck.h"
#include "CorpusSupport.h"
#include "JIT/CompileSource.h"

#include "pagedc/BlockMask.h"
#include "pagedc/Tensor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <sstream>

namespace {

using namespace corpus;

//===----------------------------------------------------------------------===//
// The matrix
//===----------------------------------------------------------------------===//

/// A shape of the matrix: batch 2 or 3, lengths off the block and page grid.
struct Mode {
  const char *name;
  int64_t qLength;
  std::vector<int32_t> kvLengths;
  bool atEnd; ///< q positions end-aligned (decode)
};

const Mode kModes[] = {
    {"prefill", 77, {77, 61}, false},
    {"decode", 1, {150, 37, 93}, true},
    {"speculative", 3, {45, 131}, true},
};

class CorpusMatrixTest : public ::testing::TestWithParam<CorpusCase> {};

/// Totals over the whole matrix, checked once at the end.
int64_t gMaskedRows = 0;
int64_t gRuns = 0;

TEST_P(CorpusMatrixTest, CpuAttentionMatchesFloat64Reference) {
  const CorpusCase &c = GetParam();
  std::string diagnostics;
  llvm::raw_string_ostream diagnosticStream(diagnostics);
  pagedc::jit::SourceCompileOptions options;

  // The line scan and the front end agree on the file's mods.
  std::string source = readFile(c.file);
  auto listed =
      pagedc::jit::listModsInSource(c.file, source, options, diagnosticStream);
  ASSERT_TRUE(bool(listed)) << llvm::toString(listed.takeError()) << diagnostics;
  for (const std::string &name : {c.mask, c.score}) {
    if (name.empty())
      continue;
    EXPECT_TRUE(std::any_of(listed->begin(), listed->end(),
                            [&](const auto &mod) { return mod.name == name; }))
        << name;
  }

  auto compiled = pagedc::jit::compileModsFromSource(
      c.file, source, c.mask, c.score, options, diagnosticStream);
  ASSERT_TRUE(bool(compiled)) << llvm::toString(compiled.takeError()) << "\n"
                              << diagnostics;
  const pagedc::CompiledMods &mods = *compiled;
  ASSERT_EQ(mods.hasMask(), !c.mask.empty());
  ASSERT_EQ(mods.hasScore(), !c.score.empty());

  uint64_t seed = std::hash<std::string>()(caseName({c, 0}));
  int variant = 0;
  for (const Mode &mode : kModes)
    for (int32_t pageSize : {1, 16, 128})
      for (int gqa : {1, 4})
        for (bool withLse : {false, true}) {
          ++variant;
          pagedc::testutil::AttentionConfig config;
          config.batch = static_cast<int64_t>(mode.kvLengths.size());
          config.kvHeads = gqa == 1 ? 2 : 1;
          config.qHeads = config.kvHeads * gqa;
          config.qLength = mode.qLength;
          config.kvLengths = mode.kvLengths;
          config.qOffsetAtEnd = mode.atEnd;
          config.dim = 32;
          config.vDim = 32;
          config.pageSize = pageSize;
          config.withLse = withLse;
          // Half of the runs skip tiles through a block mask.
          config.withBlockMask = mods.hasMask() && variant % 2 == 0;
          config.qBlockSize = 16;
          config.kvBlockSize = 32;
          config.range = 2.0f;
          config.threads = 2;
          config.seed = seed + variant;

          int32_t positions = 0;
          for (int32_t length : mode.kvLengths)
            positions = std::max(positions, length);
          positions = std::max<int32_t>(positions,
                                        static_cast<int32_t>(mode.qLength));
          std::mt19937 random(static_cast<uint32_t>(config.seed));
          RandomBindings bindings(mods, {config.batch, config.qHeads, positions},
                                  random);
          if (!bindings.complete())
            return;

          pagedc::testutil::AttentionCheckResult result =
              pagedc::testutil::checkPagedAttention(mods, bindings.context(),
                                                    config);
          ++gRuns;
          gMaskedRows += result.maskedRows;
          EXPECT_TRUE(result.ok())
              << mode.name << " page " << pageSize << " gqa " << gqa
              << (withLse ? " lse" : "") << ": " << result.describe();
          EXPECT_LE(result.maxOutError, 1e-4);
          EXPECT_EQ(result.nonFinite, 0);
        }
}

/// The mask mods of the corpus (each alone).
std::vector<CorpusCase> corpusMaskCases() {
  std::vector<CorpusCase> masks;
  for (const CorpusCase &c : corpusCases())
    if (!c.mask.empty() && c.score.empty())
      masks.push_back(c);
  return masks;
}

class CorpusBlockMaskTest : public ::testing::TestWithParam<CorpusCase> {};

TEST_P(CorpusBlockMaskTest, RuntimeBlockMaskMatchesElementWiseReference) {
  const CorpusCase &c = GetParam();
  std::string diagnostics;
  llvm::raw_string_ostream diagnosticStream(diagnostics);
  auto compiled = pagedc::jit::compileModsFromFile(c.file, c.mask, c.score, {},
                                                   diagnosticStream);
  ASSERT_TRUE(bool(compiled)) << llvm::toString(compiled.takeError());
  const pagedc::CompiledMods &mods = *compiled;
  const int64_t batch = 2, heads = 3, qLength = 203, kvLength = 187;
  std::mt19937 random(static_cast<uint32_t>(std::hash<std::string>()(c.mask)));
  RandomBindings bindings(mods, {batch, heads, 256}, random);
  if (!bindings.complete())
    return;
  const PagedcModContext &context = *bindings.context();
  // Equal block sizes take the diagonal path for diagonal masks, unequal ones
  // the classifier (or element-wise) path.
  for (auto [qBlock, kvBlock] : {std::pair{32, 32}, std::pair{16, 64}}) {
    pagedc::BlockMask mask = pagedc::createBlockMask(
        mods, context, batch, heads, qLength, kvLength, qBlock, kvBlock);
    std::vector<uint8_t> dense = pagedc::toDense(mask, &mods, &context);
    int64_t maskBatch = mask.batch, maskHeads = mask.heads;
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t q = 0; q < qLength; ++q)
          for (int64_t kv = 0; kv < kvLength; ++kv) {
            int64_t bb = maskBatch == 1 ? 0 : b, hh = maskHeads == 1 ? 0 : h;
            bool fromBlocks =
                dense[((bb * maskHeads + hh) * qLength + q) * kvLength + kv];
            bool expected = mods.maskReference(context, b, h, q, kv);
            ASSERT_EQ(fromBlocks, expected)
                << "blocks " << qBlock << "x" << kvBlock << " b=" << b
                << " h=" << h << " q=" << q << " kv=" << kv;
          }
  }
}

INSTANTIATE_TEST_SUITE_P(Corpus, CorpusMatrixTest,
                         ::testing::ValuesIn(corpusCases()), caseName);
INSTANTIATE_TEST_SUITE_P(Corpus, CorpusBlockMaskTest,
                         ::testing::ValuesIn(corpusMaskCases()), caseName);

/// The matrix must have exercised fully masked rows somewhere.
class MatrixCoverage : public ::testing::Environment {
public:
  void TearDown() override {
    if (gRuns == 0)
      return; // filtered run
    EXPECT_GT(gMaskedRows, 0) << "no run produced a fully masked row";
  }
};
const auto *const gCoverage =
    ::testing::AddGlobalTestEnvironment(new MatrixCoverage);

} // namespace
