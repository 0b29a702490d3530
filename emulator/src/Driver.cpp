//===- Driver.cpp - The CUDA driver API over the emulator -----------------===//
//
// libpagedc-emu-cuda.so exports the driver entry points the pagedc runtime
// resolves from libcuda.so.1 (runtime/internal/pagedc/CudaDriver.h), so the
// runtime's own CUDA path (memory, uploads, launch planning, parameter
// packing, launches) runs unchanged on the emulator: one device, "device
// memory" in host memory that the checkers know, modules that are emulator
// images, launches that run to completion before cuLaunchKernel returns.
//
// Environment: PAGEDC_EMU_CHECKS (Emulator.h), PAGEDC_EMU_THREADS,
// PAGEDC_EMU_SAMPLE_BLOCKS=N (run N blocks of each grid, for counting only;
// PAGEDC_EMU_SAMPLE_KERNELS=a,b limits that to the kernels named),
// PAGEDC_EMU_REPORT=FILE (each report as a JSON line), PAGEDC_EMU_COUNTERS=FILE
// (a JSON line per launch), PAGEDC_EMU_QUIET=1 (no reports on stderr),
// PAGEDC_EMU_REGISTERS=kernel=N[,kernel=N] (registers per thread that
// cuOccupancyMaxActiveBlocksPerMultiprocessor assumes for those kernels;
// DeviceLimits::defaultRegisters for others: `pagedc-gpu model` sets the
// ptxas figures of the configuration it models).
//
//===----------------------------------------------------------------------===//

#include "pagedc-emu/Emulator.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>

using namespace pagedc;

