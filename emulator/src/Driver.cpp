//===- Driver.cpp - The CUDA driver API over the emulator -----------------===//
//
// libpagedc-emu-cuda.so exports the driver entry points the pagedc runtime
// resolves from libcuda.so.1 (runtime/internal/pagedc/CudaDriver.h), so the
// runtime's own CUDA path (memory, uploads, launch planning, parameter
// packing, launches) runs unchanged on the emulator: one device, "device
// memory" in host memory that the checkers know, modules that are emulator
// images, launches that run to completion before cuLaunchKernel returns.
//
// Stream capture and graphs (cuStreamBeginCapture .. cuGraphLaunch): work
// put on a capturing stream is recorded, not run, and each cuGraphLaunch
// runs the record in order, reading device memory as it is then. A call
// that capture forbids (a synchronous copy, an allocation, a module load,
// a synchronization, a pageable upload) fails with CUDA's error, prints
// what was called and invalidates the capture, so cuStreamEndCapture
// fails too.
//
// Settings: the PAGEDC_EMU_* variables (the table is in Settings.cpp), read
// at each call that uses them, since `pagedc-gpu model` changes the
// sampling and the registers per configuration. cuInit fails, printing
// why, when one does not parse; so does any later call that reads them.
//
//===----------------------------------------------------------------------===//

#include "pagedc-emu/Emulator.h"
#include "pagedc-emu/Settings.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

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
  kIllegalState = 401,
  kNotFound = 500,
  kLaunchOutOfResources = 701,
  kLaunchFailed = 719,
  kStreamCaptureUnsupported = 900,
  kStreamCaptureInvalidated = 901,
  kStreamCaptureImplicit = 906,
  kStreamCaptureWrongThread = 908,
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

/// A stream of cuStreamCreate: its flags (CU_STREAM_NON_BLOCKING = 1).
struct Stream {
  unsigned flags = 0;
};

int fail(int code, std::string detail) {
  std::lock_guard<std::mutex> lock(driverMutex);
  lastDetail = std::move(detail);
  return code;
}

