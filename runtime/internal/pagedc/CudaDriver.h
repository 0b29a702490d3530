//===- CudaDriver.h - The CUDA driver API, loaded at run time --*- C++ -*-===//
//
// libcuda.so.1 is opened with dlopen on first use, so pagedc binaries start
// on machines without an NVIDIA driver; there, CudaDriver::available()
// returns false with the reason ("no NVIDIA driver: libcuda.so.1 not found",
// or the cuInit error) and get() throws pagedc::Error with it.
//
// PAGEDC_CUDA_DRIVER=emu loads the SIMT emulator's driver instead
// (libpagedc-emu-cuda.so, emulator/): the same entry points, one device whose
// kernels are built for the architecture "emu" and run on the CPU with every
// checker on. PAGEDC_CUDA_DRIVER=/path/to/lib loads that library. Either is
// read once, at the first use of the driver.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_CUDADRIVER_H
#define PAGEDC_CUDADRIVER_H

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace pagedc {

/// Driver API types, declared here so the build needs no cuda.h.
namespace cu {
using Result = int; // CUresult; 0 = CUDA_SUCCESS
using Device = int;
using Context = struct Context_st *;
using Module = struct Module_st *;
using Function = struct Function_st *;
using Stream = struct Stream_st *;
using Event = struct Event_st *;
using Graph = struct Graph_st *;
using GraphExec = struct GraphExec_st *;
using DevicePointer = unsigned long long;
constexpr int kAttributeMultiprocessorCount = 16;
constexpr int kAttributeComputeCapabilityMajor = 75;
constexpr int kAttributeComputeCapabilityMinor = 76;
constexpr int kAttributeMaxSharedMemoryPerBlockOptin = 97;
constexpr int kFunctionAttributeMaxDynamicSharedSizeBytes = 8;
constexpr int kFunctionAttributePreferredSharedMemoryCarveout = 9;
/// CU_SHAREDMEM_CARVEOUT_MAX_SHARED: as much of L1 as shared memory as the SM has.
constexpr int kSharedCarveoutMaxShared = 100;
/// CUstreamCaptureMode: a global capture refuses "potentially unsafe" calls
/// (allocation, module loading, ...) from any thread, a thread-local one
/// from its own thread; a relaxed one allows them.
constexpr int kStreamCaptureModeGlobal = 0;
constexpr int kStreamCaptureModeThreadLocal = 1;
constexpr int kStreamCaptureModeRelaxed = 2;
/// CUstreamCaptureStatus.
constexpr int kStreamCaptureStatusNone = 0;
constexpr int kStreamCaptureStatusActive = 1;
constexpr int kStreamCaptureStatusInvalidated = 2;
/// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: the grid may be
/// scheduled while the previous grid of the stream drains (programmatic
/// dependent launch, sm_90+); it waits for that grid in-kernel
/// (griddepcontrol.wait).
constexpr int kLaunchAttributeProgrammaticStreamSerialization = 6;
/// CUlaunchAttribute: an id, padding to 8 bytes, a 64-byte value union.
struct LaunchAttribute {
  int id = 0;
  char pad[4] = {};
  union {
    char bytes[64];
    int value;
    void *align; // the union holds pointers in cuda.h
  };
  LaunchAttribute() : bytes{} {}
};
/// CUlaunchConfig (cuLaunchKernelEx).
struct LaunchConfig {
  unsigned gridDimX = 1, gridDimY = 1, gridDimZ = 1;
  unsigned blockDimX = 1, blockDimY = 1, blockDimZ = 1;
  unsigned sharedMemBytes = 0;
  Stream stream = nullptr;
  LaunchAttribute *attrs = nullptr;
  unsigned numAttrs = 0;
};
} // namespace cu

/// One device as the driver describes it.
struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  int major = 0, minor = 0;
  /// The SIMT emulator's device: kernels are built for "emu".
  bool emulated = false;
  size_t totalMemoryBytes = 0;
  int multiprocessors = 0;
  int maxSharedMemoryPerBlockOptin = 0;
  /// "sm_90", or "emu" for the emulator's device.
  std::string arch() const;
};

