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

/// One case of the matrix: a mask and/or a score mod of one corpus file.
struct CorpusCase {
  std::string file; ///< path of the .attn file
  std::string mask;
  std::string score;
};

/// Readable test names in gtest's failure messages.
void PrintTo(const CorpusCase &c, std::ostream *os) {
  *os << std::filesystem::path(c.file).filename().string() << " mask '"
      << c.mask << "' score '" << c.score << "'";
}

std::string readFile(const std::string &path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

/// Every mod of every corpus file alone, plus the first mask with the first
/// score of files that have both. Mods are found with a line scan here (the
/// test then checks the list against the front end's).
std::vector<CorpusCase> corpusCases() {
  std::vector<std::string> files;
  for (const auto &entry :
       std::filesystem::directory_iterator(PAGEDC_EXAMPLES_DIR))
    if (entry.path().extension() == ".attn")
      files.push_back(entry.path().string());
  std::sort(files.begin(), files.end());
  std::regex modLine(R"(^(mask|score)\s+([A-Za-z_][A-Za-z0-9_]*)\s*\()");
  std::vector<CorpusCase> cases;
  for (const std::string &file : files) {
    std::istringstream lines(readFile(file));
    std::string line, firstMask, firstScore;
    std::smatch match;
    while (std::getline(lines, line)) {
      if (!std::regex_search(line, match, modLine))
        continue;
      bool isMask = match[1] == "mask";
      std::string name = match[2];
      cases.push_back({file, isMask ? name : "", isMask ? "" : name});
      std::string &first = isMask ? firstMask : firstScore;
      if (first.empty())
        first = name;
    }
    if (!firstMask.empty() && !firstScore.empty())
      cases.push_back({file, firstMask, firstScore});
  }
  return cases;
}

std::string caseName(const ::testing::TestParamInfo<CorpusCase> &info) {
  std::string stem = std::filesystem::path(info.param.file).stem().string();
  std::string name = stem + "__" + (info.param.mask.empty() ? "nomask" : info.param.mask) +
                     "__" + (info.param.score.empty() ? "noscore" : info.param.score);
  for (char &c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)))
      c = '_';
  return name;
}

//===----------------------------------------------------------------------===//
// Random bindings with sensible values
//===----------------------------------------------------------------------===//

/// The sizes bindings are made for.
struct Extents {
  int64_t batch, heads, positions;
};

