//===- NvrtcCompileTest.cpp - Every test mod compiles through NVRTC -------===//
//
// Compiles each hand-written test mod for {prefill, decode} x {f16, bf16} x
// head dims {64, 128, 256} x {sm_80, sm_90} (in parallel), the block-mask
// builder, page sizes 1 and 1024 and speculative decode; checks ptxas's
// spill report for the main configurations, the packed-batch and 8-bit
// kernels and the other head dims, and mma.sync in the prefill PTX. The
// largest sweeps (every test mod, the other head dims, the 8-bit kernels at
// every head dim) take a covering of their axes, every pair of values of
// every two axes, unless PAGEDC_FULL_COMPILE_MATRIX=1 asks for the whole
// product (the extended tier's entries).
//
//===----------------------------------------------------------------------===//

#include "pagedc/Error.h"
#include "pagedc/KernelSource.h"
#include "pagedc/Nvrtc.h"
#include "support/CudaTestSupport.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <future>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

using namespace pagedc;

namespace {

const char *const kTestMods[] = {"none", "causal", "alibi", "softcap",
                                 "document"};

std::string testMod(const std::string &name) {
  return std::string(embeddedTemplate("testing/" + name + ".cuh"));
}

struct Case {
  std::string mod;
  KernelConfig config;
  std::string arch;
  std::string label() const {
    return fmt::format("{} [{}] {}", mod, config.describe(), arch);
  }
};

struct Outcome {
  std::string error;
  std::vector<PtxasKernelReport> reports;
  double seconds = 0;
  size_t cubinBytes = 0;
};

/// Compiles the cases on up to `workers` threads.
std::vector<Outcome> compileAll(const std::vector<Case> &cases, int workers) {
  std::vector<Outcome> outcomes(cases.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next++) < cases.size();) {
      const Case &c = cases[i];
      try {
        KernelSource source = assembleKernel(c.config, testMod(c.mod));
        CompileOptions options;
        options.arch = c.arch;
        options.ptxasVerbose = true;
        CompileResult result =
            Nvrtc::get().compile(source.code, "pagedc_kernel.cu", options, &source);
        outcomes[i].reports = parsePtxasReport(result.log);
        outcomes[i].seconds = result.seconds;
        outcomes[i].cubinBytes = result.image.size();
      } catch (const std::exception &error) {
        outcomes[i].error = error.what();
      }
    }
  };
  std::vector<std::future<void>> futures;
  for (int w = 0; w < workers; ++w)
    futures.push_back(std::async(std::launch::async, work));
  for (auto &future : futures)
    future.get();
  return outcomes;
}

int workerCount() {
  return std::max(2u, std::thread::hardware_concurrency());
}

bool fullMatrix() {
  const char *value = std::getenv("PAGEDC_FULL_COMPILE_MATRIX");
  return value && std::string(value) == "1";
}

/// (D, Dv) of the 8-bit kernels' spill checks: every multiple of 64 and the
/// sizes whose code rows are not (5, 6, 7, 10, 12 chunks of 16 codes), and
/// K rows wider than V's.
const std::pair<int, int> kFloat8HeadDims[] = {{32, 32},   {64, 64},   {80, 80},   {96, 96},
                                               {112, 112}, {128, 128}, {160, 160}, {192, 192},
                                               {192, 128}, {256, 256}};

/// The covering the 8-bit sweeps take of (mod, head dim, arch, kind): for
/// head dim `dim` and mod `mod`, arch (dim + mod) % 2 and kind (dim / 2 +
/// mod) % 2 (of two each), so that with three mods every pair of values of
/// every two axes comes once or more (pairsCovered checks it); the full
/// matrix takes all four (arch, kind) of each.
bool inFloat8Covering(size_t dim, size_t mod, int arch, int kind) {
  return fullMatrix() || (arch == int((dim + mod) % 2) && kind == int((dim / 2 + mod) % 2));
}

/// Whether `rows` (one value index per axis, axes of `sizes` values) hold
/// every pair of values of every two axes.
bool pairsCovered(const std::vector<std::vector<int>> &rows, const std::vector<int> &sizes) {
  for (size_t a = 0; a < sizes.size(); ++a)
    for (size_t b = a + 1; b < sizes.size(); ++b) {
      std::set<std::pair<int, int>> seen;
      for (const std::vector<int> &row : rows)
        seen.insert({row[a], row[b]});
      if (seen.size() != static_cast<size_t>(sizes[a] * sizes[b]))
        return false;
    }
  return true;
}

} // namespace