class CudaDriver {
public:
  /// The driver's entry points (the _v2 variants where cuda.h maps to them).
  struct Api {
    cu::Result (*init)(unsigned);
    cu::Result (*driverGetVersion)(int *);
    cu::Result (*getErrorName)(cu::Result, const char **);
    cu::Result (*getErrorString)(cu::Result, const char **);
    cu::Result (*deviceGetCount)(int *);
    cu::Result (*deviceGet)(cu::Device *, int);
    cu::Result (*deviceGetName)(char *, int, cu::Device);
    cu::Result (*deviceGetAttribute)(int *, int, cu::Device);
    cu::Result (*deviceTotalMem)(size_t *, cu::Device);
    cu::Result (*primaryCtxRetain)(cu::Context *, cu::Device);
    cu::Result (*primaryCtxRelease)(cu::Device);
    cu::Result (*ctxSetCurrent)(cu::Context);
    cu::Result (*ctxSynchronize)();
    cu::Result (*moduleLoadData)(cu::Module *, const void *);
    cu::Result (*moduleUnload)(cu::Module);
    cu::Result (*moduleGetFunction)(cu::Function *, cu::Module, const char *);
    cu::Result (*funcSetAttribute)(cu::Function, int, int);
    /// cuOccupancyMaxActiveBlocksPerMultiprocessor: resident CTAs per SM of
    /// a function at a block size and dynamic shared memory.
    cu::Result (*occupancyMaxActiveBlocksPerMultiprocessor)(int *, cu::Function, int, size_t);
    cu::Result (*launchKernel)(cu::Function, unsigned, unsigned, unsigned,
                               unsigned, unsigned, unsigned, unsigned,
                               cu::Stream, void **, void **);
    cu::Result (*memAlloc)(cu::DevicePointer *, size_t);
    cu::Result (*memFree)(cu::DevicePointer);
    cu::Result (*memcpyHtoD)(cu::DevicePointer, const void *, size_t);
    cu::Result (*memcpyDtoH)(void *, cu::DevicePointer, size_t);
    cu::Result (*memsetD8)(cu::DevicePointer, unsigned char, size_t);
    cu::Result (*streamCreate)(cu::Stream *, unsigned);
    cu::Result (*streamDestroy)(cu::Stream);
    cu::Result (*streamSynchronize)(cu::Stream);
    // Used by the CUDA attention backend and pagedc-gpu (stream-ordered
    // copies, device-to-device copies, events for timing).
    cu::Result (*memcpyDtoD)(cu::DevicePointer, cu::DevicePointer, size_t);
    cu::Result (*memcpyHtoDAsync)(cu::DevicePointer, const void *, size_t, cu::Stream);
    cu::Result (*memcpyDtoHAsync)(void *, cu::DevicePointer, size_t, cu::Stream);
    cu::Result (*memcpyDtoDAsync)(cu::DevicePointer, cu::DevicePointer, size_t, cu::Stream);
    cu::Result (*memsetD8Async)(cu::DevicePointer, unsigned char, size_t, cu::Stream);
    cu::Result (*memGetInfo)(size_t *, size_t *);
    cu::Result (*eventCreate)(cu::Event *, unsigned);
    cu::Result (*eventDestroy)(cu::Event);
    cu::Result (*eventRecord)(cu::Event, cu::Stream);
    cu::Result (*eventSynchronize)(cu::Event);
    cu::Result (*eventElapsedTime)(float *, cu::Event, cu::Event);
    /// cuLaunchKernelEx; null when the driver has none (before CUDA 12).
    cu::Result (*launchKernelEx)(const cu::LaunchConfig *, cu::Function, void **, void **);
    /// cuTensorMapEncodeTiled (CUDA 12); null when the driver has none.
    cu::Result (*tensorMapEncodeTiled)(void *tensorMap, int dataType, unsigned rank,
                                       void *globalAddress, const uint64_t *globalDim,
                                       const uint64_t *globalStrides, const unsigned *boxDim,
                                       const unsigned *elementStrides, int interleave,
                                       int swizzle, int l2Promotion, int oobFill);
    /// Stream capture and graphs (CUDA 10+; cuStreamBeginCapture_v2 and
    /// cuGraphInstantiateWithFlags are the names cuda.h maps to). All null
    /// when the driver lacks one of them; runtime/src/cuda/CudaGraph.h wraps
    /// them.
    cu::Result (*streamBeginCapture)(cu::Stream, int mode);
    cu::Result (*streamEndCapture)(cu::Stream, cu::Graph *);
    cu::Result (*streamIsCapturing)(cu::Stream, int *status);
    cu::Result (*graphInstantiate)(cu::GraphExec *, cu::Graph, unsigned long long flags);
    cu::Result (*graphLaunch)(cu::GraphExec, cu::Stream);
    cu::Result (*graphExecDestroy)(cu::GraphExec);
    cu::Result (*graphDestroy)(cu::Graph);
  };

  /// The process-wide driver (cuInit done); throws pagedc::Error with the
  /// reason when there is none.
  static const CudaDriver &get();
  /// Whether a usable driver is present; sets `reason` when not.
  static bool available(std::string *reason = nullptr);

  const Api &api() const { return *api_; }
  int version() const { return version_; }
  const std::string &libraryPath() const { return path_; }
  /// Whether this is the SIMT emulator's driver.
  bool emulated() const { return emulated_; }
  int deviceCount() const;
  CudaDeviceInfo deviceInfo(int index) const;
  /// Throws pagedc::Error "<what> failed: CUDA_ERROR_... (description)"
  /// unless `result` is success.
  void check(cu::Result result, std::string_view what) const;

private:
  CudaDriver() = default;
  const Api *api_ = nullptr;
  int version_ = 0;
  std::string path_;
  bool emulated_ = false;
};

/// Where the emulator's driver library is looked for, in order:
/// $PAGEDC_EMU_DRIVER (when set, the only place), <exe>/../lib, the build
/// tree, the install prefix.
std::vector<std::string> emulatorDriverCandidates();

/// A loaded module (cubin or PTX image) in the current context.
class CudaModule {
public:
  CudaModule(const CudaDriver &driver, const std::string &image);
  ~CudaModule();
  CudaModule(const CudaModule &) = delete;
  CudaModule &operator=(const CudaModule &) = delete;
  /// The kernel named `name`; raises its dynamic shared-memory limit to
  /// `dynamicSharedBytes` when that is over the 48 KiB default, and with
  /// `maxSharedCarveout` asks for the SM's whole L1 as shared memory (a
  /// kernel built for several large CTAs an SM: the carveout is a hint, and
  /// without it the driver need only make room for one).
  cu::Function function(const std::string &name, int dynamicSharedBytes = 0,
                        bool maxSharedCarveout = false) const;

private:
  const CudaDriver &driver_;
  cu::Module module_ = nullptr;
};

} // namespace pagedc

#endif // PAGEDC_CUDADRIVER_H