/// Buffers and params for one compiled selection, filled at random. Float
/// buffers are uniform in [-1.5, 1.5]; integer buffers need a recipe that
/// knows what their values index (document ids, offsets, lengths), and a
/// buffer without one fails the test so that new corpus files get one.
class RandomBindings {
public:
  RandomBindings(const pagedc::CompiledMods &mods, const Extents &extents,
                 std::mt19937 &random) {
    std::map<std::string, std::vector<int32_t>> documentStarts;
    for (const pagedc::BufferDecl &decl : mods.buffers) {
      std::vector<int64_t> shape;
      for (const pagedc::BufferDim &dim : decl.dims) {
        if (dim.kind == pagedc::BufferDim::Fixed)
          shape.push_back(dim.size);
        else if (dim.kind == pagedc::BufferDim::Named)
          shape.push_back(dim.name == "B"   ? extents.batch
                          : dim.name == "H" ? extents.heads
                                            : extents.positions);
        else
          shape.push_back(-1); // decided by the recipe below
      }
      storage_.emplace_back();
      pagedc::HostTensor &tensor = storage_.back();
      if (decl.name == "document_id" || decl.name == "doc") {
        // Sorted document ids per batch row; documents of 1..40 tokens.
        tensor = pagedc::HostTensor(pagedc::DType::I32, shape);
        int64_t rows = shape.size() == 2 ? shape[0] : 1;
        int64_t length = shape.back();
        auto *ids = tensor.dataAs<int32_t>();
        for (int64_t r = 0; r < rows; ++r) {
          int32_t id = 0, left = 0;
          std::vector<int32_t> &starts = documentStarts[decl.name];
          for (int64_t s = 0; s < length; ++s) {
            if (left == 0) {
              if (s > 0)
                ++id;
              left = std::uniform_int_distribution<int32_t>(1, 40)(random);
              if (r == 0)
                starts.push_back(static_cast<int32_t>(s));
            }
            --left;
            ids[r * length + s] = id;
          }
        }
      } else if (decl.name == "offsets") {
        // Start position of each document of document_id (declared first).
        const std::vector<int32_t> &starts = documentStarts["document_id"];
        if (starts.empty()) {
          ADD_FAILURE() << "offsets needs document_id declared first";
          return;
        }
        tensor = pagedc::HostTensor(pagedc::DType::I32,
                                    {static_cast<int64_t>(starts.size())});
        std::copy(starts.begin(), starts.end(), tensor.dataAs<int32_t>());
      } else if (decl.name == "kv_len") {
        // Valid lengths per batch entry; 0 for the second one, which masks
        // every one of its rows.
        tensor = pagedc::HostTensor(pagedc::DType::I32, shape);
        for (int64_t b = 0; b < shape[0]; ++b)
          tensor.dataAs<int32_t>()[b] =
              b == 1 ? 0
                     : std::uniform_int_distribution<int32_t>(
                           1, static_cast<int32_t>(extents.positions))(random);
      } else if (decl.elementType == pagedc::DType::F32 ||
                 decl.elementType == pagedc::DType::F16 ||
                 decl.elementType == pagedc::DType::BF16) {
        for (int64_t &size : shape)
          if (size < 0)
            size = 4096; // `?`: larger than any index the small shapes make
        tensor = pagedc::HostTensor(decl.elementType, shape);
        std::uniform_real_distribution<float> uniform(-1.5f, 1.5f);
        for (int64_t i = 0; i < tensor.numel(); ++i) {
          float value = uniform(random);
          if (decl.elementType == pagedc::DType::F32)
            tensor.dataAs<float>()[i] = value;
          else if (decl.elementType == pagedc::DType::F16)
            tensor.dataAs<uint16_t>()[i] = pagedc::floatToHalf(value);
          else
            tensor.dataAs<uint16_t>()[i] = pagedc::floatToBF16(value);
        }
      } else {
        ADD_FAILURE() << "no binding recipe for buffer '" << decl.name
                      << "' of type " << pagedc::dtypeName(decl.elementType)
                      << ": add one to CorpusMatrixTest.cpp";
        return;
      }
      PagedcBufferRef ref{};
      ref.data = tensor.data();
      int64_t stride = 1;
      for (int d = static_cast<int>(tensor.shape().size()) - 1; d >= 0; --d) {
        ref.sizes[d] = tensor.shape()[d];
        ref.strides[d] = stride;
        stride *= tensor.shape()[d];
      }
      buffers_.push_back(ref);
    }
    for (const pagedc::ParamDecl &decl : mods.params) {
      PagedcParamSlot slot{};
      if (decl.name == "softcap")
        slot.f32 = 2.5f; // small enough for tanh to bend the scores
      else if (decl.defaultValue && decl.type == pagedc::ScalarKind::F32)
        slot.f32 = decl.defaultValue->f32;
      else if (decl.defaultValue && decl.type == pagedc::ScalarKind::I32)
        slot.i32 = decl.defaultValue->i32;
      else if (decl.defaultValue)
        slot.i32 = decl.defaultValue->boolean ? 1 : 0;
      else {
        ADD_FAILURE() << "no value for param '" << decl.name << "'";
        return;
      }
      params_.push_back(slot);
    }
    context_ = {buffers_.data(), params_.data()};
    complete_ = true;
  }

  /// False when a buffer or param could not be bound (a failure was added).
  bool complete() const { return complete_; }
  const PagedcModContext *context() const { return &context_; }

private:
  std::vector<pagedc::HostTensor> storage_;
  std::vector<PagedcBufferRef> buffers_;
  std::vector<PagedcParamSlot> params_;
  PagedcModContext context_{nullptr, nullptr};
  bool complete_ = false;
};

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