TEST(NvrtcCompile, LoadsAndReportsVersion) {
  REQUIRE_NVRTC();
  const Nvrtc &nvrtc = Nvrtc::get();
  EXPECT_GE(nvrtc.majorVersion(), 11);
  auto archs = nvrtc.supportedArchitectures();
  EXPECT_NE(std::find(archs.begin(), archs.end(), 90), archs.end());
  EXPECT_NE(std::find(archs.begin(), archs.end(), 80), archs.end());
}

TEST(NvrtcCompile, LibraryIdentityNamesTheLoadedFile) {
  REQUIRE_NVRTC();
  const std::string &identity = nvrtcLibraryIdentity();
  const std::string &loaded = Nvrtc::get().libraryRealPath();
  ASSERT_FALSE(loaded.empty());
  EXPECT_EQ(identity.substr(0, loaded.size() + 1), loaded + "|") << identity;
}

TEST(NvrtcCompile, EveryTestModCompilesForSm80AndSm90) {
  REQUIRE_NVRTC();
  std::vector<Case> cases;
  auto add = [&](const char *mod, bool decode, bool bf16, int headDim, bool sm90) {
    Case c;
    c.mod = mod;
    c.config.kind = decode ? KernelKind::Decode : KernelKind::Prefill;
    c.config.elementType = bf16 ? DType::BF16 : DType::F16;
    c.config.headDim = headDim;
    c.config.groupSize = decode ? 4 : 1;
    c.config.returnLse = true;
    c.arch = sm90 ? "sm_90" : "sm_80";
    cases.push_back(c);
  };
  const int headDims[] = {64, 128, 256};
  unsigned modIndex = 0;
  for (const char *mod : kTestMods) {
    if (fullMatrix()) {
      for (unsigned bits = 0; bits < 8; ++bits)
        for (int headDim : headDims)
          add(mod, bits & 4, bits & 2, headDim, bits & 1);
      continue;
    }
    // Per head dim two complementary (kind, type, arch) rows, flipped by
    // the head dim and the mod: every pair of values of every two of the
    // four axes, 6 compiles a mod instead of 24.
    const unsigned flips[] = {0b000, 0b011, 0b101};
    for (int d = 0; d < 3; ++d)
      for (unsigned base : {0b000u, 0b111u}) {
        const unsigned bits = base ^ flips[d] ^ (modIndex % 8);
        add(mod, bits & 4, bits & 2, headDims[d], bits & 1);
      }
    ++modIndex;
  }
  for (const char *mod : kTestMods)
    for (const char *arch : {"sm_80", "sm_90"}) {
      Case c;
      c.mod = mod;
      c.config.kind = KernelKind::BlockMaskBuilder;
      c.arch = arch;
      cases.push_back(c);
    }
  for (int pageSize : {1, 1024})
    for (int tokens : {1, 8}) {
      Case c;
      c.mod = "softcap";
      c.config.kind = KernelKind::Decode;
      c.config.pageSize = pageSize;
      c.config.queryTokens = tokens;
      c.config.groupSize = 8;
      c.arch = "sm_90";
      cases.push_back(c);
    }
  auto start = std::chrono::steady_clock::now();
  std::vector<Outcome> outcomes = compileAll(cases, workerCount());
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  double cpu = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(outcomes[i].error, "") << cases[i].label();
    EXPECT_GT(outcomes[i].cubinBytes, 0u) << cases[i].label();
    EXPECT_EQ(outcomes[i].reports.size(), cases[i].config.kind == KernelKind::Decode ? 2u : 1u)
        << cases[i].label();
    cpu += outcomes[i].seconds;
  }
  std::printf("[ matrix ] %zu kernels compiled in %.1f s wall (%.1f s summed, "
              "%.2f s per kernel)\n",
              cases.size(), wall, cpu, cpu / cases.size());
}

/// The main configurations (D = 128 bf16 prefill and decode, sm_90, every
/// test mod) must not spill.
TEST(NvrtcCompile, MainConfigurationsDoNotSpill) {
  REQUIRE_NVRTC();
  std::vector<Case> cases;
  for (const char *mod : kTestMods)
    for (KernelKind kind : {KernelKind::Prefill, KernelKind::Decode}) {
      Case c;
      c.mod = mod;
      c.config.kind = kind;
      c.config.elementType = DType::BF16;
      c.config.headDim = 128;
      c.config.groupSize = kind == KernelKind::Decode ? 4 : 1;
      c.config.returnLse = true;
      c.arch = "sm_90";
      cases.push_back(c);
    }
  std::vector<Outcome> outcomes = compileAll(cases, workerCount());
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_EQ(outcomes[i].error, "") << cases[i].label();
    ASSERT_FALSE(outcomes[i].reports.empty()) << cases[i].label();
    for (const PtxasKernelReport &report : outcomes[i].reports) {
      EXPECT_EQ(report.spillStoreBytes, 0) << cases[i].label() << " " << report.kernel;
      EXPECT_EQ(report.spillLoadBytes, 0) << cases[i].label() << " " << report.kernel;
      EXPECT_EQ(report.stackFrameBytes, 0) << cases[i].label() << " " << report.kernel;
      EXPECT_GT(report.registers, 0);
      std::printf("[ ptxas ] %-8s %-7s %-22s %3d registers\n", cases[i].mod.c_str(),
                  kernelKindName(cases[i].config.kind), report.kernel.c_str(),
                  report.registers);
    }
  }
}

