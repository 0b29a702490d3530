//===- CorpusCudaTest.cpp - Every corpus mod compiles to CUDA kernels -----===//
//
// Each mask and score mod of examples/*.attn goes through the whole CUDA
// path (front end, MLIRGen, pipeline, -convert-flex-to-emitc, translateToCpp,
// assembleKernel, NVRTC) and must compile to a cubin with 0 spill bytes.
//
// The full matrix is {prefill, decode} x {f16, bf16} x {d64, d128} x
// {sm_80, sm_90} per mod (16 compiles each; 576 kernels, about 440 s of
// CPU). PAGEDC_CUDA_MATRIX selects a smaller one:
//   pairwise  five configurations per mod that hold every pair of values of
//             every two axes (a covering array of strength 2), flipped per
//             mod so that across the corpus every configuration of the 16
//             is taken;
//   quick     two complementary configurations per mod that between them
//             hold every value of every axis, a different pair for each
//             mod (the 16 configurations in turn), so that the corpus
//             takes every configuration (checked): what the full suite
//             runs (the whole matrix is the extended tier's). A spill is a
//             property of a mod's code at one configuration; each
//             configuration meets several mods of different shapes.
// Compiles run in parallel, one per hardware thread. Skipped only when NVRTC
// cannot be loaded.
//
//===----------------------------------------------------------------------===//

#include "Target/CudaSource.h"

#include "Frontend/Frontend.h"
#include "Frontend/MLIRGen.h"
#include "Pipeline.h"

#include "Conversion/CUDA/FlexToEmitC.h"
#include "Flex/FlexDialect.h"

#include "pagedc/Error.h"
#include "pagedc/Nvrtc.h"

#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>
#include <thread>