namespace {

enum : int {
  kSuccess = 0,
  kInvalidValue = 1,
  kOutOfMemory = 2,
  kNotInitialized = 3,
  kInvalidDevice = 101,
  kInvalidImage = 200,
  kInvalidContext = 201,
  kInvalidHandle = 400,
  kNotFound = 500,
  kLaunchOutOfResources = 701,
  kLaunchFailed = 719,
};

bool initialized = false;
std::mutex driverMutex;
std::string lastDetail;

struct Function {
  std::shared_ptr<emu::Module> module;
  const emu::Kernel *kernel = nullptr;
  unsigned maxDynamicShared = 48 * 1024;
};

struct ModuleHandle {
  std::shared_ptr<emu::Module> module;
  std::map<std::string, std::unique_ptr<Function>> functions;
};

struct Event {
  std::chrono::steady_clock::time_point time;
};

int fail(int code, std::string detail) {
  std::lock_guard<std::mutex> lock(driverMutex);
  lastDetail = std::move(detail);
  return code;
}

std::string jsonString(const std::string &text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buffer[8];
      std::snprintf(buffer, sizeof(buffer), "\\u%04x", c);
      out += buffer;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

void appendLine(const char *variable, const std::string &line) {
  const char *path = std::getenv(variable);
  if (!path || !*path)
    return;
  std::lock_guard<std::mutex> lock(driverMutex);
  if (FILE *file = std::fopen(path, "a")) {
    std::fputs(line.c_str(), file);
    std::fputc('\n', file);
    std::fclose(file);
  }
}

const emu::DeviceLimits kLimits;

} // namespace

#define EXPORT extern "C" __attribute__((visibility("default")))

/// Marks this library as the emulator to the runtime (CudaDriver.cpp).
EXPORT int pagedcEmuDriverVersion() { return 1; }

EXPORT int cuInit(unsigned flags) {
  if (flags != 0)
    return kInvalidValue;
  initialized = true;
  return kSuccess;
}

EXPORT int cuDriverGetVersion(int *version) {
  if (!version)
    return kInvalidValue;
  *version = 12080;
  return kSuccess;
}

EXPORT int cuGetErrorName(int error, const char **name) {
  if (!name)
    return kInvalidValue;
  switch (error) {
  case kSuccess:
    *name = "CUDA_SUCCESS";
    break;
  case kInvalidValue:
    *name = "CUDA_ERROR_INVALID_VALUE";
    break;
  case kOutOfMemory:
    *name = "CUDA_ERROR_OUT_OF_MEMORY";
    break;
  case kNotInitialized:
    *name = "CUDA_ERROR_NOT_INITIALIZED";
    break;
  case kInvalidDevice:
    *name = "CUDA_ERROR_INVALID_DEVICE";
    break;
  case kInvalidImage:
    *name = "CUDA_ERROR_INVALID_IMAGE";
    break;
  case kInvalidContext:
    *name = "CUDA_ERROR_INVALID_CONTEXT";
    break;
  case kInvalidHandle:
    *name = "CUDA_ERROR_INVALID_HANDLE";
    break;
  case kNotFound:
    *name = "CUDA_ERROR_NOT_FOUND";
    break;
  case kLaunchOutOfResources:
    *name = "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES";
    break;
  case kLaunchFailed:
    *name = "CUDA_ERROR_LAUNCH_FAILED";
    break;
  default:
    *name = nullptr;
    return kInvalidValue;
  }
  return kSuccess;
}

EXPORT int cuGetErrorString(int error, const char **text) {
  if (!text)
    return kInvalidValue;
  static thread_local std::string copy;
  {
    std::lock_guard<std::mutex> lock(driverMutex);
    copy = lastDetail;
  }
  if (error != kSuccess && !copy.empty()) {
    *text = copy.c_str();
    return kSuccess;
  }
  *text = error == kSuccess ? "no error" : "pagedc SIMT emulator error";
  return kSuccess;
}

EXPORT int cuDeviceGetCount(int *count) {
  if (!count)
    return kInvalidValue;
  *count = 1;
  return initialized ? kSuccess : kNotInitialized;
}

EXPORT int cuDeviceGet(int *device, int ordinal) {
  if (!device)
    return kInvalidValue;
  if (ordinal != 0)
    return kInvalidDevice;
  *device = 0;
  return kSuccess;
}

EXPORT int cuDeviceGetName(char *name, int length, int device) {
  if (!name || length <= 0)
    return kInvalidValue;
  if (device != 0)
    return kInvalidDevice;
  std::snprintf(name, static_cast<size_t>(length), "pagedc SIMT emulator (H100 limits)");
  return kSuccess;
}

/// The SM count the emulated device reports: PAGEDC_EMU_MULTIPROCESSORS
/// (1-1024; tests take a few so that plans made per SM, such as the
/// warpgroup prefill's persistent CTAs, show at small sizes), else the
/// H100's. Any other value: 0, after a message on stderr.
static int multiprocessorsReported() {
  const char *text = std::getenv("PAGEDC_EMU_MULTIPROCESSORS");
  if (!text || !*text)
    return kLimits.multiprocessors;
  char *rest = nullptr;
  const long value = std::strtol(text, &rest, 10);
  if (rest && *rest == '\0' && value >= 1 && value <= 1024)
    return static_cast<int>(value);
  std::fprintf(stderr,
               "pagedc emulator: PAGEDC_EMU_MULTIPROCESSORS is '%s': expected an integer "
               "from 1 to 1024\n",
               text);
  return 0;
}

EXPORT int cuDeviceGetAttribute(int *value, int attribute, int device) {
  if (!value)
    return kInvalidValue;
  if (device != 0)
    return kInvalidDevice;
  switch (attribute) {
  case 16: // multiprocessors
    *value = multiprocessorsReported();
    return *value > 0 ? kSuccess : kInvalidValue;
  case 75: // compute capability major
    *value = 9;
    return kSuccess;
  case 76: // minor
    *value = 0;
    return kSuccess;
  case 97: // max shared memory per block, opt-in
    *value = kLimits.maxSharedMemoryPerBlockOptin;
    return kSuccess;
  case 1: // max threads per block
    *value = kLimits.maxThreadsPerBlock;
    return kSuccess;
  default:
    *value = 0;
    return kInvalidValue;
  }
}

EXPORT int cuDeviceTotalMem_v2(size_t *bytes, int device) {
  if (!bytes)
    return kInvalidValue;
  if (device != 0)
    return kInvalidDevice;
  *bytes = kLimits.memoryBytes;
  return kSuccess;
}

EXPORT int cuDevicePrimaryCtxRetain(void **context, int device) {
  if (!context)
    return kInvalidValue;
  if (device != 0)
    return kInvalidDevice;
  static int token;
  *context = &token;
  return kSuccess;
}
EXPORT int cuDevicePrimaryCtxRelease_v2(int device) {
  return device == 0 ? kSuccess : kInvalidDevice;
}
EXPORT int cuCtxSetCurrent(void *) { return kSuccess; }
EXPORT int cuCtxSynchronize() { return kSuccess; }

EXPORT int cuModuleLoadData(void **module, const void *image) {
  if (!module || !image)
    return kInvalidValue;
  std::string error;
  auto loaded = emu::loadModule(image, &error);
  if (!loaded)
    return fail(kInvalidImage, "cuModuleLoadData: " + error);
  auto handle = new ModuleHandle;
  handle->module = std::move(loaded);
  *module = handle;
  return kSuccess;
}

EXPORT int cuModuleUnload(void *module) {
  delete static_cast<ModuleHandle *>(module);
  return kSuccess;
}

EXPORT int cuModuleGetFunction(void **function, void *module, const char *name) {
  if (!function || !module || !name)
    return kInvalidValue;
  auto *handle = static_cast<ModuleHandle *>(module);
  std::lock_guard<std::mutex> lock(driverMutex);
  auto &slot = handle->functions[name];
  if (!slot) {
    const emu::Kernel *kernel = emu::findKernel(*handle->module, name);
    if (!kernel) {
      handle->functions.erase(name);
      lastDetail = std::string("the emulator image has no kernel named ") + name;
      return kNotFound;
    }
    slot = std::make_unique<Function>();
    slot->module = handle->module;
    slot->kernel = kernel;
  }
  *function = slot.get();
  return kSuccess;
}

EXPORT int cuFuncSetAttribute(void *function, int attribute, int value) {
  if (!function)
    return kInvalidHandle;
  if (attribute != 8) // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    return kInvalidValue;
  if (value < 0 || value > kLimits.maxSharedMemoryPerBlockOptin)
    return kInvalidValue;
  static_cast<Function *>(function)->maxDynamicShared = static_cast<unsigned>(value);
  return kSuccess;
}

/// Registers per thread of kernel `name`: PAGEDC_EMU_REGISTERS, read at
/// each query, or the default.
static int registersOf(const std::string &name) {
  const char *list = std::getenv("PAGEDC_EMU_REGISTERS");
  if (!list)
    return kLimits.defaultRegisters;
  std::string text(list);
  size_t at = 0;
  while (at <= text.size()) {
    size_t end = text.find(',', at);
    if (end == std::string::npos)
      end = text.size();
    std::string entry = text.substr(at, end - at);
    size_t equals = entry.find('=');
    if (equals != std::string::npos && entry.substr(0, equals) == name) {
      char *rest = nullptr;
      long value = std::strtol(entry.c_str() + equals + 1, &rest, 10);
      if (rest && *rest == '\0' && value >= 1 && value <= 255)
        return static_cast<int>(value);
    }
    at = end + 1;
  }
  return kLimits.defaultRegisters;
}

/// Resident CTAs per SM by the H100's limits: threads, registers
/// (allocated per warp in units of 256, per thread in units of 8), shared
/// memory (1 KiB reserved per CTA) and the CTA limit.
EXPORT int cuOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, void *function,
                                                       int blockSize, size_t dynamicShared) {
  if (!blocks || !function)
    return !blocks ? kInvalidValue : kInvalidHandle;
  if (blockSize < 1 || blockSize > kLimits.maxThreadsPerBlock)
    return kInvalidValue;
  const int registers = registersOf(static_cast<Function *>(function)->kernel->name);
  const int warps = (blockSize + 31) / 32;
  const int perWarp = ((registers + 7) / 8 * 8 * 32 + 255) / 256 * 256;
  int resident = std::min(kLimits.ctasPerSm, kLimits.threadsPerSm / blockSize);
  resident = std::min(resident, kLimits.registersPerSm / perWarp / warps);
  if (dynamicShared > size_t(kLimits.maxSharedMemoryPerBlockOptin))
    resident = 0;
  else
    resident = std::min<long>(resident, kLimits.sharedMemoryPerSm /
                                            (long(dynamicShared) + kLimits.reservedSharedPerCta));
  *blocks = resident;
  return kSuccess;
}