/// One line of a JSON-lines log; text that is not UTF-8 (a kernel name
/// from a damaged image) is replaced, not thrown on.
std::string jsonLine(const nlohmann::ordered_json &object) {
  return object.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

void appendLine(const std::string &path, const std::string &line) {
  if (path.empty())
    return;
  std::lock_guard<std::mutex> lock(driverMutex);
  if (FILE *file = std::fopen(path.c_str(), "a")) {
    std::fputs(line.c_str(), file);
    std::fputc('\n', file);
    std::fclose(file);
  }
}

const emu::DeviceLimits kLimits;

/// The PAGEDC_EMU_* settings as they are now; CUDA_ERROR_INVALID_VALUE with
/// the variable, its value and the valid values when one does not parse.
int readSettings(emu::Settings *settings) {
  std::string error;
  std::optional<emu::Settings> parsed = emu::settingsFromEnvironment(&error);
  if (!parsed)
    return fail(kInvalidValue, "pagedc emulator: " + error);
  *settings = std::move(*parsed);
  return kSuccess;
}

//===----------------------------------------------------------------------===//
// Stream capture
//===----------------------------------------------------------------------===//

enum : int { // CUstreamCaptureMode
  kCaptureGlobal = 0,
  kCaptureThreadLocal = 1,
  kCaptureRelaxed = 2,
};

/// A kernel launch with its own copy of the parameters, so that it can run
/// now or at each launch of a graph that recorded it.
struct KernelLaunch {
  /// Keeps the kernel's image loaded for as long as a graph holds it.
  std::shared_ptr<emu::Module> module;
  const emu::Kernel *kernel = nullptr;
  unsigned grid[3] = {1, 1, 1}, block[3] = {1, 1, 1};
  unsigned sharedBytes = 0, maxDynamicShared = 0;
  bool programmatic = false;
  /// Each parameter's bytes, as cuLaunchKernel read them.
  std::vector<std::string> parameters;
};

/// One operation of a graph, run in capture order.
struct GraphNode {
  enum class Kind { Kernel, Memset, Copy, EventRecord };
  Kind kind = Kind::Kernel;
  KernelLaunch launch;
  /// Memset (target, value, bytes) and device-to-device Copy.
  unsigned long long target = 0, source = 0;
  size_t bytes = 0;
  unsigned char value = 0;
  Event *event = nullptr;
};

/// cuStreamEndCapture's graph; cuGraphInstantiate copies it, so the graph
/// may be destroyed while its instantiations run.
struct Graph {
  std::vector<GraphNode> nodes;
};
struct GraphExec {
  std::vector<GraphNode> nodes;
};

struct Capture {
  int mode = kCaptureGlobal;
  std::thread::id thread;
  /// The forbidden call that invalidated the capture; empty while valid.
  std::string invalidatedBy;
  std::vector<GraphNode> nodes;
};

std::mutex captureMutex;
/// Captures in progress, by stream (never the legacy stream).
std::map<void *, Capture> captures;

std::string streamName(void *stream) {
  char text[32];
  std::snprintf(text, sizeof(text), "%p", stream);
  return text;
}

/// A call that capture forbids fails loudly: the message goes to stderr as
/// well as to cuGetErrorString, since the caller may only check the code.
int captureError(int code, const std::string &message) {
  std::fprintf(stderr, "pagedc-emu: %s\n", message.c_str());
  return fail(code, "pagedc-emu: " + message);
}

const char *const kInvalidates = "; the capture is invalidated and its cuStreamEndCapture fails";

/// What a call does that a capture in progress may forbid.
enum class Hazard {
  /// Waits for device work (synchronous copies and memsets, which run on
  /// the legacy stream, and cuCtxSynchronize): it would wait for work the
  /// capture only recorded. Refused during every capture, which is
  /// stricter than CUDA for a relaxed capture of a non-blocking stream.
  Synchronizes,
  /// "Potentially unsafe" in cuda.h's words (allocation, freeing, module
  /// loading): refused by a global capture on any thread and by a
  /// thread-local one on its own thread; a relaxed capture allows it.
  Unsafe,
};

/// kSuccess unless a capture in progress forbids `call`; then each such
/// capture is invalidated and the call fails with
/// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED.
int checkCaptures(const std::string &call, Hazard hazard) {
  std::string streams;
  {
    std::lock_guard<std::mutex> lock(captureMutex);
    for (auto &[stream, capture] : captures) {
      const bool forbidden =
          hazard == Hazard::Synchronizes || capture.mode == kCaptureGlobal ||
          (capture.mode == kCaptureThreadLocal && capture.thread == std::this_thread::get_id());
      if (!forbidden)
        continue;
      if (capture.invalidatedBy.empty())
        capture.invalidatedBy = call;
      streams += (streams.empty() ? "" : ", ") + streamName(stream);
    }
  }
  if (streams.empty())
    return kSuccess;
  return captureError(kStreamCaptureUnsupported,
                      call + " while stream " + streams + " is capturing: " +
                          (hazard == Hazard::Synchronizes
                               ? "it waits for device work, which the capture only records"
                               : "allocation, freeing and module loading are not allowed "
                                 "during a capture that is not relaxed (do them before "
                                 "cuStreamBeginCapture)") +
                          kInvalidates);
}

/// Work on the legacy stream (null) waits for every blocking stream, so it
/// would join a capture of one implicitly: refused as CUDA refuses it.
/// Called with captureMutex held; unlocks it before failing.
int checkLegacyStream(std::unique_lock<std::mutex> &lock, const std::string &call) {
  std::string streams;
  for (auto &[stream, capture] : captures) {
    if (static_cast<Stream *>(stream)->flags & 1)
      continue;
    if (capture.invalidatedBy.empty())
      capture.invalidatedBy = call;
    streams += (streams.empty() ? "" : ", ") + streamName(stream);
  }
  lock.unlock();
  if (streams.empty())
    return kSuccess;
  return captureError(kStreamCaptureImplicit,
                      call + " on the legacy stream (null) while blocking stream " + streams +
                          " is capturing: the legacy stream would wait for work the capture "
                          "only records" +
                          kInvalidates);
}

/// Work put on `stream`: recorded (`*recorded` set) when the stream is
/// capturing, else left to the caller to run now.
int recordOnStream(void *stream, const std::string &call, GraphNode node, bool *recorded) {
  *recorded = false;
  std::unique_lock<std::mutex> lock(captureMutex);
  if (!stream)
    return checkLegacyStream(lock, call);
  auto found = captures.find(stream);
  if (found == captures.end())
    return kSuccess;
  if (!found->second.invalidatedBy.empty()) {
    const std::string by = found->second.invalidatedBy;
    lock.unlock();
    return fail(kStreamCaptureInvalidated, "pagedc-emu: " + call + " on stream " +
                                               streamName(stream) +
                                               ", whose capture was invalidated by " + by);
  }
  found->second.nodes.push_back(std::move(node));
  *recorded = true;
  return kSuccess;
}

/// Stream work the emulator runs now and never records: refused on a
/// capturing stream (`why` says why), checked as legacy-stream work on null.
int refuseOnCapturingStream(void *stream, const std::string &call, const char *why) {
  std::unique_lock<std::mutex> lock(captureMutex);
  if (!stream)
    return checkLegacyStream(lock, call);
  auto found = captures.find(stream);
  if (found == captures.end())
    return kSuccess;
  if (found->second.invalidatedBy.empty())
    found->second.invalidatedBy = call;
  lock.unlock();
  return captureError(kStreamCaptureUnsupported, call + " on stream " + streamName(stream) +
                                                     " while it is capturing: " + why +
                                                     kInvalidates);
}

} // namespace

