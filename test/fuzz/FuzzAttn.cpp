//===- FuzzAttn.cpp - libFuzzer target: .attn through the pass pipeline ---===//
//
// The input is the text of a .attn file. It goes through everything the
// compiler does before a backend: lexer, parser, Sema, MLIRGen and the pass
// pipeline of compiler/Pipeline.h (inline, select, fold, canonicalize, cse,
// dependence analysis), the same calls `pagedc --emit=lowered` makes.
//
// Findings: any crash or sanitizer report; a file rejected without an error;
// an accepted file that MLIRGen cannot turn into a verified module (MLIRGen.h:
// "a bug in Sema or here, never in the user's input"); a pipeline that fails
// without an error diagnostic. A pipeline error with a diagnostic is an
// ordinary rejection.
//
//===----------------------------------------------------------------------===//

#include "Frontend/Frontend.h"
#include "Frontend/MLIRGen.h"
#include "Pipeline.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

[[noreturn]] void finding(const char *what, const std::string &detail) {
  std::fprintf(stderr, "pagedc-fuzz-attn: FINDING: %s\n%s\n", what,
               detail.c_str());
  std::abort();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  // Bigger inputs only make each run slower; the size classes of issue 10
  // (deep nesting, long chains) are covered by generated regression tests.
  if (size > 64 * 1024)
    return -1;
  std::string text(reinterpret_cast<const char *>(data), size);
  std::string printed;
  llvm::raw_string_ostream sink(printed);
  pagedc::DiagnosticEngine diags("fuzz.attn", text, sink);
  std::unique_ptr<pagedc::ast::Program> program =
      pagedc::parseAndAnalyze(diags, pagedc::FrontendOptions());
  if (!program) {
    if (!diags.hasErrors())
      finding("rejected without an error", sink.str());
    return 0;
  }
  if (diags.hasErrors())
    finding("accepted with errors", sink.str());

  mlir::DialectRegistry registry;
  pagedc::registerFlexDialects(registry);
  mlir::MLIRContext context(registry, mlir::MLIRContext::Threading::DISABLED);
  std::string mlirErrors;
  unsigned errorCount = 0;
  mlir::ScopedDiagnosticHandler handler(
      &context, [&](mlir::Diagnostic &diagnostic) {
        if (diagnostic.getSeverity() == mlir::DiagnosticSeverity::Error) {
          ++errorCount;
          mlirErrors += diagnostic.str() + "\n";
        }
        return mlir::success();
      });
  mlir::OwningOpRef<mlir::ModuleOp> module = pagedc::mlirGen(context, *program);
  if (!module)
    finding("MLIRGen failed on a program Sema accepted", mlirErrors);

  // Keep everything, or (on odd sizes, so both paths are fuzzed) only the
  // last mod, which exercises -flex-select-mods.
  pagedc::PipelineOptions options;
  if ((size & 1) && !program->mods.empty())
    options.keepMods.push_back(program->mods.back()->getName().str());
  mlir::PassManager pm(&context);
  pagedc::buildPipeline(pm, options);
  unsigned before = errorCount;
  if (mlir::failed(pm.run(*module))) {
    if (errorCount == before)
      finding("the pipeline failed without an error", text);
    return 0;
  }
  if (mlir::failed(mlir::verify(*module)))
    finding("the lowered module does not verify", mlirErrors);
  return 0;
}