/// Head dims other than 64, 128 and 256 (multiples of 16; tile rows wider
/// than their data, partial copy trips) compile for sm_80 and sm_90 without
/// spills at the tiles the runtime takes there (choosePrefillShapeFor: the
/// mma.sync prefill on both; decode as flexAttention launches it: one token
/// of GQA 4, 8 tokens of GQA 8 and, at head dims up to 64, where sm_90 caps
/// the registers of up to 16 rows, 4 tokens of GQA 4), for every test mod.
TEST(NvrtcCompile, OtherHeadDimsCompileWithoutSpills) {
  REQUIRE_NVRTC();
  std::vector<Case> cases;
  // Without the full matrix, the test mods take turns over the (head dim,
  // arch, tokens) product, a fifth of the compiles: each mod meets every
  // head dim, arch and token count (but one mod the 4-token decode, which
  // only four kernels have).
  const size_t modCount = std::size(kTestMods);
  size_t turn = 0;
  for (int headDim : {32, 48, 80, 96, 112, 160, 192})
    for (const char *arch : {"sm_80", "sm_90"})
      for (int decodeTokens : {0, 1, 4, 8}) {
        if (decodeTokens == 4 && headDim > 64)
          continue;
        const size_t mine = turn++ % modCount;
        for (size_t m = 0; m < modCount; ++m) {
          if (!fullMatrix() && m != mine)
            continue;
          const char *mod = kTestMods[m];
          Case c;
          c.mod = mod;
          c.config.kind = decodeTokens == 0 ? KernelKind::Prefill : KernelKind::Decode;
          c.config.elementType = DType::BF16;
          c.config.headDim = headDim;
          c.config.returnLse = true;
          if (decodeTokens == 0) {
            c.config.choosePrefillShapeFor(arch);
          } else {
            c.config.groupSize = decodeTokens == 8 ? 8 : 4;
            c.config.queryTokens = decodeTokens;
          }
          c.arch = c.config.compileArchFor(arch);
          cases.push_back(c);
        }
      }
  auto start = std::chrono::steady_clock::now();
  std::vector<Outcome> outcomes = compileAll(cases, workerCount());
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_EQ(outcomes[i].error, "") << cases[i].label();
    ASSERT_FALSE(outcomes[i].reports.empty()) << cases[i].label();
    for (const PtxasKernelReport &report : outcomes[i].reports) {
      EXPECT_EQ(report.spillStoreBytes, 0) << cases[i].label() << " " << report.kernel;
      EXPECT_EQ(report.spillLoadBytes, 0) << cases[i].label() << " " << report.kernel;
      std::printf("[ ptxas ] %-8s %-40s %-5s %-20s %3d registers, %d/%d spill bytes\n",
                  cases[i].mod.c_str(), cases[i].config.describe().c_str(),
                  cases[i].arch.c_str(), report.kernel.c_str(), report.registers,
                  report.spillStoreBytes, report.spillLoadBytes);
    }
  }
  std::printf("[ sweep ] %zu kernels in %.1f s wall\n", cases.size(), wall);
}