#define EXPORT extern "C" __attribute__((visibility("default")))

/// Marks this library as the emulator to the runtime (CudaDriver.cpp).
EXPORT int pagedcEmuDriverVersion() { return 1; }

/// Fails, printing why, on settings that do not parse: a misspelt checker
/// must stop the run, not turn checking off.
EXPORT int cuInit(unsigned flags) {
  if (flags != 0)
    return kInvalidValue;
  emu::Settings settings;
  if (int status = readSettings(&settings)) {
    std::string detail;
    {
      std::lock_guard<std::mutex> lock(driverMutex);
      detail = lastDetail;
    }
    std::fprintf(stderr, "%s\n", detail.c_str());
    return status;
  }
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
  case kIllegalState:
    *name = "CUDA_ERROR_ILLEGAL_STATE";
    break;
  case kStreamCaptureUnsupported:
    *name = "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED";
    break;
  case kStreamCaptureInvalidated:
    *name = "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED";
    break;
  case kStreamCaptureImplicit:
    *name = "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT";
    break;
  case kStreamCaptureWrongThread:
    *name = "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD";
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

EXPORT int cuDeviceGetAttribute(int *value, int attribute, int device) {
  if (!value)
    return kInvalidValue;
  if (device != 0)
    return kInvalidDevice;
  switch (attribute) {
  case 16: { // multiprocessors: PAGEDC_EMU_MULTIPROCESSORS, else the H100's
    // (tests take a few so that plans made per SM, such as the warpgroup
    // prefill's persistent CTAs, show at small sizes)
    emu::Settings settings;
    if (int status = readSettings(&settings))
      return status;
    *value = settings.multiprocessors > 0 ? settings.multiprocessors : kLimits.multiprocessors;
    return kSuccess;
  }
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
EXPORT int cuCtxSynchronize() { return checkCaptures("cuCtxSynchronize", Hazard::Synchronizes); }

EXPORT int cuModuleLoadData(void **module, const void *image) {
  if (!module || !image)
    return kInvalidValue;
  if (int status = checkCaptures("cuModuleLoadData", Hazard::Unsafe))
    return status;
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
  if (int status = checkCaptures("cuModuleUnload", Hazard::Unsafe))
    return status;
  delete static_cast<ModuleHandle *>(module);
  return kSuccess;
}

EXPORT int cuModuleGetFunction(void **function, void *module, const char *name) {
  if (!function || !module || !name)
    return kInvalidValue;
  if (int status = checkCaptures("cuModuleGetFunction", Hazard::Unsafe))
    return status;
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
  // CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: a hint (-1, or a
  // percentage), which the emulator's fixed limits leave without effect.
  if (attribute == 9)
    return value >= -1 && value <= 100 ? kSuccess : kInvalidValue;
  if (attribute != 8) // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    return kInvalidValue;
  if (value < 0 || value > kLimits.maxSharedMemoryPerBlockOptin)
    return kInvalidValue;
  static_cast<Function *>(function)->maxDynamicShared = static_cast<unsigned>(value);
  return kSuccess;
}

/// Resident CTAs per SM by the H100's limits: threads, registers
/// (allocated per warp in units of 256, per thread in units of 8; a
/// kernel's PAGEDC_EMU_REGISTERS figure, else what the launch bounds it
/// exports give a thread, else DeviceLimits::defaultRegisters), shared
/// memory (1 KiB reserved per CTA) and the CTA limit.
EXPORT int cuOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, void *function,
                                                       int blockSize, size_t dynamicShared) {
  if (!blocks || !function)
    return !blocks ? kInvalidValue : kInvalidHandle;
  if (blockSize < 1 || blockSize > kLimits.maxThreadsPerBlock)
    return kInvalidValue;
  // PAGEDC_EMU_REGISTERS: `pagedc-gpu model` gives the ptxas figures of the
  // configuration it models.
  emu::Settings settings;
  if (int status = readSettings(&settings))
    return status;
  // A kernel that exports its launch bounds' CTA count holds what they give
  // a thread (the setmaxnreg kernels); others the default.
  const emu::Kernel &kernel = *static_cast<Function *>(function)->kernel;
  const int registers = settings.registersOf(
      kernel.name, kernel.ctasPerSm > 0
                       ? static_cast<int>(emu::boundedRegisters(blockSize, kernel.ctasPerSm))
                       : kLimits.defaultRegisters);
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

/// Checks a launch (cuLaunchKernel's, and cuLaunchKernelEx's with
/// `programmatic` when it asks for programmatic stream serialization) and
/// copies its parameters, as the driver does when the call returns.
static int prepareLaunch(const char *call, void *function, const unsigned grid[3],
                         const unsigned block[3], unsigned sharedBytes, void **params, void **extra,
                         bool programmatic, KernelLaunch *launch) {
  if (!function)
    return kInvalidHandle;
  if (extra)
    return fail(kInvalidValue, std::string(call) + ": the emulator takes kernelParams, not extra");
  auto *target = static_cast<Function *>(function);
  if (!params && !target->kernel->parameterSizes.empty())
    return fail(kInvalidValue, std::string(call) + ": no kernel parameters");
  launch->module = target->module;
  launch->kernel = target->kernel;
  for (int d = 0; d < 3; ++d) {
    launch->grid[d] = grid[d];
    launch->block[d] = block[d];
  }
  launch->sharedBytes = sharedBytes;
  launch->maxDynamicShared = target->maxDynamicShared;
  launch->programmatic = programmatic;
  const std::vector<unsigned long> &sizes = target->kernel->parameterSizes;
  launch->parameters.clear();
  for (size_t i = 0; i < sizes.size(); ++i)
    launch->parameters.emplace_back(static_cast<const char *>(params[i]), sizes[i]);
  return kSuccess;
}

/// Runs a launch to completion (launches run one after the other here, so
/// a programmatic grid needs no wait; the counters line says so, for the
/// performance model).
static int runLaunch(const KernelLaunch &launch) {
  const unsigned gridX = launch.grid[0], gridY = launch.grid[1], gridZ = launch.grid[2];
  const unsigned blockX = launch.block[0], blockY = launch.block[1], blockZ = launch.block[2];
  const unsigned sharedBytes = launch.sharedBytes;
  const bool programmatic = launch.programmatic;
  emu::LaunchConfig config;
  for (int d = 0; d < 3; ++d) {
    config.grid[d] = launch.grid[d];
    config.block[d] = launch.block[d];
  }
  config.dynamicSharedBytes = sharedBytes;
  config.maxDynamicSharedBytes = launch.maxDynamicShared;
  std::vector<void *> params;
  for (const std::string &bytes : launch.parameters)
    params.push_back(const_cast<char *>(bytes.data()));
  emu::Settings settings;
  if (int status = readSettings(&settings))
    return status;
  // A sample of each grid, to count (the model); only of the kernels
  // PAGEDC_EMU_SAMPLE_KERNELS names when set: a kernel whose output the next
  // launch reads (a block-mask builder) must run whole.
  config.sampleBlocks = settings.sampleBlocksOf(launch.kernel->name);
  // The ptxas figure PAGEDC_EMU_REGISTERS gives a kernel is its launch
  // count (setmaxnreg's start); unnamed, the launch derives it.
  config.launchRegisters = static_cast<unsigned>(settings.registersOf(launch.kernel->name, 0));
  config.ctasPerSm = launch.kernel->ctasPerSm;
  emu::LaunchResult result = emu::launch(*launch.kernel, config, params.data(), settings.checks);

  const std::string name = launch.kernel->name;
  nlohmann::ordered_json counters = nlohmann::ordered_json::object();
  result.counters.forEach([&](const char *field, uint64_t value) { counters[field] = value; });
  appendLine(settings.countersPath,
             jsonLine({{"kernel", name},
                       {"grid", {gridX, gridY, gridZ}},
                       {"block", {blockX, blockY, blockZ}},
                       {"dynamic_shared_bytes", sharedBytes},
                       {"programmatic_dependent", programmatic},
                       {"seconds", result.seconds},
                       {"reports", result.reports.size()},
                       {"counters", counters}}));
  if (result.ok)
    return kSuccess;
  const bool quiet = settings.quiet;
  std::string detail;
  if (!result.error.empty())
    detail = "pagedc-emu: " + result.error;
  for (const emu::Report &entry : result.reports) {
    const std::string text = entry.format();
    if (!quiet)
      std::fprintf(stderr, "%s\n", text.c_str());
    appendLine(settings.reportPath, jsonLine({{"checker", entry.checker},
                                              {"kernel", entry.kernel},
                                              {"location", entry.location},
                                              {"message", entry.message},
                                              {"count", entry.count}}));
    if (detail.empty())
      detail = text;
  }
  if (result.reports.size() > 1)
    detail += "\n(" + std::to_string(result.reports.size()) + " reports in all)";
  return fail(result.error.empty() ? kLaunchFailed : kLaunchOutOfResources, detail);
}

/// cuLaunchKernel(Ex) on `stream`: recorded when it is capturing, else run.
static int launchOnStream(const char *call, void *stream, void *function, const unsigned grid[3],
                          const unsigned block[3], unsigned sharedBytes, void **params,
                          void **extra, bool programmatic) {
  GraphNode node;
  if (int status = prepareLaunch(call, function, grid, block, sharedBytes, params, extra,
                                 programmatic, &node.launch))
    return status;
  bool recorded = false;
  if (int status = recordOnStream(stream, call, node, &recorded))
    return status;
  return recorded ? kSuccess : runLaunch(node.launch);
}

EXPORT int cuLaunchKernel(void *function, unsigned gridX, unsigned gridY, unsigned gridZ,
                          unsigned blockX, unsigned blockY, unsigned blockZ, unsigned sharedBytes,
                          void *stream, void **params, void **extra) {
  const unsigned grid[3] = {gridX, gridY, gridZ}, block[3] = {blockX, blockY, blockZ};
  return launchOnStream("cuLaunchKernel", stream, function, grid, block, sharedBytes, params, extra,
                        false);
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
  return launchOnStream("cuLaunchKernelEx", config->stream, function, config->grid, config->block,
                        config->sharedBytes, params, extra, programmatic);
}

EXPORT int cuMemAlloc_v2(unsigned long long *pointer, size_t bytes) {
  if (!pointer)
    return kInvalidValue;
  if (int status = checkCaptures("cuMemAlloc", Hazard::Unsafe))
    return status;
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
  if (int status = checkCaptures("cuMemFree", Hazard::Unsafe))
    return status;
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

int memsetNow(unsigned long long target, unsigned char value, size_t bytes, const char *what) {
  if (bytes == 0)
    return kSuccess;
  void *pointer = reinterpret_cast<void *>(target);
  if (!emu::isAllocated(pointer, bytes))
    return fail(kInvalidValue, std::string(what) + ": the range is not device memory");
  std::memset(pointer, value, bytes);
  emu::markWritten(pointer, bytes);
  return kSuccess;
}

int copyDtoD(unsigned long long target, unsigned long long source, size_t bytes, const char *what) {
  return checkedCopy(reinterpret_cast<void *>(target), reinterpret_cast<const void *>(source),
                     bytes, true, true, what);
}

/// Why a copy between host and device memory is not captured: the
/// emulator's host memory is all pageable (there is no cuMemHostAlloc), and
/// CUDA does not capture pageable copies.
const char *const kPageableCopy =
    "a copy from or to pageable host memory is not captured (upload before the capture, or "
    "copy from a device buffer)";
} // namespace

// The synchronous copies and memsets run on the legacy stream and return
// when done: refused during a capture.
EXPORT int cuMemcpyHtoD_v2(unsigned long long target, const void *source, size_t bytes) {
  if (int status = checkCaptures("cuMemcpyHtoD", Hazard::Synchronizes))
    return status;
  return checkedCopy(reinterpret_cast<void *>(target), source, bytes, true, false, "cuMemcpyHtoD");
}
EXPORT int cuMemcpyDtoH_v2(void *target, unsigned long long source, size_t bytes) {
  if (int status = checkCaptures("cuMemcpyDtoH", Hazard::Synchronizes))
    return status;
  return checkedCopy(target, reinterpret_cast<const void *>(source), bytes, false, true,
                     "cuMemcpyDtoH");
}
EXPORT int cuMemcpyDtoD_v2(unsigned long long target, unsigned long long source, size_t bytes) {
  if (int status = checkCaptures("cuMemcpyDtoD", Hazard::Synchronizes))
    return status;
  return copyDtoD(target, source, bytes, "cuMemcpyDtoD");
}
EXPORT int cuMemsetD8_v2(unsigned long long target, unsigned char value, size_t bytes) {
  if (int status = checkCaptures("cuMemsetD8", Hazard::Synchronizes))
    return status;
  return memsetNow(target, value, bytes, "cuMemsetD8");
}
EXPORT int cuMemcpyHtoDAsync_v2(unsigned long long target, const void *source, size_t bytes,
                                void *stream) {
  if (int status = refuseOnCapturingStream(stream, "cuMemcpyHtoDAsync", kPageableCopy))
    return status;
  return checkedCopy(reinterpret_cast<void *>(target), source, bytes, true, false,
                     "cuMemcpyHtoDAsync");
}
EXPORT int cuMemcpyDtoHAsync_v2(void *target, unsigned long long source, size_t bytes,
                                void *stream) {
  if (int status = refuseOnCapturingStream(stream, "cuMemcpyDtoHAsync", kPageableCopy))
    return status;
  return checkedCopy(target, reinterpret_cast<const void *>(source), bytes, false, true,
                     "cuMemcpyDtoHAsync");
}
// Device-to-device copies and memsets on a stream are captured: the graph
// repeats them, checking the ranges again at each launch.
EXPORT int cuMemcpyDtoDAsync_v2(unsigned long long target, unsigned long long source, size_t bytes,
                                void *stream) {
  GraphNode node;
  node.kind = GraphNode::Kind::Copy;
  node.target = target;
  node.source = source;
  node.bytes = bytes;
  if (bytes && (!emu::isAllocated(reinterpret_cast<void *>(target), bytes) ||
                !emu::isAllocated(reinterpret_cast<void *>(source), bytes)))
    return copyDtoD(target, source, bytes, "cuMemcpyDtoDAsync");
  bool recorded = false;
  if (int status = recordOnStream(stream, "cuMemcpyDtoDAsync", node, &recorded))
    return status;
  return recorded ? kSuccess : copyDtoD(target, source, bytes, "cuMemcpyDtoDAsync");
}
EXPORT int cuMemsetD8Async(unsigned long long target, unsigned char value, size_t bytes,
                           void *stream) {
  GraphNode node;
  node.kind = GraphNode::Kind::Memset;
  node.target = target;
  node.value = value;
  node.bytes = bytes;
  if (bytes && !emu::isAllocated(reinterpret_cast<void *>(target), bytes))
    return memsetNow(target, value, bytes, "cuMemsetD8Async");
  bool recorded = false;
  if (int status = recordOnStream(stream, "cuMemsetD8Async", node, &recorded))
    return status;
  return recorded ? kSuccess : memsetNow(target, value, bytes, "cuMemsetD8Async");
}
EXPORT int cuMemGetInfo_v2(size_t *free, size_t *total) {
  if (!free || !total)
    return kInvalidValue;
  *free = *total = kLimits.memoryBytes;
  return kSuccess;
}

// Launches complete before cuLaunchKernel returns, so streams only need to
// exist (and say whether they are blocking, for capture) and events to carry
// a host time stamp.
EXPORT int cuStreamCreate(void **stream, unsigned flags) {
  if (!stream)
    return kInvalidValue;
  *stream = new Stream{flags};
  return kSuccess;
}
EXPORT int cuStreamDestroy_v2(void *stream) {
  {
    std::lock_guard<std::mutex> lock(captureMutex);
    captures.erase(stream);
  }
  delete static_cast<Stream *>(stream);
  return kSuccess;
}
EXPORT int cuStreamSynchronize(void *stream) {
  if (!stream)
    return checkCaptures("cuStreamSynchronize(legacy stream)", Hazard::Synchronizes);
  return refuseOnCapturingStream(stream, "cuStreamSynchronize",
                                 "its work is only recorded until the graph is launched");
}
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
/// On a capturing stream the record is captured: each graph launch stamps
/// the event when it reaches it.
EXPORT int cuEventRecord(void *event, void *stream) {
  if (!event)
    return kInvalidHandle;
  GraphNode node;
  node.kind = GraphNode::Kind::EventRecord;
  node.event = static_cast<Event *>(event);
  bool recorded = false;
  if (int status = recordOnStream(stream, "cuEventRecord", node, &recorded))
    return status;
  if (!recorded)
    node.event->time = std::chrono::steady_clock::now();
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

// Stream capture and graphs: the entry points cuda.h maps cuStreamBeginCapture
// (cuStreamBeginCapture_v2) and cuGraphInstantiate (cuGraphInstantiateWithFlags)
// to. One capture per stream; a graph is its operations in capture order.

EXPORT int cuStreamBeginCapture_v2(void *stream, int mode) {
  if (mode != kCaptureGlobal && mode != kCaptureThreadLocal && mode != kCaptureRelaxed)
    return fail(kInvalidValue, "cuStreamBeginCapture: mode " + std::to_string(mode) +
                                   " is not a CUstreamCaptureMode (0 global, 1 thread-local, "
                                   "2 relaxed)");
  // CU_STREAM_LEGACY (1) and CU_STREAM_PER_THREAD (2) are handles too.
  if (reinterpret_cast<uintptr_t>(stream) <= 2)
    return captureError(kStreamCaptureUnsupported,
                        "cuStreamBeginCapture on the legacy stream (null): capture a stream of "
                        "cuStreamCreate");
  std::unique_lock<std::mutex> lock(captureMutex);
  if (captures.count(stream)) {
    lock.unlock();
    return fail(kIllegalState, "pagedc-emu: cuStreamBeginCapture: stream " + streamName(stream) +
                                   " is already capturing");
  }
  Capture &capture = captures[stream];
  capture.mode = mode;
  capture.thread = std::this_thread::get_id();
  return kSuccess;
}

EXPORT int cuStreamEndCapture(void *stream, void **graph) {
  if (!graph)
    return kInvalidValue;
  *graph = nullptr;
  std::unique_lock<std::mutex> lock(captureMutex);
  auto found = captures.find(stream);
  if (found == captures.end()) {
    lock.unlock();
    return fail(kIllegalState, "pagedc-emu: cuStreamEndCapture: stream " + streamName(stream) +
                                   " is not capturing");
  }
  if (found->second.mode != kCaptureRelaxed && found->second.thread != std::this_thread::get_id()) {
    lock.unlock();
    return fail(kStreamCaptureWrongThread,
                "pagedc-emu: cuStreamEndCapture: the capture of stream " + streamName(stream) +
                    " was begun on another thread and is not relaxed");
  }
  Capture capture = std::move(found->second);
  captures.erase(found);
  lock.unlock();
  if (!capture.invalidatedBy.empty())
    return captureError(kStreamCaptureInvalidated, "cuStreamEndCapture: the capture of stream " +
                                                       streamName(stream) + " was invalidated by " +
                                                       capture.invalidatedBy + "; no graph");
  *graph = new Graph{std::move(capture.nodes)};
  return kSuccess;
}

/// CUstreamCaptureStatus: 0 none, 1 active, 2 invalidated.
EXPORT int cuStreamIsCapturing(void *stream, int *status) {
  if (!status)
    return kInvalidValue;
  std::lock_guard<std::mutex> lock(captureMutex);
  auto found = captures.find(stream);
  *status = found == captures.end() ? 0 : found->second.invalidatedBy.empty() ? 1 : 2;
  return kSuccess;
}

EXPORT int cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags) {
  if (!exec || !graph)
    return kInvalidValue;
  if (flags != 0)
    return fail(kInvalidValue, "cuGraphInstantiateWithFlags: the emulator takes flags 0, not " +
                                   std::to_string(flags));
  *exec = new GraphExec{static_cast<Graph *>(graph)->nodes};
  return kSuccess;
}

/// Runs the graph's operations in order, each reading device memory as it
/// is now; stops at the first that fails, with its error.
EXPORT int cuGraphLaunch(void *exec, void *stream) {
  if (!exec)
    return kInvalidValue;
  if (int status = refuseOnCapturingStream(stream, "cuGraphLaunch",
                                           "the emulator does not record a graph inside another"))
    return status;
  for (const GraphNode &node : static_cast<GraphExec *>(exec)->nodes) {
    int status = kSuccess;
    switch (node.kind) {
    case GraphNode::Kind::Kernel:
      status = runLaunch(node.launch);
      break;
    case GraphNode::Kind::Memset:
      status = memsetNow(node.target, node.value, node.bytes, "cuMemsetD8Async (graph)");
      break;
    case GraphNode::Kind::Copy:
      status = copyDtoD(node.target, node.source, node.bytes, "cuMemcpyDtoDAsync (graph)");
      break;
    case GraphNode::Kind::EventRecord:
      node.event->time = std::chrono::steady_clock::now();
      break;
    }
    if (status != kSuccess)
      return status;
  }
  return kSuccess;
}

EXPORT int cuGraphExecDestroy(void *exec) {
  delete static_cast<GraphExec *>(exec);
  return kSuccess;
}

EXPORT int cuGraphDestroy(void *graph) {
  delete static_cast<Graph *>(graph);
  return kSuccess;
}