namespace {

/// One kernel to compile.
struct Job {
  std::string label;
  pagedc::KernelSource source;
  std::string arch;
};

/// The configurations each mod is compiled for.
struct Configuration {
  pagedc::KernelKind kind;
  pagedc::DType dtype;
  int headDim;
  const char *arch;
};

enum class Matrix { Quick, Pairwise, Full };

/// The configurations mod number `modIndex` is compiled for.
std::vector<Configuration> configurations(Matrix matrix, size_t modIndex) {
  using pagedc::DType;
  using pagedc::KernelKind;
  // Bit 3: decode, bit 2: bf16, bit 1: head dim 128, bit 0: sm_90.
  auto configuration = [](unsigned bits) {
    return Configuration{bits & 8 ? KernelKind::Decode : KernelKind::Prefill,
                         bits & 4 ? DType::BF16 : DType::F16,
                         bits & 2 ? 128 : 64, bits & 1 ? "sm_90" : "sm_80"};
  };
  // Mod i: configuration i % 16 and its complement; 8 mods in a row take
  // the 16 configurations.
  const unsigned flip = static_cast<unsigned>(modIndex % 16);
  if (matrix == Matrix::Quick)
    return {configuration(flip), configuration(flip ^ 0b1111)};
  std::vector<Configuration> chosen;
  if (matrix == Matrix::Full) {
    for (unsigned bits = 0; bits < 16; ++bits)
      chosen.push_back(configuration(bits));
    return chosen;
  }
  // Every two of the four columns hold 00, 01, 10 and 11 in some row;
  // flipping a column keeps that, so each mod takes another flip.
  const unsigned covering[] = {0b0000, 0b0111, 0b1011, 0b1101, 0b1110};
  for (unsigned row : covering)
    chosen.push_back(configuration(row ^ flip));
  return chosen;
}

/// The flex module of one .attn file after the pipeline, keeping `mods`.
mlir::OwningOpRef<mlir::ModuleOp>
compileProgram(mlir::MLIRContext &context, const std::string &path,
               const std::vector<std::string> &mods, std::string &error) {
  auto buffer = llvm::MemoryBuffer::getFile(path, /*IsText=*/true);
  if (!buffer) {
    error = "cannot read " + path;
    return nullptr;
  }
  std::string messages;
  llvm::raw_string_ostream diagnosticStream(messages);
  pagedc::DiagnosticEngine diags(path, (*buffer)->getBuffer(),
                                 diagnosticStream);
  auto program = pagedc::parseAndAnalyze(diags, pagedc::FrontendOptions());
  if (!program) {
    error = messages;
    return nullptr;
  }
  mlir::OwningOpRef<mlir::ModuleOp> module = pagedc::mlirGen(context, *program);
  if (!module) {
    error = "MLIRGen failed for " + path;
    return nullptr;
  }
  pagedc::PipelineOptions options;
  options.keepMods = mods;
  mlir::PassManager pm(&context);
  pagedc::buildPipeline(pm, options);
  if (mlir::failed(pm.run(*module))) {
    error = "the pipeline failed for " + path;
    return nullptr;
  }
  return module;
}

TEST(CorpusCuda, EveryModCompilesWithoutSpills) {
  std::string reason;
  if (!pagedc::Nvrtc::available(&reason))
    GTEST_SKIP() << "NVRTC not available: " << reason;
  const char *matrixName = std::getenv("PAGEDC_CUDA_MATRIX");
  const std::string matrixSetting = matrixName ? matrixName : "full";
  Matrix matrix = Matrix::Full;
  if (matrixSetting == "quick")
    matrix = Matrix::Quick;
  else if (matrixSetting == "pairwise")
    matrix = Matrix::Pairwise;
  else
    ASSERT_EQ(matrixSetting, "full")
        << "PAGEDC_CUDA_MATRIX must be full, pairwise or quick";

  mlir::DialectRegistry registry;
  pagedc::registerFlexDialects(registry);
  pagedc::registerCudaLoweringDialects(registry);
  mlir::MLIRContext context(registry);
  context.loadAllAvailableDialects();

  std::vector<std::string> files;
  std::error_code ec;
  for (llvm::sys::fs::directory_iterator it(PAGEDC_EXAMPLES_DIR, ec), end;
       it != end && !ec; it.increment(ec))
    if (llvm::sys::path::extension(it->path()) == ".attn")
      files.push_back(it->path());
  std::sort(files.begin(), files.end());
  ASSERT_FALSE(files.empty()) << "no examples in " << PAGEDC_EXAMPLES_DIR;

  // Generate every translation unit first (MLIR is single-threaded here).
  std::vector<Job> jobs;
  size_t modCount = 0;
  std::set<std::string> configurationsTaken;
  for (const std::string &path : files) {
    std::string error;
    mlir::OwningOpRef<mlir::ModuleOp> all =
        compileProgram(context, path, {}, error);
    ASSERT_TRUE(all) << error;
    std::vector<std::pair<std::string, bool>> mods;
    for (auto mod : all->getOps<pagedc::flex::ModOp>())
      mods.push_back({mod.getSymName().str(), mod.isMask()});
    for (const auto &[name, isMask] : mods) {
      const size_t modIndex = modCount++;
      mlir::OwningOpRef<mlir::ModuleOp> module =
          compileProgram(context, path, {name}, error);
      ASSERT_TRUE(module) << error;
      for (const Configuration &c : configurations(matrix, modIndex)) {
        configurationsTaken.insert(std::to_string(int(c.kind)) + "/" +
                                   std::to_string(int(c.dtype)) + "/" +
                                   std::to_string(c.headDim) + "/" + c.arch);
        pagedc::KernelConfig config;
        config.kind = c.kind;
        config.elementType = c.dtype;
        config.headDim = c.headDim;
        if (c.kind == pagedc::KernelKind::Decode)
          config.groupSize = 4;
        else
          config.choosePrefillShape();
        llvm::Expected<pagedc::KernelSource> source = pagedc::buildKernelSource(
            *module, isMask ? name : "", isMask ? "" : name, config);
        ASSERT_TRUE(bool(source)) << path << " " << name << ": "
                                  << llvm::toString(source.takeError());
        std::string label = llvm::sys::path::filename(path).str() + ":" + name +
                            " " + config.describe() + " " + c.arch;
        jobs.push_back({label, std::move(*source), c.arch});
      }
    }
  }

  // Compile in parallel.
  auto start = std::chrono::steady_clock::now();
  std::atomic<size_t> next{0};
  std::mutex failuresMutex;
  std::vector<std::string> failures;
  auto worker = [&] {
    for (size_t i = next++; i < jobs.size(); i = next++) {
      const Job &job = jobs[i];
      pagedc::CompileOptions options;
      options.arch = job.arch;
      options.ptxasVerbose = true;
      std::string failure;
      try {
        pagedc::CompileResult result = pagedc::Nvrtc::get().compile(
            job.source.code, "corpus.cu", options, &job.source);
        for (const pagedc::PtxasKernelReport &report :
             pagedc::parsePtxasReport(result.log))
          if (report.spillStoreBytes != 0 || report.spillLoadBytes != 0)
            failure = job.label + ": " + report.kernel + " spills " +
                      std::to_string(report.spillStoreBytes) + " bytes";
        if (result.image.empty())
          failure = job.label + ": empty cubin";
      } catch (const pagedc::Error &error) {
        failure = job.label + ": " + error.what();
      }
      if (!failure.empty()) {
        std::lock_guard<std::mutex> lock(failuresMutex);
        failures.push_back(failure);
      }
    }
  };
  unsigned threads = std::max(2u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (unsigned i = 0; i < threads; ++i)
    pool.emplace_back(worker);
  for (std::thread &thread : pool)
    thread.join();
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();

  std::printf("corpus: %zu files, %zu mods, %zu kernels (%s matrix) compiled "
              "in %.1f s on %u threads\n",
              files.size(), modCount, jobs.size(), matrixSetting.c_str(),
              seconds, threads);
  for (const std::string &failure : failures)
    ADD_FAILURE() << failure;
  // Every configuration of the 16 compiled some mod.
  EXPECT_EQ(configurationsTaken.size(), 16u);
}

} // namespace