/// BatchAttention's packed-batch kernels, as CudaBatchAttention.cpp builds
/// them (64 x 64 prefill tiles, 32 keys above head dim 128; decode for up
/// to 8 tokens), compile for sm_80 and sm_90 at head dims 64 to 256 without
/// spills (without the 5-CTA register cap flexAttention's decode takes on
/// sm_90 for up to 16 rows at head dims up to 64); so do the 16-bit decode
/// kernels on pages of 1 and 8 rows at head dims 128 to 256 (no tensor
/// maps there: Decode.cuh's kDecodeAtoms), those of 8-bit caches at every
/// head dim of kFloat8HeadDims with D = Dv (a covering, the formats and
/// element types in turn), and those of an f32 out; and so does the
/// GQA-packed prefill (PrefillGroup.cuh: 8 warps of 32 or 16 rows, GQA 4).
TEST(NvrtcCompile, PackedBatchKernelsCompileWithoutSpills) {
  REQUIRE_NVRTC();
  std::vector<Case> cases;
  auto packedCase = [](const char *mod, KernelKind kind, int headDim, const char *arch) {
    Case c;
    c.mod = mod;
    c.config.kind = kind;
    c.config.elementType = DType::BF16;
    c.config.headDim = headDim;
    c.config.blockM = 64;
    c.config.warpRows = 16;
    c.config.blockN = kind == KernelKind::Prefill && headDim > 128 ? 32 : 64;
    // As CudaBatchAttention's prefill config.
    c.config.recomputeModRows = kind == KernelKind::Prefill && headDim > 128;
    c.config.groupSize = kind == KernelKind::Decode ? 4 : 1;
    c.config.queryTokens = kind == KernelKind::Decode ? 8 : 1;
    c.config.returnLse = true;
    c.config.packedBatch = true;
    c.arch = arch;
    return c;
  };
  const char *const mods[] = {"none", "document", "softcap"};
  const char *const arches[] = {"sm_80", "sm_90"};
  const KernelKind kinds[] = {KernelKind::Prefill, KernelKind::Decode};
  // A covering of (mod, kind, head dim, arch): each (mod, head dim) as
  // prefill on one arch and decode on the other, the arch turning with
  // the pair, so that every pair of values of every two axes is compiled
  // (pairsCovered checks it) at half the kernels; the full matrix takes
  // the product.
  const int packedDims[] = {64, 96, 128, 192, 256};
  std::vector<std::vector<int>> packedCovered;
  for (int m = 0; m < 3; ++m)
    for (int k = 0; k < 2; ++k)
      for (int d = 0; d < 5; ++d)
        for (int a = 0; a < 2; ++a) {
          if (!fullMatrix() && a != (m + d + k) % 2)
            continue;
          const char *mod = mods[m];
          const int headDim = packedDims[d];
          Case c = packedCase(mod, kinds[k], headDim, arches[a]);
          cases.push_back(c);
          packedCovered.push_back({m, k, d, a});
          // An f32 out (its epilogues store pairs of floats): under the
          // document mask, the mod of most registers, at head dims 64,
          // 128 and 256.
          if (std::string(mod) == "document" && headDim % 64 == 0 && headDim != 192) {
            c.config.outputF32 = true;
            cases.push_back(c);
          }
        }
  // The GQA-packed prefill as CudaBatchAttention's groupRowsConfig builds
  // it (chooseGroupRowsShape: 256 rows up to head dim 128, on 64-key tiles
  // at 32; 128 rows above, and for 8-bit caches at 128): 16-bit at head
  // dim 32 and every head dim above, and over 8-bit caches at 64, 128 and
  // 256 (the formats and element types in turn). A covering: each (mod,
  // head dim) on one arch, alternating, so that every pair of values of
  // the three axes is compiled; one mod per 8-bit head dim, the arch in
  // turn. The full matrix takes the product.
  int groupVariant = 0;
  const int groupDims[] = {32, 64, 96, 128, 192, 256};
  for (int m = 0; m < 3; ++m)
    for (int d = 0; d < 6; ++d)
      for (int a = 0; a < 2; ++a)
        for (bool float8 : {false, true}) {
          const int headDim = groupDims[d];
          if (float8 && headDim != 64 && headDim != 128 && headDim != 256)
            continue;
          if (!fullMatrix() && (float8 ? m != d / 2 || a != (d / 2) % 2 : a != (m + d) % 2))
            continue;
          Case c = packedCase(mods[m], KernelKind::Prefill, headDim, arches[a]);
          c.config.groupRows = true;
          c.config.groupSize = 4;
          if (float8) {
            const int v = groupVariant++;
            c.config.kvFloat8 = v % 2 ? DType::F8E5M2 : DType::F8E4M3;
            c.config.elementType = (v / 2) % 2 ? DType::F16 : DType::BF16;
          }
          c.config.chooseGroupRowsShape();
          cases.push_back(c);
        }
  EXPECT_TRUE(pairsCovered(packedCovered, {3, 2, 5, 2}));
  // The 16-bit decode on pages under 16 rows: the mods in turn over (page,
  // head dim, arch), every pair of values of every two axes (the document
  // mask at head dim 256 on sm_90 on pages of one row, which spilled when
  // those tiles were rows); the full matrix takes every mod.
  const int smallPages[] = {1, 8}, wideDims[] = {128, 192, 256};
  for (int p = 0; p < 2; ++p)
    for (int d = 0; d < 3; ++d)
      for (int a = 0; a < 2; ++a)
        for (int m = 0; m < 3; ++m) {
          if (!fullMatrix() && m != (p + d + a + 1) % 3)
            continue;
          Case c = packedCase(mods[m], KernelKind::Decode, wideDims[d], arches[a]);
          c.config.pageSize = smallPages[p];
          cases.push_back(c);
        }
  // 8-bit caches: the covering of (mod, head dim, arch, kind).
  // (BatchAttention takes Dv = D.)
  std::vector<int> float8Dims;
  for (const auto &[dim, valueDim] : kFloat8HeadDims)
    if (dim == valueDim)
      float8Dims.push_back(dim);
  int variant = 0;
  std::vector<std::vector<int>> covered;
  for (size_t d = 0; d < float8Dims.size(); ++d) {
    for (size_t m = 0; m < std::size(mods); ++m)
      for (int a = 0; a < 2; ++a)
        for (int k = 0; k < 2; ++k) {
          if (!inFloat8Covering(d, m, a, k))
            continue;
          const int v = variant++;
          Case c = packedCase(mods[m], kinds[k], float8Dims[d], arches[a]);
          c.config.kvFloat8 = v % 2 ? DType::F8E5M2 : DType::F8E4M3;
          c.config.elementType = (v / 2) % 2 ? DType::F16 : DType::BF16;
          cases.push_back(c);
          covered.push_back({int(m), int(d), a, k});
        }
  }
  EXPECT_TRUE(pairsCovered(covered, {3, int(float8Dims.size()), 2, 2}));
  std::vector<Outcome> outcomes = compileAll(cases, workerCount());
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_EQ(outcomes[i].error, "") << cases[i].label();
    ASSERT_FALSE(outcomes[i].reports.empty()) << cases[i].label();
    for (const PtxasKernelReport &report : outcomes[i].reports) {
      EXPECT_EQ(report.spillStoreBytes, 0) << cases[i].label() << " " << report.kernel;
      EXPECT_EQ(report.spillLoadBytes, 0) << cases[i].label() << " " << report.kernel;
      // The GQA-packed tiles run closest to the 255 registers a thread may
      // have: their counts, for the record.
      if (cases[i].config.groupRows && report.kernel == "pagedc_prefill_group")
        std::printf("[ ptxas ] %s: %d registers\n", cases[i].label().c_str(), report.registers);
    }
  }
  std::printf("[ packed ] %zu kernels\n", cases.size());
}

