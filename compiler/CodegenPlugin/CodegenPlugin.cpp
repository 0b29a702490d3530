//===- CodegenPlugin.cpp - The compiler behind a C ABI --------------------===//
//
// libpagedc-codegen.so: .attn text -> CUDA mod code and declarations for the
// runtime's loadCudaMods() (runtime/include/pagedc/CodegenPlugin.h). The
// steps are those of `pagedc --emit=cuda`: front end (with -D overrides),
// MLIRGen, the pass pipeline keeping the selected mods, then
// generateModCode(). Everything is caught here; only C types leave.
//
//===----------------------------------------------------------------------===//

#include "Conversion/CUDA/FlexToEmitC.h"
#include "Declarations.h"
#include "Frontend/Frontend.h"
#include "Frontend/MLIRGen.h"
#include "Pipeline.h"
#include "Target/CudaSource.h"

#include "pagedc/CodegenPlugin.h"
#include "pagedc/CudaJit.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/ErrorHandling.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <string>

using namespace pagedc;

namespace {

char *copyString(const std::string &text) {
  char *copy = static_cast<char *>(std::malloc(text.size() + 1));
  if (copy)
    std::memcpy(copy, text.c_str(), text.size() + 1);
  return copy;
}

PagedcCodegenOutput *answer(int status, const std::string &modCode,
                            const std::string &declarations,
                            const std::string &diagnostics) {
  auto *output = static_cast<PagedcCodegenOutput *>(
      std::calloc(1, sizeof(PagedcCodegenOutput)));
  if (!output)
    return nullptr;
  output->status = status;
  output->modCode = copyString(modCode);
  output->declarations = copyString(declarations);
  output->diagnostics = copyString(diagnostics);
  return output;
}

PagedcCodegenOutput *fail(int status, const std::string &message) {
  return answer(status, "", "", message);
}

PagedcCodegenOutput *generate(const PagedcCodegenInput &input) {
  std::string fileName = input.fileName ? input.fileName : "<input>";
  llvm::StringRef source(input.source ? input.source : "", input.sourceSize);
  std::string mask = input.mask ? input.mask : "";
  std::string score = input.score ? input.score : "";

  FrontendOptions frontend;
  for (size_t i = 0; i < input.numOverrides; ++i)
    frontend.constOverrides.push_back(
        {input.overrideNames[i], input.overrideValues[i]});
  std::string messages;
  std::unique_ptr<ast::Program> program;
  unsigned errors = 0;
  {
    llvm::raw_string_ostream stream(messages);
    DiagnosticEngine diags(fileName, source, stream);
    program = parseAndAnalyze(diags, frontend);
    errors = diags.getNumErrors();
  } // flushes the diagnostics
  if (!program)
    return fail(1, messages + fileName + ": " + std::to_string(errors) +
                       (errors == 1 ? " error" : " errors"));
  for (auto [name, wantMask] : {std::pair{mask, true}, std::pair{score, false}}) {
    if (name.empty())
      continue;
    const char *kind = wantMask ? "mask" : "score";
    const ast::ModDecl *mod = program->findMod(name);
    if (!mod)
      return fail(1, fileName + ": no " + kind + " mod named '" + name + "'");
    bool isMask = mod->getModKind() == ast::ModDecl::ModKind::Mask;
    if (isMask != wantMask)
      return fail(1, fileName + ": '" + name + "' is a " +
                         (isMask ? "mask" : "score") + " mod, not a " + kind +
                         " mod");
  }

  mlir::DialectRegistry registry;
  registerFlexDialects(registry);
  registerCudaLoweringDialects(registry);
  mlir::MLIRContext context(registry, mlir::MLIRContext::Threading::DISABLED);
  std::string mlirErrors;
  llvm::raw_string_ostream mlirStream(mlirErrors);
  mlir::ScopedDiagnosticHandler handler(&context, [&](mlir::Diagnostic &d) {
    mlirStream << d.getLocation() << ": " << d << "\n";
    return mlir::success();
  });

  // An empty selection is generated from an empty program, so that its
  // Params is empty like the declarations (as compileModsFromSource does).
  ast::Program empty;
  bool none = mask.empty() && score.empty();
  mlir::OwningOpRef<mlir::ModuleOp> module =
      mlirGen(context, none ? empty : *program);
  if (!module)
    return fail(2, fileName + ": MLIR generation failed:\n" + mlirErrors);
  if (!none) {
    PipelineOptions pipeline;
    for (const std::string &name : {mask, score})
      if (!name.empty())
        pipeline.keepMods.push_back(name);
    mlir::PassManager pm(&context);
    buildPipeline(pm, pipeline);
    if (mlir::failed(pm.run(*module)))
      return fail(2, fileName + ": the pass pipeline failed:\n" + mlirErrors);
  }
  llvm::Expected<ModuleDeclarations> declarations = collectDeclarations(*module);
  if (!declarations)
    return fail(2, fileName + ": " + llvm::toString(declarations.takeError()));
  llvm::Expected<std::string> code = generateModCode(*module, mask, score);
  if (!code)
    return fail(2, fileName + ": CUDA mod code: " +
                       llvm::toString(code.takeError()));
  return answer(0, *code,
                serializeModDeclarations(declarations->params,
                                         declarations->buffers),
                "");
}

/// An allocation LLVM could not make, with LLVM's reason.
class LLVMOutOfMemory : public std::bad_alloc {
public:
  explicit LLVMOutOfMemory(const char *reason)
      : reason_(reason ? reason : "") {}
  const char *what() const noexcept override { return reason_; }

private:
  const char *reason_; // a string literal of LLVM's
};

[[noreturn]] void throwOutOfMemory(void *, const char *reason, bool) {
  throw LLVMOutOfMemory(reason);
}

/// While generate() runs, LLVM's allocation failures (safe_malloc,
/// SmallVector growth, its new-handler if the host installed it) throw
/// instead of printing "LLVM ERROR: out of memory" and aborting the host
/// process: libLLVM is built without exceptions, so without a handler it
/// can only abort. The exception unwinds through LLVM's frames without
/// running their cleanups (they have unwind tables but no landing pads),
/// so what they held leaks; the host gets an error instead of SIGABRT.
/// The handler is process-wide: the runtime calls the plugin under one
/// lock, so it is never installed twice, but another thread using the same
/// libLLVM meanwhile would get the exception too.
class BadAllocHandlerScope {
public:
  BadAllocHandlerScope() {
    llvm::install_bad_alloc_error_handler(throwOutOfMemory);
  }
  ~BadAllocHandlerScope() { llvm::remove_bad_alloc_error_handler(); }
  BadAllocHandlerScope(const BadAllocHandlerScope &) = delete;
  BadAllocHandlerScope &operator=(const BadAllocHandlerScope &) = delete;
};

} // namespace

