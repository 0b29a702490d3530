/*===- CodegenPlugin.h - The C ABI of the code generator plugin -*- C -*-===//
 *
 * The compiler (front end, MLIRGen, pass pipeline, flex -> EmitC -> CUDA) is
 * also built as a loadable module, lib/libpagedc-codegen.so, so that the
 * runtime (which never links LLVM or MLIR) can turn .attn text into CUDA mod
 * code on demand: pagedc::loadCudaMods() (CudaJit.h) dlopens it only when its
 * variant index misses. The module exports the four functions below and
 * nothing else; no C++ type or exception crosses this boundary.
 *
 *===----------------------------------------------------------------------===*/
#ifndef PAGEDC_CODEGENPLUGIN_H
#define PAGEDC_CODEGENPLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever a struct or function below changes. */
#define PAGEDC_CODEGEN_ABI_VERSION 1

/* The file name the runtime looks for. */
#define PAGEDC_CODEGEN_PLUGIN_FILE "libpagedc-codegen.so"

/* One request: a .attn program and the mods to generate code for. */
struct PagedcCodegenInput {
  uint32_t abiVersion;      /* PAGEDC_CODEGEN_ABI_VERSION */
  const char *fileName;     /* for diagnostics */
  const char *source;       /* the program text (need not end in NUL) */
  size_t sourceSize;
  const char *mask;         /* mask mod name, "" for none */
  const char *score;        /* score mod name, "" for none */
  size_t numOverrides;      /* -D NAME=VALUE constant overrides */
  const char *const *overrideNames;
  const char *const *overrideValues;
};

/* The answer; every string is NUL-terminated and owned by the plugin until
 * pagedc_codegen_free(). */
struct PagedcCodegenOutput {
  /* 0: success; 1: an error in the input (diagnostics name file:line:col
   * where the front end found it); 2: an internal error. */
  int status;
  /* The generated mod code (templates/Hooks.cuh hooks), on success. */
  char *modCode;
  /* The selection's params and buffers in the text form of
   * pagedc::serializeModDeclarations() (CudaJit.h), on success. */
  char *declarations;
  /* Error text on failure ("" on success). */
  char *diagnostics;
};

typedef uint32_t (*PagedcCodegenAbiVersionFn)(void);
typedef const char *(*PagedcCodegenBuildIdFn)(void);
typedef struct PagedcCodegenOutput *(*PagedcCodegenGenerateFn)(
    const struct PagedcCodegenInput *input);
typedef void (*PagedcCodegenFreeFn)(struct PagedcCodegenOutput *output);

/* Exported by the plugin under these names. */
uint32_t pagedc_codegen_abi_version(void);
/* "pagedc <version> templates <hash>": what the runtime folds into its
 * variant keys; a plugin whose id differs from the runtime's is refused. */
const char *pagedc_codegen_build_id(void);
/* Never returns null (allocation failure aside); never throws. */
struct PagedcCodegenOutput *
pagedc_codegen_generate(const struct PagedcCodegenInput *input);
void pagedc_codegen_free(struct PagedcCodegenOutput *output);

#ifdef __cplusplus
}
#endif

#endif /* PAGEDC_CODEGENPLUGIN_H */