/// The MLA decode kernel (templates/MlaDecode.cuh: D 576, Dv 512, 8 warps
/// of 64 output floats and 9 Q fragments each) and its merge compile for
/// sm_80 and sm_90 without spills: bf16 and f16, no mod, causal and
/// soft-capping, groups of 16 and 128 query heads, BatchAttention's 8
/// tokens.
TEST(NvrtcCompile, MlaDecodeKernelsCompileWithoutSpills) {
  REQUIRE_NVRTC();
  std::vector<Case> cases;
  // A covering of (mod, arch, element type): every pair of values, the
  // element type (and with it the group) in turn; the full matrix takes
  // the product.
  const char *const mlaMods[] = {"none", "causal", "softcap"};
  const char *const mlaArches[] = {"sm_80", "sm_90"};
  for (int m = 0; m < 3; ++m)
    for (int a = 0; a < 2; ++a)
      for (int e = 0; e < 2; ++e) {
        if (!fullMatrix() && e != (m + a) % 2)
          continue;
        const char *mod = mlaMods[m], *arch = mlaArches[a];
        const DType element = e ? DType::F16 : DType::BF16;
        Case c;
        c.mod = mod;
        c.config.kind = KernelKind::Decode;
        c.config.elementType = element;
        c.config.headDim = KernelConfig::kMlaKeyDim;
        c.config.valueHeadDim = KernelConfig::kMlaValueDim;
        c.config.blockN = 64;
        c.config.groupSize = element == DType::BF16 ? 128 : 16;
        c.config.queryTokens = 8;
        c.config.returnLse = true;
        c.config.packedBatch = true;
        c.arch = arch;
        ASSERT_TRUE(c.config.isMlaDecode());
        cases.push_back(c);
      }
  std::vector<Outcome> outcomes = compileAll(cases, workerCount());
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_EQ(outcomes[i].error, "") << cases[i].label();
    ASSERT_EQ(outcomes[i].reports.size(), 2u) << cases[i].label();
    for (const PtxasKernelReport &report : outcomes[i].reports) {
      EXPECT_EQ(report.spillStoreBytes, 0) << cases[i].label() << " " << report.kernel;
      EXPECT_EQ(report.spillLoadBytes, 0) << cases[i].label() << " " << report.kernel;
      std::printf("%s %s: %d registers\n", cases[i].label().c_str(), report.kernel.c_str(),
                  report.registers);
    }
  }
}

