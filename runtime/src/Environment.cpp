//===- Environment.cpp - The runtime's process-wide settings --------------===//
//
// The runtime's only std::getenv calls (Environment.h has the table).
//
//===----------------------------------------------------------------------===//

#include "Environment.h"

#include <cstdlib>

namespace pagedc::env {

namespace {
const char *nonEmpty(const char *value) { return value && *value ? value : nullptr; }
} // namespace

const char *variableName(Setting setting) {
  switch (setting) {
  case Setting::CacheDir:
    return "PAGEDC_CACHE_DIR";
  case Setting::CudaDriver:
    return "PAGEDC_CUDA_DRIVER";
  case Setting::EmuDriver:
    return "PAGEDC_EMU_DRIVER";
  case Setting::EmuCxx:
    return "PAGEDC_EMU_CXX";
  case Setting::CodegenPlugin:
    return "PAGEDC_CODEGEN_PLUGIN";
  case Setting::TemplateDir:
    return "PAGEDC_TEMPLATE_DIR";
  case Setting::Home:
    return "HOME";
  case Setting::TmpDir:
    return "TMPDIR";
  case Setting::Path:
    return "PATH";
  case Setting::LdLibraryPath:
    return "LD_LIBRARY_PATH";
  case Setting::CudaHome:
    return "CUDA_HOME";
  case Setting::CudaPath:
    return "CUDA_PATH";
  }
  return "";
}

const char *get(Setting setting) { return nonEmpty(std::getenv(variableName(setting))); }

bool isSetButEmpty(Setting setting) {
  const char *value = std::getenv(variableName(setting));
  return value && !*value;
}

const char *kernelOptionVariable(const char *variable) {
  return nonEmpty(std::getenv(variable));
}

} // namespace pagedc::env