/// cuTensorMapEncodeTiled: the map is the emulator's encoding of the same
/// description (emu::TensorMap); the data type gives the element size.
/// Interleaved layouts, element strides other than 1, L2 promotion hints
/// (ignored) and NaN fill are outside what the emulator models.
EXPORT int cuTensorMapEncodeTiled(void *tensorMap, int dataType, unsigned rank,
                                  void *globalAddress, const unsigned long long *globalDim,
                                  const unsigned long long *globalStrides,
                                  const unsigned *boxDim, const unsigned *elementStrides,
                                  int interleave, int swizzle, int l2Promotion, int oobFill) {
  // CU_TENSOR_MAP_DATA_TYPE_*: UINT8 0, UINT16 1, UINT32 2, INT32 3,
  // UINT64 4, INT64 5, FLOAT16 6, FLOAT32 7, FLOAT64 8, BFLOAT16 9,
  // FLOAT32_FTZ 10, TFLOAT32 11, TFLOAT32_FTZ 12.
  static const unsigned kBytes[] = {1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4};
  if (!tensorMap || !globalDim || !boxDim || dataType < 0 || dataType > 12 || rank < 1 ||
      rank > 5 || (rank > 1 && !globalStrides) || interleave != 0 || oobFill != 0)
    return kInvalidValue;
  emu::TensorMap map;
  map.rank = rank;
  map.elementBytes = kBytes[dataType];
  map.swizzle = static_cast<unsigned>(swizzle);
  map.address = reinterpret_cast<uintptr_t>(globalAddress);
  for (unsigned d = 0; d < rank; ++d) {
    map.dims[d] = globalDim[d];
    map.box[d] = boxDim[d];
    if (elementStrides && elementStrides[d] != 1)
      return kInvalidValue;
    map.strides[d] = d == 0 ? map.elementBytes : globalStrides[d - 1];
  }
  std::string error = emu::encodeTensorMap(tensorMap, map);
  if (!error.empty()) {
    std::fprintf(stderr, "pagedc-emu: cuTensorMapEncodeTiled: %s\n", error.c_str());
    return kInvalidValue;
  }
  return kSuccess;
}