/// flexAttention's decode over 8-bit float caches and the prefill tile of
/// each head dim compile for sm_80 (the integer conversion) and sm_90
/// (cvt.rn.f16x2.e4m3x2 / e5m2x2) without spills (at head dim 64 without
/// the 5-CTA register cap of sm_90, Decode.cuh's kDecodeMinBlocks), at
/// every (D, Dv) of kFloat8HeadDims: a covering of (mod, head dim, arch,
/// kind), with the formats, element types, group sizes (1, 4) and decode
/// token counts (1, 3) in turn; the full matrix compiles the product; and
/// on sm_90 the warpgroup prefill's tiles at head dims 64, 128 and 256.
TEST(NvrtcCompile, Float8KernelsCompileWithoutSpills) {
  REQUIRE_NVRTC();
  std::vector<Case> cases;
  const char *const mods[] = {"none", "causal", "softcap"};
  int variant = 0;
  std::vector<std::vector<int>> covered;
  for (size_t d = 0; d < std::size(kFloat8HeadDims); ++d)
    for (size_t m = 0; m < std::size(mods); ++m)
      for (int a = 0; a < 2; ++a)
        for (int k = 0; k < 2; ++k) {
          if (!inFloat8Covering(d, m, a, k))
            continue;
          const int v = variant++;
          Case c;
          c.mod = mods[m];
          c.config.kind = k ? KernelKind::Decode : KernelKind::Prefill;
          c.config.kvFloat8 = (v / 2 + v) % 2 ? DType::F8E5M2 : DType::F8E4M3;
          c.config.elementType = (v / 2) % 2 ? DType::F16 : DType::BF16;
          c.config.headDim = kFloat8HeadDims[d].first;
          c.config.valueHeadDim =
              kFloat8HeadDims[d].second == kFloat8HeadDims[d].first ? 0 : kFloat8HeadDims[d].second;
          c.config.returnLse = true;
          if (k) {
            c.config.groupSize = (v / 3) % 2 ? 1 : 4;
            c.config.queryTokens = v % 5 == 0 ? 3 : 1;
          } else {
            // The prefill's tile of this head dim (choosePrefillShape, as
            // the runtime takes it for 8-bit caches on every target).
            c.config.groupSize = 1;
            c.config.choosePrefillShape();
          }
          c.arch = a ? "sm_90" : "sm_80";
          cases.push_back(c);
          covered.push_back({int(m), int(d), a, k});
        }
  EXPECT_TRUE(pairsCovered(covered, {3, int(std::size(kFloat8HeadDims)), 2, 2}));
  // sm_90: the warpgroup prefill's tile (choosePrefillShapeFor) of each
  // head dim it takes, whose producer converts the codes: every mod at each,
  // the formats and element types in turn.
  // Soft-capping (the mod of most registers) at every head dim and each
  // other mod at one; the full matrix takes every pair.
  int warpgroupVariant = 0;
  for (int m = 0; m < 3; ++m)
    for (int h = 0; h < 3; ++h) {
      const char *mod = mods[m];
      const int headDim = 64 << h;
      if (!fullMatrix() && std::string(mod) != "softcap" && m != h)
        continue;
      const int v = warpgroupVariant++;
      Case c;
      c.mod = mod;
      c.config.kind = KernelKind::Prefill;
      c.config.kvFloat8 = v % 2 ? DType::F8E5M2 : DType::F8E4M3;
      c.config.elementType = (v / 2) % 2 ? DType::F16 : DType::BF16;
      c.config.headDim = headDim;
      c.config.returnLse = true;
      c.config.groupSize = 1;
      c.config.choosePrefillShapeFor("sm_90");
      c.arch = c.config.compileArchFor("sm_90");
      cases.push_back(c);
    }
  // D 256's spill fallback, 64 x 32: one consumer warpgroup, whose
  // producer keeps 96 registers and converts larger batches of rows.
  Case narrow = cases.back();
  narrow.mod = "softcap";
  narrow.config.blockM = 64;
  narrow.config.blockN = 32;
  cases.push_back(narrow);
  std::vector<Outcome> outcomes = compileAll(cases, workerCount());
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_EQ(outcomes[i].error, "") << cases[i].label();
    ASSERT_FALSE(outcomes[i].reports.empty()) << cases[i].label();
    for (const PtxasKernelReport &report : outcomes[i].reports) {
      EXPECT_EQ(report.spillStoreBytes, 0) << cases[i].label() << " " << report.kernel;
      EXPECT_EQ(report.spillLoadBytes, 0) << cases[i].label() << " " << report.kernel;
      std::printf("[ ptxas ] %-36s %-6s %-20s %3d registers, %d/%d spill bytes\n",
                  cases[i].config.describe().c_str(), cases[i].arch.c_str(), report.kernel.c_str(),
                  report.registers, report.spillStoreBytes, report.spillLoadBytes);
    }
  }
}