extern "C" {

uint32_t pagedc_codegen_abi_version(void) { return PAGEDC_CODEGEN_ABI_VERSION; }

const char *pagedc_codegen_build_id(void) {
  // The same function the runtime uses, over this module's own copy of the
  // embedded templates.
  return codegenBuildId().c_str();
}

PagedcCodegenOutput *pagedc_codegen_generate(const PagedcCodegenInput *input) {
  if (!input)
    return fail(2, "pagedc_codegen_generate: no input");
  if (input->abiVersion != PAGEDC_CODEGEN_ABI_VERSION)
    return fail(2, "pagedc_codegen_generate: ABI version " +
                       std::to_string(input->abiVersion) + ", the plugin has " +
                       std::to_string(PAGEDC_CODEGEN_ABI_VERSION));
  try {
    BadAllocHandlerScope outOfMemory;
    return generate(*input);
  } catch (const std::bad_alloc &error) {
    // Unwinding freed what generate()'s own frames held (the MLIR context
    // and its module), so the answer below can usually be allocated; if
    // not, the runtime reports the null answer as out of memory too.
    std::string what = error.what();
    return fail(2, std::string(input->fileName ? input->fileName : "<input>") +
                       ": out of memory during code generation" +
                       (what.empty() || what == "std::bad_alloc"
                            ? ""
                            : " (LLVM: " + what + ")") +
                       "; the program's mods may expand too much when "
                       "inlined, or the process's memory is limited");
  } catch (const std::exception &error) {
    return fail(2, std::string("code generation failed: ") + error.what());
  } catch (...) {
    return fail(2, "code generation failed (unknown exception)");
  }
}

void pagedc_codegen_free(PagedcCodegenOutput *output) {
  if (!output)
    return;
  std::free(output->modCode);
  std::free(output->declarations);
  std::free(output->diagnostics);
  std::free(output);
}

} // extern "C"