/// A launch: cuLaunchKernel's, and cuLaunchKernelEx's with `programmatic`
/// when it asks for programmatic stream serialization (launches run one
/// after the other here, so the grid needs no wait; the counters line says
/// so, for the performance model).
static int launchFunction(void *function, unsigned gridX, unsigned gridY, unsigned gridZ,
                          unsigned blockX, unsigned blockY, unsigned blockZ,
                          unsigned sharedBytes, void **params, void **extra,
                          bool programmatic) {
  if (!function)
    return kInvalidHandle;
  if (extra)
    return fail(kInvalidValue, "cuLaunchKernel: the emulator takes kernelParams, not extra");
  auto *target = static_cast<Function *>(function);
  if (!params && !target->kernel->parameterSizes.empty())
    return fail(kInvalidValue, "cuLaunchKernel: no kernel parameters");
  emu::LaunchConfig config;
  config.grid[0] = gridX;
  config.grid[1] = gridY;
  config.grid[2] = gridZ;
  config.block[0] = blockX;
  config.block[1] = blockY;
  config.block[2] = blockZ;
  config.dynamicSharedBytes = sharedBytes;
  config.maxDynamicSharedBytes = target->maxDynamicShared;
  // PAGEDC_EMU_SAMPLE_BLOCKS=N: count a sample of each grid (the model).
  // Only the kernels named in PAGEDC_EMU_SAMPLE_KERNELS (comma list) when
  // set: a kernel whose output the next launch reads (a block-mask builder)
  // must run whole.
  if (const char *sample = std::getenv("PAGEDC_EMU_SAMPLE_BLOCKS")) {
    const char *only = std::getenv("PAGEDC_EMU_SAMPLE_KERNELS");
    const std::string list = only ? "," + std::string(only) + "," : "";
    if (!only || list.find("," + target->kernel->name + ",") != std::string::npos)
      config.sampleBlocks = std::strtoull(sample, nullptr, 10);
  }
  emu::LaunchResult result =
      emu::launch(*target->kernel, config, params, emu::Checks::fromEnvironment());

  const std::string name = target->kernel->name;
  appendLine("PAGEDC_EMU_COUNTERS",
             "{\"kernel\": " + jsonString(name) + ", \"grid\": [" + std::to_string(gridX) + ", " +
                 std::to_string(gridY) + ", " + std::to_string(gridZ) + "], \"block\": [" +
                 std::to_string(blockX) + ", " + std::to_string(blockY) + ", " +
                 std::to_string(blockZ) + "], \"dynamic_shared_bytes\": " +
                 std::to_string(sharedBytes) + ", \"programmatic_dependent\": " +
                 (programmatic ? "true" : "false") + ", \"seconds\": " +
                 std::to_string(result.seconds) + ", \"reports\": " +
                 std::to_string(result.reports.size()) + ", \"counters\": " +
                 result.counters.json() + "}");
  if (result.ok)
    return kSuccess;
  const bool quiet = std::getenv("PAGEDC_EMU_QUIET") != nullptr;
  std::string detail;
  if (!result.error.empty())
    detail = "pagedc-emu: " + result.error;
  for (const emu::Report &entry : result.reports) {
    const std::string text = entry.format();
    if (!quiet)
      std::fprintf(stderr, "%s\n", text.c_str());
    appendLine("PAGEDC_EMU_REPORT",
               "{\"checker\": " + jsonString(entry.checker) + ", \"kernel\": " +
                   jsonString(entry.kernel) + ", \"location\": " + jsonString(entry.location) +
                   ", \"message\": " + jsonString(entry.message) +
                   ", \"count\": " + std::to_string(entry.count) + "}");
    if (detail.empty())
      detail = text;
  }
  if (result.reports.size() > 1)
    detail += "\n(" + std::to_string(result.reports.size()) + " reports in all)";
  return fail(result.error.empty() ? kLaunchFailed : kLaunchOutOfResources, detail);
}