TEST(NvrtcCompile, PrefillPtxUsesTensorCoreMma) {
  REQUIRE_NVRTC();
  for (DType type : {DType::F16, DType::BF16}) {
    KernelConfig config;
    config.elementType = type;
    KernelSource source = assembleKernel(config, testMod("causal"));
    CompileOptions options;
    options.arch = "sm_90";
    options.output = CompileOptions::Output::Ptx;
    CompileResult result = Nvrtc::get().compile(source.code, "prefill.cu", options);
    std::string mma = fmt::format("mma.sync.aligned.m16n8k16.row.col.f32.{0}.{0}.f32",
                                  type == DType::BF16 ? "bf16" : "f16");
    EXPECT_NE(result.image.find(mma), std::string::npos) << mma;
    EXPECT_NE(result.image.find("ldmatrix.sync.aligned.m8n8.x4.trans"), std::string::npos);
    EXPECT_NE(result.image.find("cp.async.cg.shared.global"), std::string::npos);
    EXPECT_NE(result.image.find(".entry pagedc_prefill"), std::string::npos);
    EXPECT_NE(result.image.find(".target sm_90"), std::string::npos);
  }
}

TEST(NvrtcCompile, ErrorsQuoteTheGeneratedLine) {
  REQUIRE_NVRTC();
  std::string mods = testMod("causal");
  // Break the mask's body: an undeclared name on a known line of the mod.
  size_t at = mods.find("return row.q >= kv;");
  ASSERT_NE(at, std::string::npos);
  mods.replace(at, 19, "return row.q >= kv_undeclared;");
  int modLine = static_cast<int>(std::count(mods.begin(), mods.begin() + at, '\n')) + 1;
  KernelSource source = assembleKernel(KernelConfig{}, mods);
  try {
    Nvrtc::get().compile(source.code, "pagedc_kernel.cu", CompileOptions{}, &source);
    FAIL() << "broken mod compiled";
  } catch (const Error &error) {
    std::string message = error.what();
    EXPECT_NE(message.find("kv_undeclared"), std::string::npos) << message;
    EXPECT_NE(message.find(fmt::format("generated mod code line {}", modLine)),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("| __device__") == std::string::npos
                  ? message.find("|   return row.q >= kv_undeclared;")
                  : 0,
              std::string::npos)
        << message;
    EXPECT_NE(message.find("full log:"), std::string::npos);
  }
}

/// `log` without ptxas's "Compile time = N ms" lines, which differ from run
/// to run.
std::string withoutCompileTimes(const std::string &log) {
  std::string kept;
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);)
    if (line.find("Compile time =") == std::string::npos)
      kept += line + "\n";
  return kept;
}

// The stage times change nothing NVRTC returns: the same cubin bytes and
// the same log (ptxas report included) as a plain compile, for each kernel
// kind and test mod, and each stage is reported.
TEST(NvrtcCompile, StageTimesKeepCubinAndLog) {
  REQUIRE_NVRTC();
  for (KernelKind kind : {KernelKind::Decode, KernelKind::Prefill})
    for (const char *mod : {"causal", "alibi", "document"}) {
      KernelConfig config;
      config.kind = kind;
      config.elementType = DType::BF16;
      config.groupSize = kind == KernelKind::Decode ? 4 : 1;
      KernelSource source = assembleKernel(config, testMod(mod));
      CompileOptions plain;
      plain.ptxasVerbose = true;
      CompileOptions timed = plain;
      timed.timeStages = true;
      CompileResult expected = Nvrtc::get().compile(source.code, "k.cu", plain, &source);
      CompileResult result = Nvrtc::get().compile(source.code, "k.cu", timed, &source);
      const std::string label = fmt::format("{} {}", mod, config.describe());
      EXPECT_TRUE(result.image == expected.image) << label;
      EXPECT_EQ(withoutCompileTimes(result.log), withoutCompileTimes(expected.log)) << label;
      EXPECT_FALSE(parsePtxasReport(result.log).empty()) << label;
      EXPECT_GT(result.stages.frontEnd, 0) << label;
      EXPECT_GT(result.stages.optimizer, 0) << label;
      EXPECT_GT(result.stages.ptxToSass, 0) << label;
      EXPECT_LT(expected.stages.frontEnd, 0) << label;
    }
}