EXPORT int cuLaunchKernel(void *function, unsigned gridX, unsigned gridY, unsigned gridZ,
                          unsigned blockX, unsigned blockY, unsigned blockZ, unsigned sharedBytes,
                          void *, void **params, void **extra) {
  return launchFunction(function, gridX, gridY, gridZ, blockX, blockY, blockZ, sharedBytes,
                        params, extra, false);
}

/// cuLaunchKernelEx with CUlaunchConfig's layout (pagedc::cu::LaunchConfig);
/// the one attribute taken is programmatic stream serialization.
EXPORT int cuLaunchKernelEx(const void *launchConfig, void *function, void **params,
                            void **extra) {
  struct Attribute {
    int id;
    char pad[4];
    union {
      char bytes[64];
      int value;
      void *align;
    };
  };
  struct Config {
    unsigned grid[3], block[3], sharedBytes;
    void *stream;
    const Attribute *attrs;
    unsigned numAttrs;
  };
  if (!launchConfig)
    return kInvalidValue;
  const auto *config = static_cast<const Config *>(launchConfig);
  bool programmatic = false;
  for (unsigned i = 0; i < config->numAttrs; ++i) {
    if (!config->attrs)
      return kInvalidValue;
    if (config->attrs[i].id != 6) // CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
      return fail(kInvalidValue, "cuLaunchKernelEx: the emulator takes only the programmatic "
                                 "stream serialization attribute, not " +
                                     std::to_string(config->attrs[i].id));
    programmatic = config->attrs[i].value != 0;
  }
  return launchFunction(function, config->grid[0], config->grid[1], config->grid[2],
                        config->block[0], config->block[1], config->block[2],
                        config->sharedBytes, params, extra, programmatic);
}

EXPORT int cuMemAlloc_v2(unsigned long long *pointer, size_t bytes) {
  if (!pointer)
    return kInvalidValue;
  void *memory = emu::allocate(bytes);
  if (!memory)
    return fail(kOutOfMemory, "cuMemAlloc: out of host memory for " + std::to_string(bytes) +
                                  " bytes");
  *pointer = reinterpret_cast<unsigned long long>(memory);
  return kSuccess;
}

EXPORT int cuMemFree_v2(unsigned long long pointer) {
  if (pointer == 0)
    return kSuccess;
  return emu::release(reinterpret_cast<void *>(pointer))
             ? kSuccess
             : fail(kInvalidValue, "cuMemFree of a pointer that is not an allocation");
}

namespace {
int checkedCopy(void *target, const void *source, size_t bytes, bool targetDevice,
                bool sourceDevice, const char *what) {
  if (bytes == 0)
    return kSuccess;
  if (targetDevice && !emu::isAllocated(target, bytes))
    return fail(kInvalidValue, std::string(what) + ": the target range of " +
                                   std::to_string(bytes) + " bytes is not device memory");
  if (sourceDevice && !emu::isAllocated(source, bytes))
    return fail(kInvalidValue, std::string(what) + ": the source range of " +
                                   std::to_string(bytes) + " bytes is not device memory");
  std::memmove(target, source, bytes);
  if (targetDevice)
    emu::markWritten(target, bytes);
  return kSuccess;
}
} // namespace

EXPORT int cuMemcpyHtoD_v2(unsigned long long target, const void *source, size_t bytes) {
  return checkedCopy(reinterpret_cast<void *>(target), source, bytes, true, false, "cuMemcpyHtoD");
}
EXPORT int cuMemcpyDtoH_v2(void *target, unsigned long long source, size_t bytes) {
  return checkedCopy(target, reinterpret_cast<const void *>(source), bytes, false, true,
                     "cuMemcpyDtoH");
}
EXPORT int cuMemcpyDtoD_v2(unsigned long long target, unsigned long long source, size_t bytes) {
  return checkedCopy(reinterpret_cast<void *>(target), reinterpret_cast<const void *>(source),
                     bytes, true, true, "cuMemcpyDtoD");
}
EXPORT int cuMemcpyHtoDAsync_v2(unsigned long long target, const void *source, size_t bytes,
                                void *) {
  return cuMemcpyHtoD_v2(target, source, bytes);
}
EXPORT int cuMemcpyDtoHAsync_v2(void *target, unsigned long long source, size_t bytes, void *) {
  return cuMemcpyDtoH_v2(target, source, bytes);
}
EXPORT int cuMemcpyDtoDAsync_v2(unsigned long long target, unsigned long long source,
                                size_t bytes, void *) {
  return cuMemcpyDtoD_v2(target, source, bytes);
}
EXPORT int cuMemsetD8_v2(unsigned long long target, unsigned char value, size_t bytes) {
  if (bytes == 0)
    return kSuccess;
  void *pointer = reinterpret_cast<void *>(target);
  if (!emu::isAllocated(pointer, bytes))
    return fail(kInvalidValue, "cuMemsetD8: the range is not device memory");
  std::memset(pointer, value, bytes);
  emu::markWritten(pointer, bytes);
  return kSuccess;
}
EXPORT int cuMemsetD8Async(unsigned long long target, unsigned char value, size_t bytes, void *) {
  return cuMemsetD8_v2(target, value, bytes);
}
EXPORT int cuMemGetInfo_v2(size_t *free, size_t *total) {
  if (!free || !total)
    return kInvalidValue;
  *free = *total = kLimits.memoryBytes;
  return kSuccess;
}

// Launches complete before cuLaunchKernel returns, so streams only need to
// exist and events to carry a host time stamp.
EXPORT int cuStreamCreate(void **stream, unsigned) {
  if (!stream)
    return kInvalidValue;
  *stream = new int(0);
  return kSuccess;
}
EXPORT int cuStreamDestroy_v2(void *stream) {
  delete static_cast<int *>(stream);
  return kSuccess;
}
EXPORT int cuStreamSynchronize(void *) { return kSuccess; }
EXPORT int cuEventCreate(void **event, unsigned) {
  if (!event)
    return kInvalidValue;
  *event = new Event;
  return kSuccess;
}
EXPORT int cuEventDestroy_v2(void *event) {
  delete static_cast<Event *>(event);
  return kSuccess;
}
EXPORT int cuEventRecord(void *event, void *) {
  if (!event)
    return kInvalidHandle;
  static_cast<Event *>(event)->time = std::chrono::steady_clock::now();
  return kSuccess;
}
EXPORT int cuEventSynchronize(void *event) { return event ? kSuccess : kInvalidHandle; }
EXPORT int cuEventElapsedTime(float *milliseconds, void *start, void *stop) {
  if (!milliseconds || !start || !stop)
    return kInvalidValue;
  *milliseconds = std::chrono::duration<float, std::milli>(static_cast<Event *>(stop)->time -
                                                           static_cast<Event *>(start)->time)
                      .count();
  return kSuccess;
}
EXPORT int cuEventElapsedTime_v2(float *milliseconds, void *start, void *stop) {
  return cuEventElapsedTime(milliseconds, start, stop);
}