TEST(NvrtcCompile, HookSignatureMismatchIsNamed) {
  REQUIRE_NVRTC();
  std::string mods = testMod("causal");
  size_t at = mods.find("bool mask(const Params &, const MaskRow &row, int,");
  ASSERT_NE(at, std::string::npos);
  mods.replace(at, 4, "int ");
  KernelSource source = assembleKernel(KernelConfig{}, mods);
  try {
    Nvrtc::get().compile(source.code, "pagedc_kernel.cu", CompileOptions{}, &source);
    FAIL() << "mismatched hook compiled";
  } catch (const Error &error) {
    EXPECT_NE(std::string(error.what()).find("pagedc_mods::mask must be"),
              std::string::npos)
        << error.what();
  }
}

TEST(NvrtcCompile, ParamsSizeIsCheckedAtCompileTime) {
  REQUIRE_NVRTC();
  KernelConfig config;
  config.kind = KernelKind::BlockMaskBuilder;
  config.paramsSize = 8; // softcap's Params is {int32_t, float}
  EXPECT_NO_THROW(Nvrtc::get().compile(
      assembleKernel(config, testMod("softcap")).code, "k.cu", CompileOptions{}));
  config.paramsSize = 16;
  EXPECT_THROW(Nvrtc::get().compile(assembleKernel(config, testMod("softcap")).code,
                                    "k.cu", CompileOptions{}),
               Error);
}

TEST(NvrtcCompile, CudaHeadersCanBeAdded) {
  REQUIRE_NVRTC();
  std::string include = cudaIncludeDirectory();
  if (include.empty())
    GTEST_SKIP() << "no CUDA include directory found";
  CompileOptions options;
  options.extraOptions = {"-I" + include};
  CompileResult result = Nvrtc::get().compile(
      "#include <cuda_fp16.h>\n"
      "extern \"C\" __global__ void halve(__half *x) { x[0] = __hmul(x[0], __float2half(0.5f)); }\n",
      "headers.cu", options);
  EXPECT_FALSE(result.image.empty());
}

// The figures line as older tools wrote it (indented) and as NVRTC 13 does
// (behind a "ptxas ." prefix; the parser read 0 from every such line before
// it looked for the number itself).
TEST(PtxasReport, ParsesNvrtcLog) {
  for (const char *figures :
       {"    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n",
        "ptxas         .     8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n"}) {
    SCOPED_TRACE(figures);
    std::string log = std::string("ptxas info    : 0 bytes gmem\n"
                                  "ptxas info    : Compiling entry function 'pagedc_decode' for "
                                  "'sm_90'\n"
                                  "ptxas info    : Function properties for pagedc_decode\n") +
                      figures + "ptxas info    : Used 168 registers, used 1 barriers\n";
    auto reports = parsePtxasReport(log);
    ASSERT_EQ(reports.size(), 1u);
    EXPECT_EQ(reports[0].kernel, "pagedc_decode");
    EXPECT_EQ(reports[0].arch, "sm_90");
    EXPECT_EQ(reports[0].registers, 168);
    EXPECT_EQ(reports[0].stackFrameBytes, 8);
    EXPECT_EQ(reports[0].spillStoreBytes, 4);
    EXPECT_EQ(reports[0].spillLoadBytes, 12);
  }
}

// The same figures from a real compile: 32 values live at once in a
// kernel held to 16 registers must spill.
TEST(PtxasReport, ReadsSpillsFromNvrtc) {
  CompileOptions options;
  options.arch = "sm_80";
  options.ptxasVerbose = true;
  options.extraOptions = {"--maxrregcount=16"};
  CompileResult result = Nvrtc::get().compile(
      "extern \"C\" __global__ void mix(float *x) {\n"
      "  float v[32];\n"
      "#pragma unroll\n"
      "  for (int j = 0; j < 32; ++j) v[j] = x[j * 977];\n"
      "  float s = 0.0f;\n"
      "#pragma unroll\n"
      "  for (int j = 0; j < 32; ++j) s = s * v[31 - j] + v[j];\n"
      "  x[1] = s;\n"
      "}\n",
      "spills.cu", options);
  auto reports = parsePtxasReport(result.log);
  ASSERT_EQ(reports.size(), 1u) << result.log;
  EXPECT_EQ(reports[0].kernel, "mix");
  EXPECT_GT(reports[0].spillStoreBytes, 0) << result.log;
  EXPECT_GT(reports[0].stackFrameBytes, 0) << result.log;
}
